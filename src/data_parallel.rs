//! The [`DataParallel`] wrapper and its forward.

use std::sync::Arc;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::kernels::{ConcatBackend, ReplicaSetup};
use crate::parallel_apply::{Workers, run};
use crate::profile::{self, Profiler, Stage};
use crate::replicate::{OwnStates, bring_states_home, initialize, replicate_for_forward};
use crate::{
    BoxError, DataParallelConfig, DataParallelError, Gather, Scatter, Shards, StepProfile,
};

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
/// of several devices on one, for tests. It is not faster than one replica: on CubeCL
/// backends every thread's kernel launches for a device run on that device's one server
/// thread, so replicas sharing a GPU queue their launches behind each other (two replicas on
/// one H200 cost 1.2–1.9x the bare step, see the crate's benchmark results).
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
    pub(crate) devices: Vec<B::Device>,
    pub(crate) output_device: B::Device,
    pub(crate) dim: usize,
    pub(crate) shard_weights: Option<Vec<f64>>,
    pub(crate) workers: Option<Arc<Workers>>,
    pub(crate) bucket_size: usize,
    pub(crate) profiler: Arc<Profiler>,
    /// Gives replicas on other devices running states of their own (see
    /// [`with_running_states_per_device`](Self::with_running_states_per_device)).
    pub(crate) own_states: Option<OwnStates<M>>,
    /// Tests on one device: every replica after the first gets its own running states.
    pub(crate) states_per_replica: bool,
    /// Whether each replica's backward runs on its own worker thread (under autodiff).
    pub(crate) parallel_backward: bool,
}

/// A module that [`DataParallel::forward`] can run: one input type to split, one output type
/// to gather.
///
/// # Example
///
/// ```
/// use burn::nn::Linear;
/// use burn::tensor::{Tensor, backend::Backend};
/// use burn_dataparallel::{ConcatBackend, Forward};
///
/// #[derive(burn::module::Module, Debug)]
/// struct Classifier<B: Backend> {
///     linear: Linear<B>,
/// }
///
/// // `ConcatBackend`: a backend with this crate's concat/split kernels (every Burn backend
/// // but Candle, LibTorch and the router has them).
/// impl<B: ConcatBackend> Forward<B> for Classifier<B> {
///     type Input = Tensor<B, 2>;
///     type Output = Tensor<B, 2>;
///
///     fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
///         self.linear.forward(input)
///     }
/// }
/// ```
pub trait Forward<B: Backend> {
    /// What the forward takes; split into one shard per replica.
    type Input: Scatter<B> + Send;
    /// What the forward returns; gathered from all replicas.
    type Output: Gather<B> + Send;

    /// Runs the module on one shard.
    fn forward(&self, input: Self::Input) -> Self::Output;
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
    /// [`DataParallelError::WorkerSpawn`] when the worker threads cannot be started.
    pub fn new(module: M, devices: Vec<B::Device>) -> Result<Self, DataParallelError> {
        DataParallelConfig::new().init(module, devices)
    }

    /// Validates the settings, prepares the module and starts the workers.
    pub(crate) fn build(
        module: M,
        devices: Vec<B::Device>,
        output_index: usize,
        dim: usize,
        shard_weights: Option<Vec<f64>>,
        bucket_size: usize,
    ) -> Result<Self, DataParallelError> {
        if devices.is_empty() {
            return Err(DataParallelError::NoDevices);
        }
        let output_device =
            devices
                .get(output_index)
                .cloned()
                .ok_or(DataParallelError::OutputDeviceIndex {
                    index: output_index,
                    len: devices.len(),
                })?;
        if let Some(weights) = &shard_weights {
            crate::shards::check_weights(weights, devices.len())?;
        }
        let workers = match devices.len() {
            1 => None,
            slots => Some(Arc::new(Workers::new(slots)?)),
        };
        Ok(Self {
            module: on_device(module, &output_device),
            devices,
            output_device,
            dim,
            shard_weights,
            workers,
            bucket_size,
            profiler: Arc::default(),
            own_states: None,
            states_per_replica: false,
            parallel_backward: true,
        })
    }

    /// Gathers outputs on `device`, which must be one of the devices; the wrapped module moves
    /// there too.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::OutputDeviceNotListed`] when `device` is not in the device list.
    pub fn with_output_device(self, device: B::Device) -> Result<Self, DataParallelError> {
        if !self.devices.contains(&device) {
            return Err(DataParallelError::OutputDeviceNotListed {
                device: format!("{device:?}"),
                devices: format!("{:?}", self.devices),
            });
        }
        Ok(Self {
            module: on_device(self.module, &device),
            output_device: device,
            ..self
        })
    }

    /// The wrapped module, which holds the parameters.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// Unwraps the module, for saving, inference or further training without the wrapper.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The devices the replicas run on, one entry per replica.
    pub fn replica_devices(&self) -> &[B::Device] {
        &self.devices
    }

    /// The device where outputs are gathered and the parameters live.
    pub fn output_device(&self) -> &B::Device {
        &self.output_device
    }

    /// The dimension inputs are split along and outputs concatenated along.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The relative share of the batch given to each device, if set.
    pub fn shard_weights(&self) -> Option<&[f64]> {
        self.shard_weights.as_deref()
    }

    /// Whether each replica's backward is to run on its own worker thread under autodiff
    /// ([`DataParallelConfig::parallel_backward`]; backends without
    /// [`ConcatBackend::concurrent_backward`] run it on the calling thread regardless).
    pub fn parallel_backward(&self) -> bool {
        self.parallel_backward
    }

    /// The largest coalesced parameter transfer to a replica on another device, in bytes.
    pub fn bucket_size(&self) -> usize {
        self.bucket_size
    }

    /// Turns the per-step [`StepProfile`] on or off (off by default; shared with clones of the
    /// wrapper and with its `valid()` copy).
    ///
    /// While on, each stage ends by synchronising the devices it used, so that its time is
    /// the device's: steps run slower and the stages no longer overlap. While off, a forward
    /// pays one atomic load.
    pub fn set_profiling(&self, enabled: bool) {
        self.profiler.set_enabled(enabled);
    }

    /// Whether steps are being profiled.
    pub fn is_profiling(&self) -> bool {
        self.profiler.is_enabled()
    }

    /// The profile of the last forward taken while profiling was on, including the gradient
    /// transfers of its backward once that has run; `None` before the first such forward.
    pub fn profile(&self) -> Option<StepProfile> {
        self.profiler.last()
    }

    /// How `input` would be split: one entry per replica that receives items.
    ///
    /// # Errors
    ///
    /// Those of [`Scatter::batch_size`], [`DataParallelError::NothingToScatter`] when `input`
    /// holds no tensor, and [`DataParallelError::EmptyBatch`] when its batch is empty.
    pub fn shards<I: Scatter<B>>(&self, input: &I) -> Result<Shards<B>, DataParallelError> {
        let dim = self.dim;
        match input.batch_size(dim)? {
            None => Err(DataParallelError::NothingToScatter { dim }),
            Some(0) => Err(DataParallelError::EmptyBatch { dim }),
            Some(batch_size) => Ok(Shards::new(
                batch_size,
                &self.devices,
                self.shard_weights.as_deref(),
                dim,
                self.output_device.clone(),
            )),
        }
    }

    /// Runs the wrapped module's [`Forward`] on every shard of `input` and gathers the outputs.
    ///
    /// A drop-in for the bare model's forward in a training loop; use
    /// [`try_forward`](Self::try_forward) to handle failures as values.
    ///
    /// # Shapes
    ///
    /// Those of `M::forward`, with the batch dimension [`dim`](Self::dim) of the input split
    /// and that of the output concatenated.
    ///
    /// # Panics
    ///
    /// With the [`DataParallelError`]'s message where [`try_forward`](Self::try_forward)
    /// returns it, and as the bare model's forward would on misuse.
    pub fn forward(&self, input: M::Input) -> M::Output
    where
        B: ConcatBackend,
        M: Forward<B>,
    {
        self.try_forward(input)
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Like [`forward`](Self::forward), returning failures as values.
    ///
    /// # Errors
    ///
    /// Those of [`try_forward_with`](Self::try_forward_with).
    pub fn try_forward(&self, input: M::Input) -> Result<M::Output, DataParallelError>
    where
        B: ConcatBackend,
        M: Forward<B>,
    {
        self.try_forward_with(input, |replica, shard| {
            Ok::<_, std::convert::Infallible>(Forward::forward(replica, shard))
        })
    }

    /// Runs `forward(replica, shard)` for every shard of `input` and gathers the outputs.
    ///
    /// A single shard runs on the calling thread; several run at the same time, each on its
    /// device's worker thread. Return [`Mean`](crate::Mean) or [`Sum`](crate::Sum) around a
    /// per-replica loss to combine it over the whole batch.
    ///
    /// # Shapes
    ///
    /// Those of `forward`, with the batch dimension [`dim`](Self::dim) of the input split and
    /// that of the output concatenated.
    ///
    /// # Panics
    ///
    /// With the [`DataParallelError`]'s message where
    /// [`try_forward_with`](Self::try_forward_with) returns it.
    pub fn forward_with<I, O, F>(&self, input: I, forward: F) -> O
    where
        B: ConcatBackend,
        I: Scatter<B> + Send,
        O: Gather<B> + Send,
        F: Fn(&M, I) -> O + Sync,
    {
        self.try_forward_with(input, |replica, shard| {
            Ok::<_, std::convert::Infallible>(forward(replica, shard))
        })
        .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Runs a forward that can fail, `forward(replica, shard)`, for every shard of `input` and
    /// gathers the outputs; failures come back as values.
    ///
    /// For a forward that cannot fail, return `Ok::<_, Infallible>(output)`.
    ///
    /// # Shapes
    ///
    /// Those of `forward`, with the batch dimension [`dim`](Self::dim) of the input split and
    /// that of the output concatenated.
    ///
    /// # Errors
    ///
    /// Those of [`shards`](Self::shards) for a bad input;
    /// [`DataParallelError::DeviceTransfersUnsupported`] for distinct devices on a backend that
    /// cannot move tensors between them;
    /// [`DataParallelError::ReplicaPanicked`] when a replica panics and
    /// [`DataParallelError::ReplicaFailed`] when one returns an error (the first replica that
    /// failed, by position); those of [`Gather::gather`] when the outputs disagree. The wrapper
    /// stays usable after an error.
    pub fn try_forward_with<I, O, E, F>(&self, input: I, forward: F) -> Result<O, DataParallelError>
    where
        B: ConcatBackend,
        I: Scatter<B> + Send,
        O: Gather<B> + Send,
        E: Into<BoxError>,
        F: Fn(&M, I) -> Result<O, E> + Sync,
    {
        self.run(input, forward, self.own_states)
    }

    /// [`try_forward_with`](Self::try_forward_with), replicas on other devices getting
    /// running states of their own from `own_states` where it is given.
    pub(crate) fn run<I, O, E, F>(
        &self,
        input: I,
        forward: F,
        own_states: Option<OwnStates<M>>,
    ) -> Result<O, DataParallelError>
    where
        B: ConcatBackend,
        I: Scatter<B> + Send,
        O: Gather<B> + Send,
        E: Into<BoxError>,
        F: Fn(&M, I) -> Result<O, E> + Sync,
    {
        let shards = self.shards(&input)?;
        if !B::device_transfers() && shards.devices().iter().any(|d| *d != self.output_device) {
            return Err(DataParallelError::DeviceTransfersUnsupported {
                devices: format!("{:?}", self.devices),
            });
        }
        let sink = self.profiler.start(shards.len());
        let sink = sink.as_ref();
        let graphs = match &self.workers {
            Some(workers) if shards.len() > 1 && self.parallel_backward => {
                let workers = workers.clone();
                B::replica_graphs(ReplicaSetup {
                    replicas: (shards.replicas().iter().copied())
                        .zip(shards.devices().iter().cloned())
                        .collect(),
                    spawner: Arc::new(move |jobs| workers.spawn_each(jobs)),
                    sink: sink.cloned(),
                })
            }
            _ => None,
        };
        let shards = shards.with_graphs(graphs.clone());
        let devices = shards.devices();
        // Each device once: the output device and the replicas' devices.
        let mut distinct = vec![self.output_device.clone()];
        for device in devices {
            if !distinct.contains(device) {
                distinct.push(device.clone());
            }
        }
        // The devices a profiled stage synchronises; none are needed when profiling is off.
        let involved: &[B::Device] = match sink {
            Some(_) => &distinct,
            None => &[],
        };
        let forward = |replica: &M, (shard, input): (usize, I)| {
            profile::replica::<B, _>(sink, shard, &devices[shard], || {
                forward(replica, input).map_err(Into::into)
            })
        };
        let inputs =
            profile::stage::<B, _>(sink, Stage::Scatter, involved, || input.scatter(&shards));
        if shards.len() == 1 && devices[0] == self.output_device {
            // One replica on the module's own device: the module itself runs on the calling
            // thread, as the bare model would; nothing to copy, tap or fold.
            let input = inputs.into_iter().next().expect("one shard, one input");
            let result = run(&self.module, (0, input), &forward);
            if self.workers.is_some() {
                // A later forward over several shards reads the statistics on worker threads.
                profile::stage::<B, _>(sink, Stage::RunningStates, involved, || {
                    self.sync_running_states()
                });
            }
            let output = result.map_err(|failure| {
                failure.into_error(shards.replicas()[0], format!("{:?}", devices[0]))
            })?;
            return profile::stage::<B, _>(sink, Stage::Gather, involved, || {
                O::gather(vec![output], &shards)
            });
        }
        let inputs = inputs.into_iter().enumerate();
        let mut replicated = profile::stage::<B, _>(sink, Stage::Replicate, involved, || {
            replicate_for_forward(
                &self.module,
                devices,
                self.bucket_size,
                own_states,
                self.states_per_replica,
                graphs.as_deref(),
            )
        });
        if replicated.shared_elsewhere && !B::orders_receives() {
            return Err(DataParallelError::SharedRunningStates {
                devices: format!("{:?}", self.devices),
            });
        }
        let replicas = std::mem::take(&mut replicated.replicas);
        let results = match &self.workers {
            Some(workers) if shards.len() > 1 => {
                let jobs = shards.replicas().iter().copied().zip(replicas).zip(inputs);
                let jobs = jobs.map(|((slot, replica), input)| (slot, replica, input));
                workers.apply(jobs.collect(), &forward)
            }
            _ => replicas
                .iter()
                .zip(inputs)
                .map(|(replica, input)| run(replica, input, &forward))
                .collect(),
        };
        let spans_devices = distinct.len() > 1;
        profile::stage::<B, _>(sink, Stage::RunningStates, involved, || {
            if spans_devices {
                // The synchronisation below may move statistics between devices (Burn's
                // `to_device`).
                for device in &distinct {
                    B::fence_receive(device);
                }
            }
            self.sync_running_states();
            replicated.fold(&self.module, &self.output_device);
            if spans_devices {
                bring_states_home(&self.module, &self.output_device);
                // Burn moves the statistics between devices with its own `to_device`, unfenced.
                for device in &distinct {
                    B::fence_transfers(device);
                }
            }
        });
        let outputs = results
            .into_iter()
            .enumerate()
            .map(|(i, result)| {
                result.map_err(|failure| {
                    let device = format!("{:?}", devices[i]);
                    failure.into_error(shards.replicas()[i], device)
                })
            })
            .collect::<Result<Vec<O>, _>>();
        let outputs = match outputs {
            Ok(outputs) => outputs,
            Err(error) => {
                if let Some(graphs) = graphs {
                    graphs.seal();
                }
                return Err(error);
            }
        };
        let gathered = profile::stage::<B, _>(sink, Stage::Gather, involved, || {
            O::gather(outputs, &shards)
        });
        if let Some(graphs) = graphs {
            graphs.seal();
        }
        gathered
    }

    /// Folds the replicas' pending running-state updates (batch-norm statistics) into the
    /// shared value, so that every forward ends with synchronised statistics.
    ///
    /// `RunningState` keeps one pending value per thread and only averages them when a thread
    /// that holds one reads it again; a replica whose thread held none would otherwise read a
    /// stale value. Turning the module into its record runs that synchronisation.
    fn sync_running_states(&self) {
        let _ = self.module.clone().into_record();
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
    /// without running states. `valid()` copies and burn-train's `TrainStep` use it always.
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
fn on_device<B: Backend, M: Module<B>>(module: M, device: &B::Device) -> M {
    initialize(&module);
    match module.devices().as_slice() {
        [] => module,
        [only] if only == device => module,
        _ => module.fork(device),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
    use burn::tensor::{Distribution, Tensor};

    type B = Autodiff<Flex>;

    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        linear: Linear<B>,
        norm: BatchNorm<B>,
        frozen: burn::module::Param<Tensor<B, 1>>,
    }

    impl<B: Backend> Net<B> {
        fn new(device: &B::Device) -> Self {
            let frozen = Tensor::random([6], Distribution::Uniform(-1.0, 1.0), device);
            Self {
                linear: LinearConfig::new(5, 6).init(device),
                norm: BatchNormConfig::new(6).init(device),
                frozen: burn::module::Param::from_tensor(frozen).set_require_grad(false),
            }
        }

        fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
            self.norm.forward(self.linear.forward(x)) * self.frozen.val().unsqueeze()
        }

        /// An independent copy: same values, running states of its own.
        fn copy(&self) -> Self
        where
            B: AutodiffBackend,
        {
            Self::from_inner(self.valid())
        }
    }

    fn floats<const D: usize>(tensor: Tensor<impl Backend, D>) -> Vec<f32> {
        tensor.into_data().convert::<f32>().to_vec().unwrap()
    }

    fn assert_close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{what}[{i}]: {x} vs {y}"
            );
        }
    }

    fn states(net: &Net<impl Backend>) -> (Vec<f32>, Vec<f32>) {
        (
            floats(net.norm.running_mean.value()),
            floats(net.norm.running_var.value()),
        )
    }

    /// Replicas with running states of their own give the outputs, gradients, statistics and
    /// inference outputs of replicas that share the module's, step after step, with every
    /// replica after the first on its own set (as on other devices), including a step with
    /// fewer shards than devices. The frozen parameter comes back untouched.
    #[test]
    fn own_running_states_match_shared_ones() {
        let device = Default::default();
        let net = Net::<B>::new(&device);
        let frozen = floats(net.frozen.val());
        let shared = DataParallel::new(net.copy(), vec![device; 3]).unwrap();
        let mut own = DataParallel::new(net, vec![device; 3])
            .unwrap()
            .with_running_states_per_device();
        own.states_per_replica = true;
        own.set_profiling(true);
        for batch in [7, 2, 9] {
            let x = Tensor::<B, 2>::random([batch, 5], Distribution::Default, &device);
            let outputs: Vec<_> = [&shared, &own]
                .iter()
                .map(|dp| dp.forward_with(x.clone(), |m, x| m.forward(x)))
                .collect();
            let profile = own.profile().expect("a profiled step");
            assert_eq!(
                profile.bytes_running_states, 0,
                "own sets on the module's device move nothing"
            );
            assert_close(
                &floats(outputs[1].clone()),
                &floats(outputs[0].clone()),
                "output",
            );
            let probe = Tensor::<B, 1, burn::tensor::Int>::arange(0..(batch * 6) as i64, &device)
                .float()
                .reshape([batch, 6])
                .cos();
            let grads: Vec<_> = outputs
                .iter()
                .map(|o| (o.clone() * probe.clone()).sum().backward())
                .collect();
            let weight = |dp: &DataParallel<B, Net<B>>, g| {
                floats(dp.module().linear.weight.val().grad(g).unwrap())
            };
            assert_close(
                &weight(&own, &grads[1]),
                &weight(&shared, &grads[0]),
                "grad",
            );
            let (want, got) = (states(shared.module()), states(own.module()));
            assert_close(&got.0, &want.0, &format!("running mean after {batch}"));
            assert_close(&got.1, &want.1, &format!("running var after {batch}"));
            assert_eq!(
                floats(own.module().frozen.val()),
                frozen,
                "frozen parameter"
            );
        }
        let x = Tensor::<Flex, 2>::random([8, 5], Distribution::Default, &device);
        let want = shared.valid().forward_with(x.clone(), |m, x| m.forward(x));
        let mut inference = own.valid();
        inference.states_per_replica = true;
        let before = states(inference.module());
        let got = inference.forward_with(x, |m, x| m.forward(x));
        assert_close(&floats(got), &floats(want), "inference output");
        assert_eq!(
            states(inference.module()),
            before,
            "inference keeps statistics exactly"
        );
    }
}
