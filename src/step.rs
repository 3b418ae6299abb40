//! The forward of a [`DataParallel`]: scatter, replicate, apply in parallel, gather.
//!
//! ```text
//! shards   = scatter(input, devices, dim)     // scatter/: split the batch, move each shard
//! replicas = replicate(module, shard devices) // replicate/: differentiable copies
//! outputs  = parallel_apply(replicas, shards) // parallel_apply.rs: one lane per device
//! gather(outputs, output_device, dim)         // gather.rs: differentiable concatenation
//! ```
//!
//! Running states (`running_states/`) and the profile (`profile.rs`) are the step's
//! collaborators; the per-replica backward that the parallel backward sets up here lives in
//! `backend/replica_graphs/`. How a batch is sized into shards is [`shards`] here.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::backend::Backend;

use crate::backend::{ConcatBackend, ReplicaSetup};
use crate::config::Settings;
use crate::error::{BoxError, DataParallelError};
use crate::gather::Gather;
use crate::parallel_apply::{self, Failure, Runtime, Workers};
use crate::profile::{self, Sink, Stage};
use crate::replicate::replicate_for_step;
use crate::running_states::{self, OwnStates, RunningStates};
use crate::scatter::{self, Scatter};
use crate::shards::Shards;
use crate::ties::{Backward, Ties};

/// Runs `forward` on every shard of `input` through `dp` and gathers the outputs, on the exact
/// path ([`Backward::CallerOneGraph`]) where `forward` may capture tracked tensors or the
/// input holds values the scatter cannot see into.
pub(crate) fn forward<B, M, I, O, E, F>(
    module: &M,
    settings: &Settings<B::Device>,
    input: I,
    forward: F,
    own_states: Option<OwnStates<M>>,
    captures: bool,
) -> Result<O, DataParallelError>
where
    B: ConcatBackend,
    M: Module<B>,
    I: Scatter<B> + Send,
    O: Gather<B> + Send,
    E: Into<BoxError>,
    F: Fn(&M, I) -> Result<O, E> + Sync,
{
    let backward = match captures || !input.scatters_every_tensor() {
        true => Backward::CallerOneGraph,
        false => Backward::Caller,
    };
    let shards = shards(settings, &input)?;
    if captures && !parallel_apply::in_replica() {
        let devices = shards.devices();
        if devices
            .iter()
            .any(|device| *device != settings.output_device)
        {
            return Err(DataParallelError::CapturesAcrossDevices {
                devices: format!("{devices:?}"),
            });
        }
    }
    let mut step = Step::new(settings, shards, backward)?;
    let timed = |step: &Step<B>, replica: &M, (shard, input): (usize, I)| {
        step.replica(shard, || forward(replica, input).map_err(Into::into))
    };
    if step.direct(settings) {
        return step.run_module(module, input, |m, input| timed(&step, m, input));
    }
    let inputs = step.stage(Stage::Scatter, || input.scatter(&step.shards));
    step.weigh(&inputs)?;
    let (replicas, states) = step.stage(Stage::Replicate, || {
        step.replicate(module, settings, own_states)
    })?;
    let results = step.apply(replicas, inputs, &|m: &M, input| timed(&step, m, input));
    step.stage(Stage::RunningStates, || {
        states.finish(module, &settings.output_device, &step.distinct)
    });
    let outputs = step.outputs(results)?;
    let gathered = step.stage(Stage::Gather, || O::gather(outputs, &step.shards))?;
    step.seal()?;
    Ok(gathered)
}

/// How `input` would be split over the devices of `settings` ([`DataParallel::shards`]).
///
/// # Errors
///
/// [`DataParallelError::NothingToScatter`] when `input` holds no tensor to split along the
/// settings' `dim`, [`DataParallelError::EmptyBatch`] when its batch is empty, and the
/// errors of [`Scatter::batch_size`] (tensors that disagree on the batch size).
///
/// [`DataParallel::shards`]: crate::DataParallel::shards
pub(crate) fn shards<B: Backend, I: Scatter<B>>(
    settings: &Settings<B::Device>,
    input: &I,
) -> Result<Shards<B>, DataParallelError> {
    let dim = settings.dim;
    match input.batch_size(dim)? {
        None => Err(DataParallelError::NothingToScatter { dim }),
        Some(0) => Err(DataParallelError::EmptyBatch { dim }),
        Some(batch_size) => Ok(Shards::new(
            batch_size,
            &settings.devices,
            settings.shard_weights.as_deref(),
            dim,
            settings.output_device.clone(),
        )
        .with_loss_reduction(settings.loss_reduction)),
    }
}

/// One step's shards (with their ties to the caller's graph), devices and profile.
pub(crate) struct Step<B: ConcatBackend> {
    pub(crate) shards: Shards<B>,
    /// Each device once: the output device, then the replicas' devices.
    pub(crate) distinct: Vec<B::Device>,
    pub(crate) sink: Option<Arc<Sink>>,
    workers: Option<Arc<Workers>>,
    /// Whether the replicas' forwards run one at a time ([`Backward::CallerOneGraph`] under
    /// autodiff): a forward that reaches a tracked tensor of another graph makes Burn merge
    /// the graphs, and Burn 0.21's graph locator loses nodes that another thread registers
    /// during a merge.
    one_at_a_time: bool,
}

impl<B: ConcatBackend> Step<B> {
    /// The step of `dp` over `shards`, followed by `backward`: under the caller's backward,
    /// per-replica graphs for the parallel backward where the backend and the settings allow
    /// (see `ties.rs`).
    ///
    /// # Errors
    ///
    /// [`DataParallelError::DeviceTransfersUnsupported`] for distinct devices on a backend
    /// that cannot move tensors between them.
    pub(crate) fn new(
        settings: &Settings<B::Device>,
        shards: Shards<B>,
        backward: Backward,
    ) -> Result<Self, DataParallelError> {
        let output_device = &settings.output_device;
        if !B::device_transfers() && shards.devices().iter().any(|d| d != output_device) {
            return Err(DataParallelError::DeviceTransfersUnsupported {
                devices: format!("{:?}", settings.devices),
            });
        }
        let mut distinct = vec![output_device.clone()];
        for device in shards.devices() {
            if !distinct.contains(device) {
                distinct.push(device.clone());
            }
        }
        let sink = settings.profiler.start(shards.len());
        let workers = settings.workers.clone();
        let graphs = match &workers {
            Some(workers)
                if backward == Backward::Caller
                    && settings.parallel_backward
                    && shards.len() > 1 =>
            {
                let runtime = Runtime {
                    workers: workers.clone(),
                    sink: sink.clone(),
                };
                B::replica_graphs(ReplicaSetup {
                    replicas: (shards.replicas().iter().copied())
                        .zip(shards.devices().iter().cloned())
                        .collect(),
                    runtime: Arc::new(runtime),
                    reduce_bucket_size: settings.overlap_reduce.then_some(settings.bucket_size),
                    backward_timeout: settings.backward_timeout,
                })
            }
            _ => None,
        };
        let ties = Ties::new(backward, shards.len(), graphs);
        let one_at_a_time =
            backward == Backward::CallerOneGraph && B::ad_enabled(&settings.output_device);
        Ok(Self {
            shards: shards.with_ties(ties),
            distinct,
            sink,
            workers,
            one_at_a_time,
        })
    }

    /// Takes the loss weights that `parts` (this step's scattered input) state, if they state
    /// any, as the shards' [`loss_shares`](Shards::loss_shares).
    ///
    /// # Errors
    ///
    /// Those of [`scatter::stated_shares`].
    pub(crate) fn weigh<I: Scatter<B>>(&mut self, parts: &[I]) -> Result<(), DataParallelError> {
        if let Some(shares) = scatter::stated_shares(parts)? {
            self.shards.set_loss_shares(shares);
        }
        Ok(())
    }

    /// Whether the module runs as it is, on the calling thread: one shard on the module's
    /// own device, or a wrapper inside another wrapper's replica, whose input that replica
    /// already holds.
    pub(crate) fn direct(&self, settings: &Settings<B::Device>) -> bool {
        let devices = self.shards.devices();
        parallel_apply::in_replica() || (devices.len() == 1 && devices[0] == settings.output_device)
    }

    /// Runs the module itself on the whole input, as the bare model would.
    pub(crate) fn run_module<M, I, O, F>(
        &self,
        module: &M,
        input: I,
        forward: F,
    ) -> Result<O, DataParallelError>
    where
        M: Module<B>,
        F: Fn(&M, (usize, I)) -> Result<O, BoxError>,
    {
        let result = parallel_apply::run(module, (0, input), &forward);
        if self.workers.is_some() && !parallel_apply::in_replica() {
            // A later forward over several shards reads the statistics on worker threads.
            self.stage(Stage::RunningStates, || running_states::sync(module));
        }
        result.map_err(|failure| self.error(0, failure))
    }

    /// The devices a profiled stage synchronises; none when profiling is off.
    fn involved(&self) -> &[B::Device] {
        match self.sink {
            Some(_) => &self.distinct,
            None => &[],
        }
    }

    /// Runs `f` as `stage` of the profile.
    pub(crate) fn stage<T>(&self, stage: Stage, f: impl FnOnce() -> T) -> T {
        profile::stage::<B, _>(self.sink.as_ref(), stage, self.involved(), f)
    }

    /// Runs replica `shard`'s forward `f`, timed in the profile.
    pub(crate) fn replica<T>(&self, shard: usize, f: impl FnOnce() -> T) -> T {
        let device = &self.shards.devices()[shard];
        profile::replica::<B, _>(self.sink.as_ref(), shard, device, f)
    }

    /// The replicas of the step, with their running states planned.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::SharedRunningStates`] where a replica on another device would
    /// move the module's running states inside its forward on a backend that does not order
    /// such a transfer.
    pub(crate) fn replicate<M: Module<B>>(
        &self,
        module: &M,
        settings: &Settings<B::Device>,
        own_states: Option<OwnStates<M>>,
    ) -> Result<(Vec<M>, RunningStates<B, M>), DataParallelError> {
        let (replicas, states) = replicate_for_step(
            module,
            self.shards.devices(),
            settings.bucket_size,
            own_states,
            self.shards.ties(),
        );
        if states.shared_elsewhere && !B::orders_receives() {
            return Err(DataParallelError::SharedRunningStates {
                devices: format!("{:?}", settings.devices),
            });
        }
        Ok((replicas, states))
    }

    /// Runs `forward` on every replica with its input, each on its slot's lane (one at a
    /// time on the exact path).
    pub(crate) fn apply<M, I, O, F>(
        &self,
        replicas: Vec<M>,
        inputs: Vec<I>,
        forward: &F,
    ) -> Vec<Result<O, Failure>>
    where
        M: Send,
        I: Send,
        O: Send,
        F: Fn(&M, (usize, I)) -> Result<O, BoxError> + Sync,
    {
        if let Some(graphs) = self.shards.ties().graphs() {
            graphs.begin_forward();
        }
        if !self.one_at_a_time {
            return self.run_replicas(replicas, inputs, forward);
        }
        let turn = std::sync::Mutex::new(());
        let one_at_a_time = |m: &M, input: (usize, I)| {
            let _turn = turn.lock().unwrap_or_else(|e| e.into_inner());
            forward(m, input)
        };
        self.run_replicas(replicas, inputs, &one_at_a_time)
    }

    /// Runs `forward` on every replica with its input, on the lanes where there are.
    fn run_replicas<M, I, O, F>(
        &self,
        replicas: Vec<M>,
        inputs: Vec<I>,
        forward: &F,
    ) -> Vec<Result<O, Failure>>
    where
        M: Send,
        I: Send,
        O: Send,
        F: Fn(&M, (usize, I)) -> Result<O, BoxError> + Sync,
    {
        let inputs = inputs.into_iter().enumerate();
        match &self.workers {
            Some(workers) => {
                let slots = self.shards.replicas().iter().copied();
                let jobs = slots.zip(replicas).zip(inputs);
                let jobs = jobs.map(|((slot, replica), input)| (slot, replica, input));
                workers.apply(jobs.collect(), forward)
            }
            None => (replicas.iter().zip(inputs))
                .map(|(replica, input)| parallel_apply::run(replica, input, forward))
                .collect(),
        }
    }

    /// The replicas' outputs, or the first replica's failure.
    pub(crate) fn outputs<O>(
        &self,
        results: Vec<Result<O, Failure>>,
    ) -> Result<Vec<O>, DataParallelError> {
        results
            .into_iter()
            .enumerate()
            .map(|(shard, result)| result.map_err(|failure| self.error(shard, failure)))
            .collect()
    }

    /// The typed error of shard `shard`'s failure.
    fn error(&self, shard: usize, failure: Failure) -> DataParallelError {
        let device = format!("{:?}", self.shards.devices()[shard]);
        failure.into_error(self.shards.replicas()[shard], device)
    }

    /// Releases what only the forward needed.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::CapturedTensor`] when a replica's outputs use a tracked tensor
    /// that it did not receive through its input.
    fn seal(&self) -> Result<(), DataParallelError> {
        let Some(graphs) = self.shards.ties().graphs() else {
            return Ok(());
        };
        graphs
            .seal()
            .map_err(|shard| DataParallelError::CapturedTensor {
                replica: self.shards.replicas()[shard],
                device: format!("{:?}", self.shards.devices()[shard]),
            })
    }
}

impl<B: ConcatBackend> Drop for Step<B> {
    fn drop(&mut self) {
        if let Some(graphs) = self.shards.ties().graphs() {
            let _ = graphs.seal();
        }
    }
}
