//! Shards that balance themselves ([`DataParallelConfig::adaptive_shards`]): each step times
//! every replica's share of the work (its forward, or under burn-train's `TrainStep` its
//! whole step with its backward, up to its device having run them), and the next step's
//! split follows.
//!
//! Each device slot's time is a straight line in its rows, `fixed + per_row * rows`, fitted
//! to its recent steps (each step's weight `1 - damping` times the next one's; `line.rs`):
//! the fixed part is what does not shrink with the rows (launches, waits, the output
//! device's own work), and read as slowness it would take rows from the smaller shard until
//! one device had a single row. Until a slot has run two sizes, its time is taken as all per
//! row. The split is the one whose shards would finish together under those lines, moved to
//! only when that brings the slowest predicted finish forward by more than `tolerance` of it,
//! or three times the slots' measured noise (a new shard shape costs kernels compiling on GPU
//! backends, noise should not move rows back and forth, and a device late by a cost no split
//! removes keeps its rows), no shard more than doubled or halved in one move, every device
//! taking part keeping a row. A step is measured only when each of its shards has run with
//! its size before: on GPU backends a new shard shape's first step holds the compiling and
//! tuning of its kernels, which says nothing of the device's speed. A function of the
//! timings and the sizes run: the same give the same split. Gradients are the bare model's
//! whatever the split (the losses are weighted by the shards' shares).
//!
//! A device can also cost the step more than its rows save: making its replica holds the
//! calling thread (a GPU's parameters read onto the CPU), or it is slower with one row than
//! the others with the whole batch. Each slot's replica-making time is averaged as its times
//! are, and a device is left out (weight zero, no replica) where the step's predicted
//! finish, those times one after the other and then the slowest line, is sooner without it
//! by more than the tolerance; it comes back where it is sooner with it, judged by its last
//! line (`split.rs`). With only the output device left, the wrapper runs the module itself,
//! as the bare model, and measures nothing more.
//!
//! [`DataParallelConfig::adaptive_shards`]: crate::DataParallelConfig::adaptive_shards

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use burn::config::Config;

use crate::error::DataParallelError;

mod line;
mod split;
use line::{Line, Recent};
use split::{next_weights, normalized};

/// How the split follows the replicas' measured times
/// ([`DataParallelConfig::adaptive_shards`](crate::DataParallelConfig::adaptive_shards)).
///
/// # Example
///
/// ```
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Device;
/// use burn_dataparallel::{AdaptiveShardsConfig, DataParallelConfig};
///
/// let device = Device::flex().autodiff();
/// let model: Linear = LinearConfig::new(8, 2).init(&device);
/// let dp = DataParallelConfig::new()
///     .with_adaptive_shards(Some(AdaptiveShardsConfig::new().with_damping(0.5)))
///     .init(model, vec![device.clone(); 2])
///     .unwrap();
/// assert_eq!(dp.adaptive_weights(), Some(vec![0.5, 0.5]));
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct AdaptiveShardsConfig {
    /// How far each step's measured time per row moves a device's estimate, in `(0, 1]`: 1
    /// follows every step (and every fluctuation), smaller values average over more steps.
    #[config(default = 0.5)]
    pub damping: f64,
    /// How much sooner, relative to it, the slowest replica has to be predicted to finish
    /// under a new split for the split to move (or three times the devices' measured noise,
    /// where more): a new shard shape costs compiling and tuning kernels on GPU backends, so
    /// small gains are left alone.
    #[config(default = 0.05)]
    pub tolerance: f64,
}

impl AdaptiveShardsConfig {
    /// # Errors
    ///
    /// [`DataParallelError::InvalidAdaptiveShards`] for a damping outside `(0, 1]` or a
    /// tolerance that is negative or not finite.
    pub(crate) fn check(&self) -> Result<(), DataParallelError> {
        let damping_ok = self.damping > 0.0 && self.damping <= 1.0;
        let tolerance_ok = self.tolerance.is_finite() && self.tolerance >= 0.0;
        match damping_ok && tolerance_ok {
            true => Ok(()),
            false => Err(DataParallelError::InvalidAdaptiveShards {
                damping: self.damping,
                tolerance: self.tolerance,
            }),
        }
    }
}

/// How many times its uncertainty a slot's predicted finish may stray before the split moves,
/// where that is more than the configured tolerance: noisy times should not move rows back and
/// forth. The prediction averages recent steps, so its uncertainty is the steps' noise times
/// `sqrt(damping / (2 - damping))` (the spread of such an average of independent noise).
const NOISE_MARGIN: f64 = 3.0;

/// The adaptive split of a wrapper, shared by its clones: the current weights and the last
/// step's measurements, folded in when the next step is split.
#[derive(Debug)]
pub(crate) struct Balancer {
    config: AdaptiveShardsConfig,
    /// One weight per device slot, summing to one.
    weights: Vec<f64>,
    /// Per slot, its recent steps' sizes and times.
    recent: Vec<Recent>,
    /// Per slot, the recent steps' time spent making its replica on the calling thread
    /// (averaged as the times are), which every slot waits for.
    moves: Vec<Option<f64>>,
    /// The shard sizes each slot has run (slot, rows): a step of sizes run before is measured.
    ran: HashSet<(usize, usize)>,
    /// The last step's measurements, not folded in yet.
    pending: Option<Arc<Measured>>,
}

/// What one step measured: per shard, its slot, its rows and the time its replica took.
#[derive(Debug)]
pub(crate) struct Measured {
    slots: Vec<usize>,
    rows: Vec<usize>,
    times: Mutex<Vec<Duration>>,
    /// Per shard, what making its replica held the calling thread (copies through the host).
    moves: Mutex<Vec<Duration>>,
}

impl Measured {
    /// Adds `elapsed` to shard `shard`'s time (its forward, then its backward).
    pub(crate) fn add(&self, shard: usize, elapsed: Duration) {
        let mut times = self.times.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(time) = times.get_mut(shard) {
            *time += elapsed;
        }
    }

    /// Sets each shard's replica-making time (`replicate::timed_replicas`).
    pub(crate) fn set_moves(&self, moves: &[Duration]) {
        *self.moves.lock().unwrap_or_else(|e| e.into_inner()) = moves.to_vec();
    }
}

impl Balancer {
    /// A balancer for `slots` devices starting from `initial` weights (even without).
    pub(crate) fn new(config: AdaptiveShardsConfig, slots: usize, initial: Option<&[f64]>) -> Self {
        let weights = match initial {
            Some(weights) => normalized(weights),
            None => vec![1.0 / slots as f64; slots],
        };
        Self {
            config,
            recent: vec![Recent::default(); weights.len()],
            moves: vec![None; weights.len()],
            ran: HashSet::new(),
            weights,
            pending: None,
        }
    }

    /// The settings it was made with.
    pub(crate) fn config(&self) -> &AdaptiveShardsConfig {
        &self.config
    }

    /// The current weights, one per slot, with the last step's measurements folded in: the
    /// next step's split (`shards::adaptive_sizes`).
    pub(crate) fn weights(&mut self) -> Vec<f64> {
        self.fold();
        self.weights.clone()
    }

    /// Starts measuring a step whose shards go to `slots` with `rows` each, if every slot
    /// has run its size before (otherwise the step is not timed); the measurements are folded
    /// in when the next step is split.
    pub(crate) fn measure(&mut self, slots: &[usize], rows: &[usize]) -> Option<Arc<Measured>> {
        let mut repeated = true;
        for (&slot, &n) in slots.iter().zip(rows) {
            repeated &= !self.ran.insert((slot, n));
        }
        if !repeated {
            return None;
        }
        let measured = Arc::new(Measured {
            slots: slots.to_vec(),
            rows: rows.to_vec(),
            times: Mutex::new(vec![Duration::ZERO; rows.len()]),
            moves: Mutex::new(vec![Duration::ZERO; rows.len()]),
        });
        self.pending = Some(measured.clone());
        Some(measured)
    }

    /// Folds the last step's measurements into the slots' recent steps and the split
    /// ([`next_weights`]). A step with a shard that was not timed changes nothing.
    fn fold(&mut self) {
        let Some(measured) = self.pending.take() else {
            return;
        };
        let times = measured.times.lock().unwrap_or_else(|e| e.into_inner());
        if times.iter().any(Duration::is_zero) || measured.rows.contains(&0) {
            return;
        }
        let damping = self.config.damping;
        let made = measured.moves.lock().unwrap_or_else(|e| e.into_inner());
        for (shard, (&slot, &n)) in measured.slots.iter().zip(&measured.rows).enumerate() {
            let time = times[shard].as_secs_f64();
            self.recent[slot] = self.recent[slot].add(n as f64, time, damping);
            let moved = made.get(shard).map_or(0.0, Duration::as_secs_f64);
            self.moves[slot] = Some(match self.moves[slot] {
                Some(before) => (1.0 - damping) * before + damping * moved,
                None => moved,
            });
        }
        let lines: Vec<Option<Line>> = self.recent.iter().map(Recent::line).collect();
        let total = measured.rows.iter().sum::<usize>() as f64;
        let noise = self.recent.iter().map(Recent::noise).fold(0.0, f64::max);
        let averaged = (damping / (2.0 - damping)).sqrt();
        let tolerance = self.config.tolerance.max(NOISE_MARGIN * noise * averaged);
        let moves: Vec<f64> = self.moves.iter().map(|m| m.unwrap_or(0.0)).collect();
        self.weights = next_weights(&self.weights, &lines, &moves, total, tolerance);
    }
}

/// The shared balancer of a wrapper's settings.
pub(crate) type SharedBalancer = Arc<Mutex<Balancer>>;

/// Locks a shared balancer.
pub(crate) fn lock(balancer: &SharedBalancer) -> MutexGuard<'_, Balancer> {
    balancer.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
