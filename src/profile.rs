//! The opt-in stage profile of a [`DataParallel`](crate::DataParallel) step.
//!
//! When profiling is on, every forward records how long each stage took and how many bytes it
//! moved between devices, and the backward of the coalesced parameter transfers adds the time
//! and bytes of bringing gradients back. When it is off, a forward pays one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;

use crate::backend::comm::{self, ReduceBucket, TransferLog, synchronize};

/// Where one [`DataParallel`](crate::DataParallel) step spent its time, and the bytes it moved
/// between distinct devices.
///
/// Stage times are wall-clock times on the calling thread (the replicas' forwards on their
/// worker threads), measured with every device involved synchronised at the end of the stage:
/// they are device times, and a profiled step runs slower than an unprofiled one because the
/// stages no longer overlap. Replicas that share a device move nothing.
///
/// # Example
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Tensor;
/// use burn_dataparallel::DataParallel;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let model: Linear<B> = LinearConfig::new(8, 2).init(&device);
/// let dp = DataParallel::new(model, vec![device; 2]).unwrap();
/// dp.set_profiling(true);
///
/// let output = dp.forward_with(Tensor::<B, 2>::ones([6, 8], &device), |m, x| m.forward(x));
/// output.sum().backward();
/// let profile = dp.profile().expect("profiling is on");
/// assert_eq!(profile.forward.len(), 2);
/// assert_eq!(profile.bytes_broadcast, 0); // both replicas share the parameters' device
/// println!("{profile}");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepProfile {
    /// Splitting the input and moving the shards to their devices.
    pub scatter: Duration,
    /// Making the replicas, including the parameter broadcast to other devices (zero for a
    /// forward with one shard on the module's device, which runs the module itself).
    pub replicate: Duration,
    /// Each replica's forward, by shard.
    pub forward: Vec<Duration>,
    /// After the forwards: averaging the replicas' updates of the module's running states
    /// (batch-norm statistics, which Burn's `RunningState` keeps one per thread) and folding
    /// in those of replicas with states of their own
    /// ([`DataParallel::with_running_states_per_device`](crate::DataParallel::with_running_states_per_device)).
    /// For a module without running states, only the pass over the module that looks for
    /// them.
    pub running_states: Duration,
    /// Moving the outputs to the output device and concatenating them.
    pub gather: Duration,
    /// Under burn-train's `Learner`: weighting the replicas' gradients of their own training
    /// steps and summing them on the parameters' devices (zero for the hand-written loop,
    /// whose gradients are summed in the backward).
    pub combine: Duration,
    /// Each replica's backward, by shard, when the replicas' backward runs in parallel
    /// ([`DataParallelConfig::parallel_backward`](crate::DataParallelConfig::parallel_backward)):
    /// from the start of the replicas' backward to the replica's device having run it.
    /// Empty when the backward ran on the calling thread.
    pub backward: Vec<Duration>,
    /// In the backward: collecting the replicas' parameter gradients and moving them back to
    /// the parameters' device (zero when every replica shares that device).
    pub backward_transfers: Duration,
    /// In the parallel backward, on the calling thread: from starting the replicas'
    /// backwards to the last one done (zero when the backward ran on the calling thread),
    /// the [`reduce_buckets`](Self::reduce_buckets) reduced meanwhile included.
    pub backward_wait: Duration,
    /// In the parallel backward, on the calling thread, after the last replica's backward:
    /// combining the replicas' gradients that no bucket reduced (input rows, and every
    /// gradient when the reduce does not overlap the backward) on the targets' devices and
    /// handing every gradient to Burn's gradients, up to those devices having run it. With
    /// `backward_wait`, what the wrapper adds to the caller's backward beyond the replicas'
    /// own.
    pub backward_reduce: Duration,
    /// The buckets of gradients reduced while the replicas' backward ran
    /// ([`DataParallelConfig::overlap_reduce`](crate::DataParallelConfig::overlap_reduce)),
    /// in the order they were reduced; compare their times with [`backward`](Self::backward).
    pub reduce_buckets: Vec<ReduceBucket>,
    /// Input bytes moved to other devices by the scatter.
    pub bytes_scattered: u64,
    /// Parameter bytes moved to replicas on other devices.
    pub bytes_broadcast: u64,
    /// Output bytes moved to the output device by the gather.
    pub bytes_gathered: u64,
    /// Running-state bytes moved to the module's device (own sets folded back).
    pub bytes_running_states: u64,
    /// Gradient bytes moved back to the parameters' device in the backward.
    pub bytes_reduced: u64,
    /// Number of parameter transfers (coalesced buckets) to other devices.
    pub broadcast_transfers: usize,
    /// Number of gradient transfers (coalesced buckets) back in the backward.
    pub reduce_transfers: usize,
    /// Whether the step ran on the exact path: the replicas' forwards one at a time in the
    /// caller's graph and their backwards on the calling thread, whatever the settings. A
    /// forward through [`forward_with_captures`](crate::DataParallel::forward_with_captures)
    /// takes it, and so does an input the scatter cannot see into (a [`Shared`](crate::Shared)
    /// value that may own a tensor, a hand-written [`Scatter`](crate::Scatter) that does not
    /// answer [`scatters_every_tensor`](crate::Scatter::scatters_every_tensor)): correct, but
    /// slower where the backward's work is large.
    pub exact_path: bool,
}

impl StepProfile {
    /// The slowest replica's forward.
    pub fn slowest_forward(&self) -> Duration {
        self.forward.iter().copied().max().unwrap_or_default()
    }

    /// The slowest replica's backward (zero when the backward ran on the calling thread).
    pub fn slowest_backward(&self) -> Duration {
        self.backward.iter().copied().max().unwrap_or_default()
    }

    /// Scatter, replicate, the slowest forward, the running states and gather: the
    /// forward's critical path.
    pub fn forward_total(&self) -> Duration {
        self.scatter + self.replicate + self.slowest_forward() + self.running_states + self.gather
    }
}

/// Bytes that every [`DataParallel`](crate::DataParallel) in this process has moved between
/// distinct devices so far: parameters broadcast, shards scattered, outputs gathered, running
/// states brought home and gradients reduced, forward and backward, whether profiling is on
/// or not. Replicas sharing a device move nothing, so the total stays where it was; on
/// several devices it grows with every step. Counted with one relaxed atomic addition per
/// transfer (a coalesced buffer is one transfer), through this crate's own moves
/// ([`TransferOps::float_move`](crate::TransferOps::float_move) and its integer and boolean
/// counterparts): a backend that overrides `float_move` without calling the default is not
/// counted.
///
/// Use it to see that a run really crossed devices, or, read before and after a step, what
/// one step moved without the synchronisation a [`StepProfile`] costs.
///
/// # Example
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Tensor;
/// use burn_dataparallel::{DataParallel, bytes_moved};
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let model: Linear<B> = LinearConfig::new(8, 2).init(&device);
/// let dp = DataParallel::new(model, vec![device; 2]).unwrap();
///
/// let before = bytes_moved();
/// let output = dp.forward_with(Tensor::<B, 2>::ones([6, 8], &device), |m, x| m.forward(x));
/// output.sum().backward();
/// // Flex has one device: both replicas share it, and nothing crossed devices.
/// assert_eq!(bytes_moved(), before);
/// ```
pub fn bytes_moved() -> u64 {
    comm::moved_total()
}

impl std::fmt::Display for StepProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let list = |times: &[Duration]| {
            let times: Vec<String> = times.iter().map(|d| format!("{:.3}", ms(*d))).collect();
            times.join(", ")
        };
        let backward = match self.backward.is_empty() {
            true => String::new(),
            false => format!("backward [{}] ms, ", list(&self.backward)),
        };
        let buckets = match self.reduce_buckets.is_empty() {
            true => String::new(),
            false => {
                let spans: Vec<String> = (self.reduce_buckets.iter())
                    .map(|b| format!("{:.3}-{:.3}", ms(b.start), ms(b.end)))
                    .collect();
                format!("buckets reduced at [{}] ms, ", spans.join(", "))
            }
        };
        if self.exact_path {
            write!(f, "exact path: ")?;
        }
        write!(
            f,
            "scatter {:.3} ms, replicate {:.3} ms, forward [{}] ms, running states {:.3} ms, \
             gather {:.3} ms, combine {:.3} ms, {backward}{buckets}backward wait {:.3} ms, \
             backward reduce {:.3} ms, \
             backward transfers {:.3} ms; moved {} B scattered, {} B \
             broadcast in {} transfers, {} B of running states, {} B gathered, {} B reduced in \
             {} transfers",
            ms(self.scatter),
            ms(self.replicate),
            list(&self.forward),
            ms(self.running_states),
            ms(self.gather),
            ms(self.combine),
            ms(self.backward_wait),
            ms(self.backward_reduce),
            ms(self.backward_transfers),
            self.bytes_scattered,
            self.bytes_broadcast,
            self.broadcast_transfers,
            self.bytes_running_states,
            self.bytes_gathered,
            self.bytes_reduced,
            self.reduce_transfers,
        )
    }
}

/// A wrapper's profiling switch and the profile of its last step.
#[derive(Debug, Default)]
pub(crate) struct Profiler {
    enabled: AtomicBool,
    last: Mutex<Option<Arc<Sink>>>,
}

impl Profiler {
    pub(crate) fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// A fresh sink for a step about to run, when profiling is on.
    pub(crate) fn start(&self, shards: usize) -> Option<Arc<Sink>> {
        if !self.is_enabled() {
            return None;
        }
        let sink = Arc::new(Sink::default());
        sink.lock().forward = vec![Duration::ZERO; shards];
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(sink.clone());
        Some(sink)
    }

    pub(crate) fn last(&self) -> Option<StepProfile> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref().map(|sink| sink.lock().clone())
    }
}

/// The profile one step writes into, shared with the backward steps it creates.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    profile: Mutex<StepProfile>,
}

impl Sink {
    pub(crate) fn lock(&self) -> MutexGuard<'_, StepProfile> {
        self.profile.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replica `shard`'s forward took `elapsed`, up to its device having run it.
    pub(crate) fn replica_forward(&self, shard: usize, elapsed: Duration) {
        self.lock().forward[shard] = elapsed;
    }

    /// Replica `shard`'s backward took `elapsed`, from the start of the replicas' backward to
    /// its device having run it.
    pub(crate) fn replica_backward(&self, shard: usize, elapsed: Duration) {
        let mut profile = self.lock();
        if profile.backward.len() <= shard {
            profile.backward.resize(shard + 1, Duration::ZERO);
        }
        profile.backward[shard] = elapsed;
    }

    /// One gradient transfer of the backward.
    pub(crate) fn reduced(&self, bytes: u64, elapsed: Duration) {
        let mut profile = self.lock();
        profile.backward_transfers += elapsed;
        profile.bytes_reduced += bytes;
        profile.reduce_transfers += 1;
    }
}

/// A stage of the forward, to which device moves on the calling thread are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Scatter,
    Replicate,
    RunningStates,
    Gather,
    /// The replicas' own training steps' gradients summed (the Learner's path).
    #[cfg_attr(not(feature = "train"), allow(dead_code))]
    Combine,
}

/// Counts a stage's transfers into the step's profile.
struct StageLog {
    sink: Arc<Sink>,
    stage: Stage,
}

impl TransferLog for StageLog {
    fn record(&self, bytes: u64, _elapsed: Duration) {
        let mut profile = self.sink.lock();
        match self.stage {
            Stage::Scatter => profile.bytes_scattered += bytes,
            Stage::Replicate => {
                profile.bytes_broadcast += bytes;
                profile.broadcast_transfers += 1;
            }
            Stage::RunningStates => profile.bytes_running_states += bytes,
            Stage::Gather => profile.bytes_gathered += bytes,
            Stage::Combine => {
                profile.bytes_reduced += bytes;
                profile.reduce_transfers += 1;
            }
        }
    }

    fn for_backward(&self) -> Option<Arc<dyn TransferLog>> {
        Some(Arc::new(BackwardLog(self.sink.clone())))
    }
}

/// Counts (and times) the backward's gradient transfers into the step's profile.
struct BackwardLog(Arc<Sink>);

impl TransferLog for BackwardLog {
    fn record(&self, bytes: u64, elapsed: Duration) {
        self.0.reduced(bytes, elapsed);
    }

    fn timed(&self) -> bool {
        true
    }
}

/// Runs `f` as `stage` of a profiled step: device moves made by it are counted, and its
/// duration (up to `devices` being synchronised) is recorded.
pub(crate) fn stage<B: Backend, T>(
    sink: Option<&Arc<Sink>>,
    stage: Stage,
    devices: &[B::Device],
    f: impl FnOnce() -> T,
) -> T {
    let Some(sink) = sink else { return f() };
    let start = Instant::now();
    let log = StageLog {
        sink: sink.clone(),
        stage,
    };
    let output = comm::logged(Some(Arc::new(log)), f);
    synchronize::<B>(devices);
    let elapsed = start.elapsed();
    let mut profile = sink.lock();
    match stage {
        Stage::Scatter => profile.scatter += elapsed,
        Stage::Replicate => profile.replicate += elapsed,
        Stage::RunningStates => profile.running_states += elapsed,
        Stage::Gather => profile.gather += elapsed,
        Stage::Combine => profile.combine += elapsed,
    }
    output
}
