//! The [`DataParallel`] wrapper and its construction; its forward entry points are in
//! `data_parallel/forwards.rs`, what it holds and was built with in
//! `data_parallel/accessors.rs`.

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::backend::ConcatBackend;
use crate::config::DataParallelConfig;
use crate::config::Settings;
use crate::error::DataParallelError;
use crate::replicate::{MoveModule, initialize, move_module};
use crate::running_states::OwnStates;
use crate::scatter::Scatter;
use crate::shards::Shards;
use crate::step;

mod accessors;
mod forwards;

/// A module whose forward splits the batch over several devices and runs one replica per
/// device at the same time.
///
/// Each forward scatters the input along [`dim`](Self::dim), makes a differentiable replica of
/// the module on every device that receives a shard, runs the replicas on persistent worker
/// threads (one per device), and gathers the outputs on [`output_device`](Self::output_device).
/// Under an autodiff backend, gradients of every replica flow back into the one set of
/// parameters held by the wrapped module, which lives on the output device.
///
/// The wrapper is a [`Module`] whose record is the wrapped module's record: checkpoints load
/// into the bare model and back, parameter ids and optimizer state are shared.
///
/// A device may be listed more than once, which runs several replicas on it: every code path
/// of several devices on one, for tests, not faster than one replica (on CubeCL backends a
/// device's launches run on one thread).
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
/// // Two replicas; on a GPU machine, list distinct devices.
/// let dp = DataParallel::new(model, vec![device; 2]).unwrap();
///
/// let input = Tensor::<B, 2>::ones([5, 8], &device);
/// let output = dp.forward_with(input, |model, shard| model.forward(shard));
/// assert_eq!(output.dims(), [5, 2]);
/// output.sum().backward();
/// ```
pub struct DataParallel<B: Backend, M> {
    pub(crate) module: M,
    pub(crate) settings: Settings<B::Device>,
    /// Gives replicas on other devices running states of their own (see
    /// [`with_running_states_per_device`](Self::with_running_states_per_device)).
    pub(crate) own_states: Option<OwnStates<M>>,
    /// How `fork` and `to_device` move the module (see [`move_module`]); Burn's own where
    /// unset.
    pub(crate) relocate: Option<MoveModule<M, B::Device>>,
}

impl DataParallelConfig {
    /// Wraps `module` to run on `devices` with these settings.
    ///
    /// The module's lazy parameters are initialised and, where they are not on the output
    /// device, the module is forked there. A device may appear more than once: each entry is
    /// one replica with its own worker thread.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::NoDevices`], [`DataParallelError::OutputDeviceIndex`],
    /// [`DataParallelError::ShardWeightsLength`], [`DataParallelError::InvalidShardWeight`] for
    /// settings that do not fit `devices`; [`DataParallelError::FusionHalfPrecision`] on Burn
    /// 0.21's `Fusion` in f16 unless [`allow_fusion_f16`](Self::allow_fusion_f16);
    /// [`DataParallelError::WorkerSpawn`] when the worker threads cannot be started.
    pub fn init<B: ConcatBackend, M: Module<B>>(
        &self,
        module: M,
        devices: Vec<B::Device>,
    ) -> Result<DataParallel<B, M>, DataParallelError> {
        let settings = Settings::new(self, devices, B::fusion_half_precision())?;
        Ok(DataParallel::from_settings(module, settings))
    }
}

impl<B: Backend, M: Module<B>> DataParallel<B, M> {
    /// Wraps `module` to run on `devices`, gathering on the first device along dim 0.
    ///
    /// The module's lazy parameters are initialised and, where they are not on the output
    /// device, the module is forked there. A device may appear more than once: each entry is
    /// one replica with its own worker thread.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::NoDevices`] when `devices` is empty;
    /// [`DataParallelError::FusionHalfPrecision`] on Burn 0.21's `Fusion` in f16 (see
    /// [`DataParallelConfig::allow_fusion_f16`]); [`DataParallelError::WorkerSpawn`] when the
    /// worker threads cannot be started.
    pub fn new(module: M, devices: Vec<B::Device>) -> Result<Self, DataParallelError>
    where
        B: ConcatBackend,
    {
        DataParallelConfig::new().init(module, devices)
    }

    /// The wrapper of `module` with `settings`.
    pub(crate) fn from_settings(module: M, settings: Settings<B::Device>) -> Self
    where
        B: ConcatBackend,
    {
        Self {
            module: on_device(module, &settings.output_device, Some(move_module::<B, M>)),
            settings,
            own_states: None,
            relocate: Some(move_module::<B, M>),
        }
    }

    /// Gathers outputs on `device`, which must be one of the devices; the wrapped module moves
    /// there too. [`DataParallelConfig::output_index`] chooses it by position instead.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::OutputDeviceNotListed`] when `device` is not in the device list.
    pub fn with_output_device(mut self, device: B::Device) -> Result<Self, DataParallelError> {
        if !self.settings.devices.contains(&device) {
            return Err(DataParallelError::OutputDeviceNotListed {
                device: format!("{device:?}"),
                devices: format!("{:?}", self.settings.devices),
            });
        }
        self.module = on_device(self.module, &device, self.relocate);
        self.settings.output_device = device;
        Ok(self)
    }

    /// How `input` would be split: one entry per replica that receives items.
    ///
    /// # Errors
    ///
    /// Those of [`Scatter::batch_size`], [`DataParallelError::NothingToScatter`] when `input`
    /// holds no tensor, and [`DataParallelError::EmptyBatch`] when its batch is empty.
    pub fn shards<I: Scatter<B>>(&self, input: &I) -> Result<Shards<B>, DataParallelError> {
        step::shards(&self.settings, input)
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> DataParallel<B, M> {
    /// Gives each device that the wrapped module is not on a copy of the module's running
    /// states (batch-norm statistics) of its own, for models with such states on several
    /// GPUs.
    ///
    /// Without it, every replica reads the module's one set of statistics, and a replica on
    /// another GPU moves them there inside its forward (Burn's batch norm calls `to_device`),
    /// on its worker thread, where this crate cannot order the transfer after the work queued
    /// on that GPU; on CUDA that can corrupt memory, so the forward refuses with
    /// [`DataParallelError::SharedRunningStates`]. With it, each step moves the statistics to
    /// the other devices with the parameters, each device's replicas update their own copy,
    /// and after the forward the copies come home and fold into the module's statistics: the
    /// mean over all replicas' updates, the value they get when all share one set.
    ///
    /// Costs per step: one small transfer each way per device, and a few element-wise kernels
    /// per running state. Nothing changes for replicas on the module's device, or for models
    /// without running states. burn-train's `TrainStep` and `InferenceStep`,
    /// [`warm_up`](Self::warm_up) and `valid()` copies use it always.
    ///
    /// # Example
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::{BatchNorm, BatchNormConfig};
    /// use burn::tensor::Tensor;
    /// use burn_dataparallel::DataParallel;
    ///
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let norm: BatchNorm<B> = BatchNormConfig::new(4).init(&device);
    /// // On a GPU machine: the list of GPUs.
    /// let dp = DataParallel::new(norm, vec![device; 2])
    ///     .unwrap()
    ///     .with_running_states_per_device();
    /// let output = dp.forward_with(Tensor::<B, 2>::ones([6, 4], &device), |m, x| m.forward(x));
    /// assert_eq!(output.dims(), [6, 4]);
    /// ```
    pub fn with_running_states_per_device(self) -> Self {
        Self {
            own_states: Some(own_states::<B, M>),
            ..self
        }
    }
}

/// A copy of `module` with running states of its own ([`OwnStates`]).
pub(crate) fn own_states<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> M {
    M::from_inner(module.valid())
}

/// A copy of an inference `module` with running states of its own ([`OwnStates`]).
pub(crate) fn own_inner_states<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M::InnerModule,
) -> M::InnerModule {
    M::from_inner(module.clone()).valid()
}

/// Initialises `module`'s lazy parameters and forks it to `device` unless it is all there.
fn on_device<B: Backend, M: Module<B>>(
    module: M,
    device: &B::Device,
    relocate: Option<MoveModule<M, B::Device>>,
) -> M {
    initialize(&module);
    match (module.devices().as_slice(), relocate) {
        ([], _) => module,
        ([only], _) if only == device => module,
        (_, Some(relocate)) => relocate(module, device, true),
        (_, None) => module.fork(device),
    }
}
