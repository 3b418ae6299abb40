//! Serialisable settings of a [`DataParallel`](crate::DataParallel).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::backend::Backend;

use crate::{DataParallel, DataParallelError};

/// Settings of a [`DataParallel`], in Burn's `Config` style; devices are given to
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
    /// Position in the device list of the device that gathers outputs and holds the parameters.
    #[config(default = 0)]
    pub output_device: usize,
    /// Relative share of every batch for each device (positive, one per device); even shards
    /// when `None`.
    pub shard_weights: Option<Vec<f64>>,
    /// Largest coalesced parameter transfer to a replica on another device, in bytes (25 MiB
    /// by default). With the single backward, gradients come back in the same buckets; with
    /// the parallel backward ([`parallel_backward`](Self::parallel_backward)), the gradients
    /// of the replicas on each device are summed there and come back in one buffer per dtype.
    /// Zero moves every parameter on its own. Replicas on the parameters' device never copy
    /// them.
    #[config(default = 26214400)]
    pub bucket_size: usize,
    /// Whether every step records a [`StepProfile`](crate::StepProfile) (see
    /// [`DataParallel::set_profiling`]).
    #[config(default = false)]
    pub profile: bool,
    /// Under `Autodiff`, whether each replica's backward runs on its own worker thread, at the
    /// same time as the others (see the crate docs, "The pipeline"), on backends that allow it
    /// ([`ConcatBackend::concurrent_backward`](crate::ConcatBackend::concurrent_backward): not
    /// `Fusion`, so on CUDA use `CubeBackend` to get it). Off: Burn runs the backward of every
    /// replica on the calling thread, one graph for all.
    #[config(default = true)]
    pub parallel_backward: bool,
}

impl DataParallelConfig {
    /// Wraps `module` to run on `devices` with these settings.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::NoDevices`], [`DataParallelError::OutputDeviceIndex`],
    /// [`DataParallelError::ShardWeightsLength`], [`DataParallelError::InvalidShardWeight`] for
    /// settings that do not fit `devices`; [`DataParallelError::WorkerSpawn`] when the worker
    /// threads cannot be started.
    pub fn init<B: Backend, M: Module<B>>(
        &self,
        module: M,
        devices: Vec<B::Device>,
    ) -> Result<DataParallel<B, M>, DataParallelError> {
        let dp = DataParallel::build(
            module,
            devices,
            self.output_device,
            self.dim,
            self.shard_weights.clone(),
            self.bucket_size,
        )?;
        dp.set_profiling(self.profile);
        Ok(DataParallel {
            parallel_backward: self.parallel_backward,
            ..dp
        })
    }
}
