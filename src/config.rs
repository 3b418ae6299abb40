//! Serialisable settings of a [`DataParallel`](crate::DataParallel), and the settings every
//! copy of a wrapper carries.

use std::sync::Arc;
use std::time::Duration;

use burn::config::Config;

use crate::error::DataParallelError;
use crate::parallel_apply::Workers;
use crate::profile::Profiler;
use crate::shards::LossReduction;

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
    /// same time as the others (see the crate docs, "The pipeline"), on backends that allow it
    /// ([`ReplicaOps::concurrent_backward`](crate::ReplicaOps::concurrent_backward): not
    /// `Fusion`, so on CUDA use `CubeBackend` to get it). Off: Burn runs the backward of every
    /// replica on the calling thread, one graph for all.
    #[config(default = true)]
    pub parallel_backward: bool,
    /// Under the parallel backward, whether the replicas' parameter gradients are reduced in
    /// buckets of at most [`bucket_size`](Self::bucket_size) bytes as soon as every replica
    /// has produced its part of a bucket, while the replicas' backward goes on (the way DDP's
    /// bucketed all-reduce overlaps the backward), rather than all at once after the last
    /// replica's backward. The sums are the same, bit for bit; buckets run from the last
    /// parameter back, the order a backward reaches them. Each bucket's start and end are in
    /// [`StepProfile::reduce_buckets`](crate::StepProfile::reduce_buckets).
    ///
    /// Off by default: with replicas sharing one H200 it made ResNet-18's four-replica step
    /// 10 % slower (two replicas: within the spread), and it has not been measured on several
    /// GPUs yet (`benches/RESULTS.md`, 2026-12-01, `081a4b9`).
    #[config(default = false)]
    pub overlap_reduce: bool,
    /// Under the parallel backward, how long the caller's `backward()` waits for the
    /// replicas' backwards, in seconds, before it panics with a message naming each replica
    /// that is not done and where it stands: not yet running on its worker, waiting for its
    /// autodiff graph (which another backward holds: a tracked tensor reached through a global
    /// and also used by the caller's loss, see the crate docs, "The parallel backward"), or
    /// running. `None` waits for ever. Nothing else depends on how long a
    /// replica takes; raise it where a first backward compiles and tunes kernels for longer
    /// (CubeCL on a fresh cache takes minutes).
    #[config(default = "Some(600)")]
    pub backward_timeout_secs: Option<u64>,
    /// How the model's own `TrainStep` reduces its loss over the batch, under burn-train's
    /// `Learner` (see [`LossReduction`]); the hand-written loop's backward is the gathered
    /// output's and needs no such setting.
    #[config(default = "LossReduction::Mean")]
    pub loss_reduction: LossReduction,
    /// Under burn-train's `Learner`, whether the wrapper's `TrainStep::step` and
    /// `InferenceStep::step` wait for the output device before they hand back their item
    /// (`Backend::sync`), so that burn-train's metric thread reads finished values.
    ///
    /// On by default: burn-train 0.21 reads every step's item on a thread of its own, and
    /// with CubeCL 0.10 on CUDA that thread's stream waits for the step's stream only up to
    /// the point where it last waited, if the item's buffers were allocated before it: a
    /// write queued to such a buffer after that point may not have run when it is read, and
    /// the step's logged loss or accuracy is wrong (the parameters are not: it is only what
    /// the metrics read). The crate's `examples/cross_stream/` (`late`) reproduces it on
    /// `CubeBackend` alone; the bare Learner has the same fault. The wait costs the overlap
    /// of a step's device work with the next step's launches: on one H200, two replicas of a
    /// launch-bound MLP took 3.02 ms a step with it and 2.27 ms without (`benches/RESULTS.md`,
    /// 2026-12-03). Off: the wrapper's items are handed back as the bare model's are, and a
    /// logged metric may be wrong now and then (never the parameters).
    #[config(default = true)]
    pub sync_learner_steps: bool,
    /// Allows Burn 0.21's `Fusion` in f16 (`burn_cuda::Cuda<f16>`), which computes wrong
    /// outputs when several forwards of different row counts are queued before one is read,
    /// as replicas do: off by default, so that such a wrapper is refused with
    /// [`DataParallelError::FusionHalfPrecision`] rather than train on wrong values. Use
    /// `CubeBackend<CudaRuntime, f16>` (no fusion) or f32 instead.
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
            crate::shards::check_weights(weights, devices.len())?;
        }
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
