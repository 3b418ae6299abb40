//! Serialisable settings of a [`DataParallel`](crate::DataParallel), and the settings every
//! copy of a wrapper carries.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::config::Config;

use crate::balance::{AdaptiveShardsConfig, Balancer, SharedBalancer};
use crate::error::DataParallelError;
use crate::parallel_apply::Workers;
use crate::profile::Profiler;

/// Settings of a [`DataParallel`](crate::DataParallel), in Burn's `Config` style; devices are given to
/// [`init`](Self::init).
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::nn::{Linear, LinearConfig};
/// use burn_dataparallel::DataParallelConfig;
///
/// let device = Default::default();
/// let model: Linear<Flex> = LinearConfig::new(4, 4).init(&device);
/// // The second device gets three times the first one's share of every batch.
/// let dp = DataParallelConfig::new()
///     .with_shard_weights(Some(vec![1.0, 3.0]))
///     .init(model, vec![device; 2])
///     .unwrap();
/// assert_eq!(dp.shard_weights(), Some(&[1.0, 3.0][..]));
/// ```
#[derive(Config, Debug)]
pub struct DataParallelConfig {
    /// The dimension inputs are split along and outputs concatenated along.
    #[config(default = 0)]
    pub dim: usize,
    /// Position in the device list of the output device, which gathers outputs and holds the
    /// parameters ([`DataParallel::with_output_device`](crate::DataParallel::with_output_device) takes the device itself).
    #[config(default = 0)]
    pub output_index: usize,
    /// Relative share of every batch for each device (positive, one per device); even shards
    /// when `None`.
    pub shard_weights: Option<Vec<f64>>,
    /// Shards that balance themselves: from each replica's measured time over the last
    /// steps, the split moves toward shards that finish together (starting from
    /// [`shard_weights`](Self::shard_weights)), as [`AdaptiveShardsConfig`] says. Off by
    /// default: measuring waits for each replica's device at the end of its forward and its
    /// backward, which costs a launch-bound step the overlap of its launches with the device's
    /// work. For devices of unequal speed, or an output device with more to do than the rest.
    pub adaptive_shards: Option<AdaptiveShardsConfig>,
    /// Largest coalesced parameter transfer to a replica on another device, in bytes (25 MiB
    /// by default), and largest bucket of the overlapped gradient reduce
    /// ([`overlap_reduce`](Self::overlap_reduce)). Zero moves every parameter on its own.
    /// Replicas on the parameters' device never copy them.
    #[config(default = "crate::DEFAULT_BUCKET_SIZE")]
    pub bucket_size: usize,
    /// Whether every step records a [`StepProfile`](crate::StepProfile) (see
    /// [`DataParallel::set_profiling`](crate::DataParallel::set_profiling)).
    #[config(default = false)]
    pub profile: bool,
    /// Under `Autodiff`, whether each replica's backward runs on its own worker thread, at the
    /// same time as the others, on backends that allow it
    /// ([`ReplicaOps::concurrent_backward`](crate::ReplicaOps::concurrent_backward): not
    /// `Fusion`). Off: Burn runs every replica's backward on the calling thread, one graph for
    /// all. See the crate docs, *The parallel backward*.
    #[config(default = true)]
    pub parallel_backward: bool,
    /// Under the parallel backward, whether the replicas' parameter gradients are reduced in
    /// buckets of at most [`bucket_size`](Self::bucket_size) bytes while the replicas'
    /// backwards still run (the way DDP's bucketed all-reduce overlaps the backward), rather
    /// than after the last one; the sums are the same, bit for bit. Off by default: it has not
    /// paid on one GPU, and is not measured on several yet (see the crate's benchmark
    /// results).
    #[config(default = false)]
    pub overlap_reduce: bool,
    /// Under the parallel backward, how long the caller's `backward()` waits for the
    /// replicas' backwards, in seconds, before it panics with a message saying where each
    /// replica that is not done stands. `None` waits for ever. Nothing else depends on how
    /// long a replica takes; raise it where a first backward compiles kernels for longer.
    #[config(default = "Some(600)")]
    pub backward_timeout_secs: Option<u64>,
    /// How the model's own `TrainStep` reduces its loss over the batch, under burn-train's
    /// `Learner` (see [`LossReduction`]); the hand-written loop's backward is the gathered
    /// output's and needs no such setting.
    #[config(default = "LossReduction::Mean")]
    pub loss_reduction: LossReduction,
    /// Under burn-train's `Learner`, whether the wrapper's `TrainStep::step` and
    /// `InferenceStep::step` wait for the output device before they hand back their item, so
    /// that burn-train's metric thread, which reads it on a CubeCL stream of its own, reads
    /// finished values (CubeCL 0.10 does not always make that stream wait). On by default;
    /// it costs the overlap of a step's device work with the next step's launches. Off: a
    /// logged metric may be wrong now and then, never the parameters. See the crate docs'
    /// Learner chapter.
    #[config(default = true)]
    pub sync_learner_steps: bool,
    /// Allows Burn 0.21's `Fusion` in f16, which computes wrong outputs when several forwards
    /// of different row counts are queued, as replicas do: off by default, so that such a
    /// wrapper is refused with [`DataParallelError::FusionHalfPrecision`]. Use
    /// `CubeCuda<f16>` (feature `cuda`, no fusion) or f32 instead.
    #[config(default = false)]
    pub allow_fusion_f16: bool,
}

/// Everything a wrapper is besides its module; shared by its clones and its `valid()` copy
/// (the workers and the profiler by reference).
#[derive(Debug, Clone)]
pub(crate) struct Settings<D> {
    pub(crate) devices: Vec<D>,
    pub(crate) output_device: D,
    pub(crate) dim: usize,
    pub(crate) shard_weights: Option<Vec<f64>>,
    /// The adaptive split, when on (shared by the wrapper's clones).
    pub(crate) balancer: Option<SharedBalancer>,
    pub(crate) bucket_size: usize,
    pub(crate) parallel_backward: bool,
    pub(crate) overlap_reduce: bool,
    pub(crate) backward_timeout: Option<Duration>,
    pub(crate) loss_reduction: LossReduction,
    pub(crate) sync_learner_steps: bool,
    /// One lane per device entry; none for a single device.
    pub(crate) workers: Option<Arc<Workers>>,
    pub(crate) profiler: Arc<Profiler>,
}

impl<D: Clone + PartialEq> Settings<D> {
    /// Validates `config` against `devices` (and against `fusion_half_precision`: the backend
    /// is Burn 0.21's `Fusion` in f16) and starts the workers.
    pub(crate) fn new(
        config: &DataParallelConfig,
        devices: Vec<D>,
        fusion_half_precision: bool,
    ) -> Result<Self, DataParallelError> {
        if fusion_half_precision && !config.allow_fusion_f16 {
            return Err(DataParallelError::FusionHalfPrecision);
        }
        if devices.is_empty() {
            return Err(DataParallelError::NoDevices);
        }
        let output_device = devices.get(config.output_index).cloned().ok_or(
            DataParallelError::OutputDeviceIndex {
                index: config.output_index,
                len: devices.len(),
            },
        )?;
        if let Some(weights) = &config.shard_weights {
            check_weights(weights, devices.len())?;
        }
        let balancer = match &config.adaptive_shards {
            Some(adaptive) => {
                adaptive.check()?;
                let weights = config.shard_weights.as_deref();
                let balancer = Balancer::new(adaptive.clone(), devices.len(), weights);
                Some(Arc::new(Mutex::new(balancer)))
            }
            None => None,
        };
        let workers = match devices.len() {
            1 => None,
            slots => Some(Arc::new(Workers::new(slots)?)),
        };
        let profiler = Arc::<Profiler>::default();
        profiler.set_enabled(config.profile);
        Ok(Self {
            devices,
            output_device,
            dim: config.dim,
            shard_weights: config.shard_weights.clone(),
            balancer,
            bucket_size: config.bucket_size,
            parallel_backward: config.parallel_backward,
            overlap_reduce: config.overlap_reduce,
            backward_timeout: config.backward_timeout_secs.map(Duration::from_secs),
            loss_reduction: config.loss_reduction,
            sync_learner_steps: config.sync_learner_steps,
            workers,
            profiler,
        })
    }
}

/// Validates shard weights against the device count.
pub(crate) fn check_weights(weights: &[f64], devices: usize) -> Result<(), DataParallelError> {
    if weights.len() != devices {
        return Err(DataParallelError::ShardWeightsLength {
            expected: devices,
            found: weights.len(),
        });
    }
    match weights.iter().position(|w| !(w.is_finite() && *w > 0.0)) {
        Some(index) => Err(DataParallelError::InvalidShardWeight {
            index,
            weight: weights[index],
        }),
        None => Ok(()),
    }
}

/// How a model's own training step reduces its loss over the batch, which says how the
/// wrapper combines the replicas' gradients under burn-train's `Learner`
/// ([`DataParallelConfig::loss_reduction`](crate::DataParallelConfig::loss_reduction)).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LossReduction {
    /// The loss is a mean over the batch (Burn's losses by default): each replica's gradients
    /// are weighted by its share of the batch, `n_i / N`, and summed, which gives the
    /// whole-batch gradient; a penalty or auxiliary term added to the loss is weighted the
    /// same way, so it counts once, as in the bare model. A mean normalised by something
    /// other than rows (class weights, masked tokens) needs the batch to state each part's
    /// weight ([`Scatter::loss_weight`](crate::Scatter::loss_weight)); the shares are then
    /// those weights over their sum.
    Mean,
    /// The loss is a sum over the batch: the replicas' gradients are summed unweighted. A term
    /// added to the loss that does not grow with the batch then counts once per replica.
    Sum,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_checked() {
        assert!(check_weights(&[1.0, 2.0], 2).is_ok());
        assert!(matches!(
            check_weights(&[1.0], 2),
            Err(DataParallelError::ShardWeightsLength {
                expected: 2,
                found: 1
            })
        ));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                check_weights(&[1.0, bad], 2),
                Err(DataParallelError::InvalidShardWeight { index: 1, .. })
            ));
        }
    }
}
