//! The opt-in stage profile of a [`DataParallel`](crate::DataParallel) step.
//!
//! When profiling is on, every step records how long each of its stages took, every device
//! involved synchronised at the end of each stage. When it is off, a step pays one atomic
//! load.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::Device;

/// Where one [`DataParallel`](crate::DataParallel) step spent its time.
///
/// Stage times are wall-clock times on the calling thread (each replica's on its worker
/// thread), every device involved synchronised at the end of the stage: they are device
/// times, and a profiled step runs slower than an unprofiled one, its stages no longer
/// overlapping. The backward is not in it: under a forward it is Burn's own, on the caller's
/// `backward()`; under burn-train's `TrainStep` it is in each replica's `forward` time.
///
/// # Example
///
/// ```
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::{Device, Tensor};
/// use burn_dataparallel::DataParallel;
///
/// let device = Device::flex().autodiff();
/// let model: Linear = LinearConfig::new(8, 2).init(&device);
/// let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
/// dp.set_profiling(true);
///
/// let output = dp.forward_with(Tensor::<2>::ones([6, 8], &device), |m, x| m.forward(x));
/// let profile = dp.profile().expect("profiling is on");
/// assert_eq!(profile.shard_sizes, [3, 3]);
/// assert_eq!(profile.forward.len(), 2);
/// println!("{profile}");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepProfile {
    /// Rows per shard.
    pub shard_sizes: Vec<usize>,
    /// Splitting the input and moving the shards.
    pub scatter: Duration,
    /// Making the replicas (moving the parameters to other devices).
    pub replicate: Duration,
    /// Each replica's work on its shard (its forward; under burn-train's `TrainStep` its whole
    /// step, backward included), in shard order.
    pub forward: Vec<Duration>,
    /// Folding the replicas' running states (batch-norm statistics) and bringing them home,
    /// after replicas on other devices.
    pub running_states: Duration,
    /// Moving the outputs to the output device and combining them.
    pub gather: Duration,
    /// Summing the replicas' gradients (burn-train's `TrainStep`).
    pub combine: Duration,
}

impl StepProfile {
    /// The slowest replica's work.
    pub fn slowest_forward(&self) -> Duration {
        self.forward.iter().copied().max().unwrap_or_default()
    }

    /// Every stage's time added up, each replica's included: the step's time where the
    /// replicas run one after the other, more than it where they run at once.
    pub fn total(&self) -> Duration {
        let forward: Duration = self.forward.iter().sum();
        self.scatter + self.replicate + forward + self.running_states + self.gather + self.combine
    }
}

impl std::fmt::Display for StepProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let forward: Vec<String> = self
            .forward
            .iter()
            .map(|d| format!("{:.3}", ms(*d)))
            .collect();
        write!(
            f,
            "shards {:?}: scatter {:.3} ms, replicate {:.3} ms, forward [{}] ms, running states \
             {:.3} ms, gather {:.3} ms, combine {:.3} ms",
            self.shard_sizes,
            ms(self.scatter),
            ms(self.replicate),
            forward.join(", "),
            ms(self.running_states),
            ms(self.gather),
            ms(self.combine),
        )
    }
}

/// Ends the stage `field` names of `recording`, where there is one.
pub(crate) fn stage(
    recording: Option<&mut Recording>,
    field: fn(&mut StepProfile) -> &mut Duration,
) {
    if let Some(recording) = recording {
        recording.stage(field);
    }
}

/// Whether to profile, and the last step's profile; shared by every copy of a wrapper.
#[derive(Debug, Default)]
pub(crate) struct Profiler {
    enabled: AtomicBool,
    last: Mutex<Option<StepProfile>>,
}

impl Profiler {
    pub(crate) fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The last profiled step's profile.
    pub(crate) fn last(&self) -> Option<StepProfile> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts a step's profile over `devices` (its shards' and the output device), or `None`
    /// when profiling is off.
    pub(crate) fn start(&self, shard_sizes: &[usize], devices: &[Device]) -> Option<Recording> {
        self.is_enabled().then(|| Recording {
            profile: StepProfile {
                shard_sizes: shard_sizes.to_vec(),
                ..StepProfile::default()
            },
            devices: devices.to_vec(),
            since: Instant::now(),
        })
    }

    /// Keeps `recording`, where there is one, as the last step's profile.
    pub(crate) fn keep(&self, recording: Option<Recording>) {
        if let Some(recording) = recording {
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(recording.profile);
        }
    }
}

/// One step's profile while it runs.
#[derive(Debug)]
pub(crate) struct Recording {
    profile: StepProfile,
    devices: Vec<Device>,
    since: Instant,
}

impl Recording {
    /// The time since the last stage ended, every device synchronised; the next stage starts
    /// now.
    fn lap(&mut self) -> Duration {
        for device in &self.devices {
            // A failed device reports it at its next use; a time is all this needs.
            let _ = device.sync();
        }
        let lap = self.since.elapsed();
        self.since = Instant::now();
        lap
    }

    /// Ends the stage `field` of the profile names.
    pub(crate) fn stage(&mut self, field: fn(&mut StepProfile) -> &mut Duration) {
        let lap = self.lap();
        *field(&mut self.profile) += lap;
    }

    /// Ends the replicas' stage, whose times are their own (measured on their lanes).
    pub(crate) fn end_replicas(&mut self) {
        self.lap();
    }

    /// Ends a step that ran the module itself on its one shard: that time is its one
    /// replica's.
    pub(crate) fn end_alone(&mut self) {
        let lap = self.lap();
        self.profile.forward = vec![lap];
    }

    /// Sets the replicas' own times, the clock left running.
    pub(crate) fn set_forward(&mut self, times: Vec<Duration>) {
        self.profile.forward = times;
    }
}
