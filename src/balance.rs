//! Shards that balance themselves ([`DataParallelConfig::adaptive_shards`]): each step times
//! every replica's share of the work (its forward and its backward, up to its device having
//! run them), and the next step's split follows.
//!
//! Each device slot has an estimate of its time per row, an average over steps: each step's
//! measurement `t_i / n_i` moves it `damping` of the way (`c <- (1 - damping) c + damping
//! t / n`; before the first measurement the current split is taken as balanced). The split is
//! the one whose shards would finish together under those estimates (shares proportional to
//! `1 / c_i`), moved to only when the current split's predicted finish times are further
//! apart than `tolerance` (a new shard shape costs kernels compiling on GPU backends, and
//! noise should not move rows back and forth). Every device keeps at least one row. A step is
//! measured only when each of its shards has run with its size before: on GPU backends a new
//! shard shape's first step holds the compiling and tuning of its kernels, which says nothing
//! of the device's speed (measured, it drove the split to one row on one device of an H200).
//! A function of the timings and the sizes run: the same give the same split. Gradients are
//! the bare model's whatever the split (the losses are weighted by the shards' shares).
//!
//! [`DataParallelConfig::adaptive_shards`]: crate::DataParallelConfig::adaptive_shards

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use burn::config::Config;

use crate::error::DataParallelError;
use crate::shards::sizes::shard_sizes;

/// How the split follows the replicas' measured times
/// ([`DataParallelConfig::adaptive_shards`](crate::DataParallelConfig::adaptive_shards)).
///
/// # Example
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn_dataparallel::{AdaptiveShardsConfig, DataParallelConfig};
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let model: Linear<B> = LinearConfig::new(8, 2).init(&device);
/// let dp = DataParallelConfig::new()
///     .with_adaptive_shards(Some(AdaptiveShardsConfig::new().with_damping(0.5)))
///     .init(model, vec![device; 2])
///     .unwrap();
/// assert_eq!(dp.adaptive_weights(), Some(vec![0.5, 0.5]));
/// ```
#[derive(Config, Debug, PartialEq)]
pub struct AdaptiveShardsConfig {
    /// How far each step's measured time per row moves a device's estimate, in `(0, 1]`: 1
    /// follows every step (and every fluctuation), smaller values average over more steps.
    #[config(default = 0.5)]
    pub damping: f64,
    /// How far apart the replicas' predicted finish times may be, relative to the slowest,
    /// before the split moves: a new shard shape costs compiling and tuning kernels on GPU
    /// backends, so small differences are left alone.
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

/// The adaptive split of a wrapper, shared by its clones: the current weights and the last
/// step's measurements, folded in when the next step is split.
#[derive(Debug)]
pub(crate) struct Balancer {
    config: AdaptiveShardsConfig,
    /// One weight per device slot, summing to one.
    weights: Vec<f64>,
    /// Per slot, the estimated seconds per row; `None` before its first measurement.
    costs: Vec<Option<f64>>,
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
}

impl Measured {
    /// Adds `elapsed` to shard `shard`'s time (its forward, then its backward).
    pub(crate) fn add(&self, shard: usize, elapsed: Duration) {
        let mut times = self.times.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(time) = times.get_mut(shard) {
            *time += elapsed;
        }
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
            costs: vec![None; weights.len()],
            ran: HashSet::new(),
            weights,
            pending: None,
        }
    }

    /// The current weights, one per slot, with the last step's measurements folded in.
    pub(crate) fn weights(&mut self) -> Vec<f64> {
        self.fold();
        self.weights.clone()
    }

    /// The sizes of the next step's shards for `batch_size` rows, the last step's
    /// measurements folded in first; every slot gets at least one row where the batch has a
    /// row for each.
    pub(crate) fn sizes(&mut self, batch_size: usize) -> Vec<usize> {
        self.fold();
        at_least_one(shard_sizes(
            batch_size,
            self.weights.len(),
            Some(&self.weights),
        ))
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
        });
        self.pending = Some(measured.clone());
        Some(measured)
    }

    /// Folds the last step's measurements into the estimates ([`next_costs`]) and the
    /// split ([`next_weights`]).
    fn fold(&mut self) {
        let Some(measured) = self.pending.take() else {
            return;
        };
        let times = measured.times.lock().unwrap_or_else(|e| e.into_inner());
        let damping = self.config.damping;
        self.costs = next_costs(
            &self.costs,
            &measured.slots,
            &measured.rows,
            &times,
            damping,
        );
        self.weights = next_weights(&self.weights, &self.costs, self.config.tolerance);
    }
}

/// The estimates of seconds per row after one step in which `rows[i]` rows on slot
/// `slots[i]` took `times[i]`: each moved `damping` of the way to the measurement. A slot
/// measured for the first time starts from the time per row that would have made the step's
/// shards finish together (the current split taken as balanced). A step with a shard that
/// was not timed changes nothing.
pub(crate) fn next_costs(
    costs: &[Option<f64>],
    slots: &[usize],
    rows: &[usize],
    times: &[Duration],
    damping: f64,
) -> Vec<Option<f64>> {
    if times.iter().any(Duration::is_zero) || rows.contains(&0) {
        return costs.to_vec();
    }
    let seconds: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
    let mean = seconds.iter().sum::<f64>() / seconds.len() as f64;
    let mut next = costs.to_vec();
    for ((&slot, &n), t) in slots.iter().zip(rows).zip(&seconds) {
        let prior = costs[slot].unwrap_or(mean / n as f64);
        next[slot] = Some((1.0 - damping) * prior + damping * t / n as f64);
    }
    next
}

/// The split for the estimated `costs` (seconds per row): among the slots with an estimate,
/// the weight they hold together shared so that their shards would finish together, unless
/// the current `weights` already finish within `tolerance` of each other. Slots without an
/// estimate keep their weight.
pub(crate) fn next_weights(weights: &[f64], costs: &[Option<f64>], tolerance: f64) -> Vec<f64> {
    let known: Vec<(usize, f64)> = (costs.iter().enumerate())
        .filter_map(|(slot, cost)| cost.map(|c| (slot, c)))
        .collect();
    if known.len() < 2 {
        return weights.to_vec();
    }
    let finish: Vec<f64> = known.iter().map(|&(slot, c)| weights[slot] * c).collect();
    let slowest = finish.iter().copied().fold(0.0, f64::max);
    let fastest = finish.iter().copied().fold(f64::INFINITY, f64::min);
    if slowest - fastest <= tolerance * slowest {
        return weights.to_vec();
    }
    let held: f64 = known.iter().map(|&(slot, _)| weights[slot]).sum();
    let speed: f64 = known.iter().map(|&(_, c)| 1.0 / c).sum();
    let mut next = weights.to_vec();
    for &(slot, c) in &known {
        next[slot] = held * (1.0 / c) / speed;
    }
    normalized(&next)
}

/// `weights` scaled to sum to one.
fn normalized(weights: &[f64]) -> Vec<f64> {
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// `sizes` with every slot at one row at least, where there are as many rows as slots: a
/// row taken from the largest shard for each empty one.
fn at_least_one(mut sizes: Vec<usize>) -> Vec<usize> {
    if sizes.iter().sum::<usize>() < sizes.len() {
        return sizes;
    }
    while let Some(empty) = sizes.iter().position(|&n| n == 0) {
        let largest = (0..sizes.len()).max_by_key(|&i| (sizes[i], usize::MAX - i));
        let largest = largest.expect("a slot");
        sizes[largest] -= 1;
        sizes[empty] += 1;
    }
    sizes
}

/// The shared balancer of a wrapper's settings.
pub(crate) type SharedBalancer = Arc<Mutex<Balancer>>;

/// Locks a shared balancer.
pub(crate) fn lock(balancer: &SharedBalancer) -> MutexGuard<'_, Balancer> {
    balancer.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a balancer on `rows` shards of `batch`, slot `i` taking `per_row[i]`
    /// milliseconds a row: the rows slot 0 gets, step after step.
    fn run(config: &AdaptiveShardsConfig, per_row: &[&[u64]], batch: usize) -> Vec<usize> {
        let slots: Vec<usize> = (0..per_row[0].len()).collect();
        let mut balancer = Balancer::new(config.clone(), slots.len(), None);
        per_row
            .iter()
            .map(|per_row| {
                let rows = balancer.sizes(batch);
                let times: Vec<Duration> = (rows.iter().zip(*per_row))
                    .map(|(&n, &ms)| Duration::from_millis(n as u64 * ms))
                    .collect();
                if let Some(measured) = balancer.measure(&slots, &rows) {
                    for (shard, time) in times.into_iter().enumerate() {
                        measured.add(shard, time);
                    }
                }
                rows[0]
            })
            .collect()
    }

    /// A replica twice as slow per row ends up with a third of the batch, approaching it
    /// from one side only (no oscillation) within nine steps (each new split's first step is
    /// not measured), and the split comes back when the asymmetry goes.
    #[test]
    fn a_slower_replica_gets_fewer_rows() {
        let config = AdaptiveShardsConfig::new();
        let mut steps: Vec<&[u64]> = vec![&[1, 2]; 12];
        steps.extend([&[1u64, 1][..]; 12]);
        let history = run(&config, &steps, 600);
        assert_eq!(
            history[..2],
            [300, 300],
            "the first step is not measured: {history:?}"
        );
        assert!(
            history[..12].windows(2).all(|w| w[0] <= w[1]),
            "{history:?}"
        );
        assert!(
            history[8..12].iter().all(|&n| (385..=410).contains(&n)),
            "{history:?}"
        );
        assert!(
            history[12..].windows(2).all(|w| w[0] >= w[1]),
            "{history:?}"
        );
        assert!((290..=315).contains(&history[23]), "{history:?}");
    }

    /// A step of sizes not run before is not timed: a new split's first step waits.
    #[test]
    fn new_shard_sizes_are_not_measured() {
        let mut balancer = Balancer::new(AdaptiveShardsConfig::new(), 2, None);
        assert!(balancer.measure(&[0, 1], &[5, 5]).is_none());
        assert!(balancer.measure(&[0, 1], &[5, 5]).is_some());
        assert!(balancer.measure(&[0, 1], &[6, 4]).is_none());
        assert!(
            balancer.measure(&[0, 1], &[5, 4]).is_some(),
            "both sizes ran before"
        );
        assert!(balancer.measure(&[0, 1], &[7, 3]).is_none());
    }

    /// Predicted finish times within the tolerance leave the split where it is.
    #[test]
    fn close_finish_times_move_nothing() {
        let weights = vec![0.6, 0.4];
        let costs = vec![Some(1.0), Some(1.4)];
        assert_eq!(next_weights(&weights, &costs, 0.1), weights);
        assert_ne!(next_weights(&weights, &costs, 0.05), weights);
    }

    /// Slots without an estimate keep their weight, and an untimed shard changes nothing.
    #[test]
    fn only_the_measured_slots_move() {
        let weights = vec![0.25; 4];
        let costs = next_costs(&[None; 4], &[0, 2], &[10, 10], &ms(&[10, 30]), 1.0);
        assert_eq!(costs, [Some(1e-3), None, Some(3e-3), None]);
        let next = next_weights(&weights, &costs, 0.0);
        assert_eq!((next[1], next[3]), (0.25, 0.25));
        assert!((next[0] - 0.375).abs() < 1e-12 && (next[2] - 0.125).abs() < 1e-12);
        let untimed = next_costs(&costs, &[0, 2], &[10, 10], &ms(&[10, 0]), 1.0);
        assert_eq!(untimed, costs);
    }

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    /// Every slot keeps a row, however small its weight.
    #[test]
    fn every_device_keeps_a_row() {
        assert_eq!(
            at_least_one(shard_sizes(10, 3, Some(&[1.0, 1e-6, 1e-6]))),
            [8, 1, 1]
        );
        assert_eq!(at_least_one(vec![2, 0]), [1, 1]);
        assert_eq!(at_least_one(vec![1, 0, 0]), [1, 0, 0]);
    }

    #[test]
    fn settings_are_checked() {
        assert!(AdaptiveShardsConfig::new().check().is_ok());
        for (damping, tolerance) in [(0.0, 0.1), (1.5, 0.1), (0.5, -0.1), (0.5, f64::NAN)] {
            let config = AdaptiveShardsConfig::new()
                .with_damping(damping)
                .with_tolerance(tolerance);
            assert!(config.check().is_err(), "{config:?}");
        }
    }
}
