//! The [`DataParallel`] wrapper: its construction and what it holds; its forward entry points
//! are in `forwards.rs`, its [`Module`] impl in `module.rs`.

use burn::module::Module;
use burn::tensor::Device;

use crate::config::{DataParallelConfig, LossReduction, Settings};
use crate::error::DataParallelError;
use crate::profile::StepProfile;
use crate::scatter::Scatter;
use crate::shards::Shards;
use crate::step;

mod forwards;
mod module;

/// A module whose forward splits the batch over several devices and runs one replica per
/// device at the same time.
///
/// Each forward scatters the input along [`dim`](Self::dim), makes a differentiable replica of
/// the module on every device that receives a shard, runs the replicas on persistent worker
/// threads (one per entry of the device list), and gathers the outputs on
/// [`output_device`](Self::output_device). Under autodiff, gradients of every replica flow
/// back into the one set of parameters held by the wrapped module, which lives on the output
/// device.
///
/// The wrapper is a [`Module`] whose parameters are the wrapped module's, under the same
/// names: checkpoints load into the bare model and back, parameter ids and optimizer state
/// are shared.
///
/// A device may be listed more than once, which runs several replicas on it: every code path
/// of several devices on one, for tests, not faster than one replica.
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
/// // Two replicas; on a GPU machine, list distinct devices.
/// let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
///
/// let input = Tensor::<2>::ones([5, 8], &device);
/// let output = dp.forward_with(input, |model, shard| model.forward(shard));
/// assert_eq!(output.dims(), [5, 2]);
/// output.sum().backward();
/// ```
pub struct DataParallel<M> {
    pub(crate) module: M,
    pub(crate) settings: Settings,
}

impl DataParallelConfig {
    /// Wraps `module` to run on `devices` with these settings.
    ///
    /// The module moves to the output device where it is not all there. A device may appear
    /// more than once: each entry is one replica with its own worker thread.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::NoDevices`], [`DataParallelError::OutputDeviceIndex`],
    /// [`DataParallelError::ShardWeightsLength`], [`DataParallelError::InvalidShardWeight`] for
    /// settings that do not fit `devices`; [`DataParallelError::WorkerSpawn`] when the worker
    /// threads cannot be started.
    pub fn init<M: Module>(
        &self,
        module: M,
        devices: Vec<Device>,
    ) -> Result<DataParallel<M>, DataParallelError> {
        let settings = Settings::new(self, devices)?;
        let module = on_device(module, &settings.output_device);
        Ok(DataParallel { module, settings })
    }
}

impl<M: Module> DataParallel<M> {
    /// Wraps `module` to run on `devices`, gathering on the first device along dim 0.
    ///
    /// The module moves to the first device where it is not all there. A device may appear
    /// more than once: each entry is one replica with its own worker thread.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::NoDevices`] when `devices` is empty;
    /// [`DataParallelError::WorkerSpawn`] when the worker threads cannot be started.
    pub fn new(module: M, devices: Vec<Device>) -> Result<Self, DataParallelError> {
        DataParallelConfig::new().init(module, devices)
    }

    /// Gathers outputs on `device`, which must be one of the devices; the wrapped module moves
    /// there too. [`DataParallelConfig::output_index`] chooses it by position instead.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::OutputDeviceNotListed`] when `device` is not in the device list.
    pub fn with_output_device(mut self, device: Device) -> Result<Self, DataParallelError> {
        if !self.settings.devices.contains(&device) {
            return Err(DataParallelError::OutputDeviceNotListed {
                device: format!("{device:?}"),
                devices: format!("{:?}", self.settings.devices),
            });
        }
        self.module = on_device(self.module, &device);
        self.settings.output_device = device;
        Ok(self)
    }

    /// This wrapper without its replicas on `device`: after a
    /// [`DataParallelError::DeviceFailed`], training goes on with the devices that remain.
    /// The settings stay (the split's dim, the output device, the loss reduction,
    /// profiling); stated shard weights lose the removed entries' weights, and adaptive
    /// shards start again from the weights that remain.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::OutputDeviceRemoved`] when `device` is the output device (it
    /// holds the module); [`DataParallelError::WorkerSpawn`] when the lanes cannot start.
    ///
    /// # Example
    ///
    /// ```
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::tensor::Device;
    /// use burn_dataparallel::DataParallel;
    ///
    /// let cpu = Device::flex().autodiff();
    /// #[allow(deprecated)] // NdArray: a second CPU device, distinct from Flex
    /// let other = Device::ndarray().autodiff();
    /// let model: Linear = LinearConfig::new(4, 2).init(&cpu);
    /// let dp = DataParallel::new(model, vec![cpu.clone(), other.clone(), cpu.clone()]).unwrap();
    /// let dp = dp.without_device(&other).unwrap();
    /// assert_eq!(dp.replica_devices(), [cpu.clone(), cpu.clone()].as_slice());
    /// assert!(dp.without_device(&cpu).is_err());
    /// ```
    pub fn without_device(self, device: &Device) -> Result<Self, DataParallelError> {
        let DataParallel { module, settings } = self;
        if *device == settings.output_device {
            return Err(DataParallelError::OutputDeviceRemoved {
                device: format!("{device:?}"),
            });
        }
        let devices: Vec<Device> = (settings.devices.iter())
            .filter(|d| *d != device)
            .cloned()
            .collect();
        let config = DataParallelConfig {
            dim: settings.dim,
            output_index: (devices.iter().position(|d| *d == settings.output_device))
                .expect("the output device stays"),
            shard_weights: settings.shard_weights.as_deref().map(|w| {
                (settings.devices.iter().zip(w))
                    .filter(|(d, _)| *d != device)
                    .map(|(_, w)| *w)
                    .collect()
            }),
            adaptive_shards: (settings.balancer.as_ref())
                .map(|balancer| crate::balance::lock(balancer).config().clone()),
            profile: settings.profiler.is_enabled(),
            loss_reduction: settings.loss_reduction,
            sync_learner_steps: settings.sync_learner_steps,
        };
        config.init(module, devices)
    }

    /// How `input` would be split: one entry per replica that receives items.
    ///
    /// # Errors
    ///
    /// Those of [`Scatter::batch_size`], [`DataParallelError::NothingToScatter`] when `input`
    /// holds no tensor, and [`DataParallelError::EmptyBatch`] when its batch is empty.
    pub fn shards<I: Scatter>(&self, input: &I) -> Result<Shards, DataParallelError> {
        step::shards(&self.settings, input)
    }

    /// The wrapped module.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, to change between steps (freeze a layer, load parameters).
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The wrapped module, the wrapper dropped.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The device list, one entry per replica.
    pub fn replica_devices(&self) -> &[Device] {
        &self.settings.devices
    }

    /// Where outputs are gathered and the module lives.
    pub fn output_device(&self) -> &Device {
        &self.settings.output_device
    }

    /// The batch dimension.
    pub fn dim(&self) -> usize {
        self.settings.dim
    }

    /// The per-device shares of each batch, `None` for even shards.
    pub fn shard_weights(&self) -> Option<&[f64]> {
        self.settings.shard_weights.as_deref()
    }

    /// The adaptive split's current weights (each device's share of the next batch), `None`
    /// without adaptive shards.
    pub fn adaptive_weights(&self) -> Option<Vec<f64>> {
        let balancer = self.settings.balancer.as_ref()?;
        Some(crate::balance::lock(balancer).weights())
    }

    /// Turns the stage profile on or off for this wrapper and its copies (a `&self` method:
    /// a wrapper handed to burn-train's `Learner` can still be switched).
    pub fn set_profiling(&self, enabled: bool) {
        self.settings.profiler.set_enabled(enabled);
    }

    /// Whether steps record their stage profile.
    pub fn is_profiling(&self) -> bool {
        self.settings.profiler.is_enabled()
    }

    /// The stage profile of the last step with profiling on. A step that ran the module itself
    /// on one shard (one device, or adaptive shards that left every other device out) shows
    /// that shard, its time the one replica's, and no other stage.
    pub fn profile(&self) -> Option<StepProfile> {
        self.settings.profiler.last()
    }

    /// How the replicas' losses add up in burn-train's steps.
    pub fn loss_reduction(&self) -> LossReduction {
        self.settings.loss_reduction
    }

    /// Whether burn-train's steps wait for the output device before handing their item back
    /// ([`DataParallelConfig::sync_learner_steps`](crate::DataParallelConfig::sync_learner_steps)).
    pub fn sync_learner_steps(&self) -> bool {
        self.settings.sync_learner_steps
    }
}

/// `module`, moved to `device` unless it is all there (a module without parameters stays).
fn on_device<M: Module>(module: M, device: &Device) -> M {
    match module.devices().as_slice() {
        [] => module,
        [only] if only == device => module,
        _ => module.fork(device),
    }
}
