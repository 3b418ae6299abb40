//! A step of a [`DataParallel`](crate::DataParallel): scatter, replicate, apply in parallel,
//! then gather the outputs (a forward) or combine the gradients of the replicas' own training
//! steps (burn-train's `Learner`, `train/`).
//!
//! ```text
//! shards   = scatter(input, devices, dim)     // scatter/: split the batch, move each shard
//! replicas = replicate(module, shard devices) // replicate/: copies of the parameters
//! outputs  = parallel_apply(replicas, shards) // parallel_apply.rs: one lane per device
//! gather(outputs, output_device, dim)         // gather.rs: differentiable concatenation
//! ```
//!
//! [`apply`] runs the stages every path shares; [`forward`] gathers after it. Running states
//! (`running_states/`) and the profile (`profile.rs`) are the step's collaborators; how the
//! replicas are tied to the caller's autodiff graph is decided once per step, in
//! `backward/ties.rs`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::Backend;

use crate::backend::{ConcatBackend, ReplicaSetup};
use crate::backward::ties::{self, Path, Ties};
use crate::balance::{self, Measured};
use crate::config::Settings;
use crate::error::{BoxError, DataParallelError};
use crate::gather::Gather;
use crate::parallel_apply::{self, Failure, Runtime, Workers};
use crate::profile::{self, Sink, Stage};
use crate::replicate::replicate_for_step;
use crate::running_states::{self, OwnStates, RunningStates};
use crate::scatter::{self, Scatter};
use crate::shards::{Shards, shard_sizes};

/// Runs `forward` on every shard of `input` and gathers the outputs; on the exact path
/// ([`Path::Exact`]) where `forward` may capture tracked tensors or the input holds values
/// the scatter cannot see into.
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
    if captures && !parallel_apply::in_replica() {
        // What the closure captures stays on its device (`CapturesAcrossDevices`).
        let devices = shards(settings, &input)?.devices().to_vec();
        if devices.iter().any(|d| *d != settings.output_device) {
            let devices = format!("{devices:?}");
            return Err(DataParallelError::CapturesAcrossDevices { devices });
        }
    }
    let path = match captures || !input.scatters_every_tensor() {
        true => Path::Exact,
        false => Path::Fast,
    };
    let forward = |m: &M, input| forward(m, input).map_err(Into::into);
    match apply(module, settings, input, path, own_states, forward)? {
        Applied::Direct(output) => Ok(output),
        Applied::Replicas(step, outputs) => {
            let gathered = step.stage(Stage::Gather, || {
                step.tied(|| O::gather(outputs, &step.shards))
            })?;
            step.seal()?;
            Ok(gathered)
        }
    }
}

/// What [`apply`] gives back.
pub(crate) enum Applied<B: ConcatBackend, R> {
    /// The module's own result: one shard on its device, or a wrapper inside a replica.
    Direct(R),
    /// Each replica's result, in shard order, and the step, for the stage that follows.
    Replicas(Box<Step<B>>, Vec<R>),
}

/// The stages every step shares: scatter `input`, replicate `module`, run `f` on every
/// replica with its shard (each on its lane), and fold the replicas' running states.
///
/// # Errors
///
/// Those of [`shards`] and [`Step::new`]; those of the loss weights the parts state
/// ([`scatter::stated_shares`]) and of [`Step::replicate`]; the first replica's failure.
pub(crate) fn apply<B, M, I, R, F>(
    module: &M,
    settings: &Settings<B::Device>,
    input: I,
    path: Path,
    own_states: Option<OwnStates<M>>,
    f: F,
) -> Result<Applied<B, R>, DataParallelError>
where
    B: ConcatBackend,
    M: Module<B>,
    I: Scatter<B> + Send,
    R: Send,
    F: Fn(&M, I) -> Result<R, BoxError> + Sync,
{
    let mut step = Step::new(settings, shards(settings, &input)?, path)?;
    let timed =
        |step: &Step<B>, m: &M, (shard, input): (usize, I)| step.replica(shard, || f(m, input));
    if step.direct(settings) {
        let run = |m: &M, input| timed(&step, m, input);
        return step.run_module(module, input, &run).map(Applied::Direct);
    }
    let inputs = step.stage(Stage::Scatter, || step.tied(|| input.scatter(&step.shards)));
    step.weigh(&inputs)?;
    let (replicas, states) = step.stage(Stage::Replicate, || {
        step.replicate(module, settings, own_states)
    })?;
    let results = step.apply(replicas, inputs, &|m: &M, input| timed(&step, m, input));
    step.stage(Stage::RunningStates, || {
        states.finish(module, &settings.output_device, &step.distinct)
    });
    let results = step.outputs(results)?;
    Ok(Applied::Replicas(Box::new(step), results))
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
        Some(batch_size) => {
            let sizes = match &settings.balancer {
                Some(balancer) => balance::lock(balancer).sizes(batch_size),
                None => {
                    let weights = settings.shard_weights.as_deref();
                    shard_sizes(batch_size, settings.devices.len(), weights)
                }
            };
            let output_device = settings.output_device.clone();
            let shards = Shards::from_sizes(&sizes, &settings.devices, dim, output_device);
            Ok(shards.with_loss_reduction(settings.loss_reduction))
        }
    }
}

/// One step's shards, their ties to the caller's graph, devices and profile.
pub(crate) struct Step<B: ConcatBackend> {
    pub(crate) shards: Shards<B>,
    ties: Ties<B>,
    /// Each device once: the output device, then the replicas' devices.
    pub(crate) distinct: Vec<B::Device>,
    sink: Option<Arc<Sink>>,
    /// The replicas' times, for the adaptive split.
    measured: Option<Arc<Measured>>,
    workers: Option<Arc<Workers>>,
    /// Whether the replicas run one at a time: on the exact path under autodiff (a forward
    /// that reaches a tracked tensor of another graph makes Burn merge the graphs, and Burn
    /// 0.21's graph locator loses nodes that another thread registers during a merge), and
    /// the replicas' own training steps where backwards may not run at once.
    one_at_a_time: bool,
}

impl<B: ConcatBackend> Step<B> {
    /// The step of `settings` over `shards` on `path`: on the fast path, per-replica graphs
    /// for the parallel backward where the backend and the settings allow (`backward/`).
    ///
    /// # Errors
    ///
    /// [`DataParallelError::DeviceTransfersUnsupported`] for distinct devices on a backend
    /// that cannot move tensors between them.
    pub(crate) fn new(
        settings: &Settings<B::Device>,
        shards: Shards<B>,
        path: Path,
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
        let measured = (settings.balancer.as_ref()).and_then(|balancer| {
            balance::lock(balancer).measure(shards.replicas(), shards.sizes())
        });
        let workers = settings.workers.clone();
        let graphs = match &workers {
            Some(workers)
                if path == Path::Fast && settings.parallel_backward && shards.len() > 1 =>
            {
                let runtime = Runtime {
                    workers: workers.clone(),
                    sink: sink.clone(),
                    measured: measured.clone(),
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
        let one_at_a_time = match path {
            Path::Fast => false,
            Path::Exact => B::ad_enabled(output_device),
            Path::OwnStep => !settings.parallel_backward || !B::concurrent_backward(),
        };
        Ok(Self {
            ties: Ties::new(path, shards.len(), graphs),
            shards,
            distinct,
            sink,
            measured,
            workers,
            one_at_a_time,
        })
    }

    /// Runs `f` (the scatter or the gather, on the calling thread) with this step's ties.
    pub(crate) fn tied<T>(&self, f: impl FnOnce() -> T) -> T {
        ties::within(&self.ties, f)
    }

    /// Takes the loss weights that `parts` (this step's scattered input) state, if they state
    /// any, as the shards' [`loss_shares`](Shards::loss_shares).
    ///
    /// # Errors
    ///
    /// Those of [`scatter::stated_shares`].
    fn weigh<I: Scatter<B>>(&mut self, parts: &[I]) -> Result<(), DataParallelError> {
        if let Some(shares) = scatter::stated_shares(parts)? {
            self.shards.set_loss_shares(shares);
        }
        Ok(())
    }

    /// Whether the module runs as it is, on the calling thread: one shard on the module's
    /// own device, or a wrapper inside another wrapper's replica, whose input that replica
    /// already holds.
    fn direct(&self, settings: &Settings<B::Device>) -> bool {
        let devices = self.shards.devices();
        parallel_apply::in_replica() || (devices.len() == 1 && devices[0] == settings.output_device)
    }

    /// Runs the module itself on the whole input, as the bare model would.
    fn run_module<M, I, R, F>(&self, module: &M, input: I, f: &F) -> Result<R, DataParallelError>
    where
        M: Module<B>,
        F: Fn(&M, (usize, I)) -> Result<R, BoxError>,
    {
        let result = parallel_apply::run(module, (0, input), f);
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

    /// Runs replica `shard`'s forward `f`, timed up to its device having run it where the
    /// profile or the adaptive split asks.
    fn replica<T>(&self, shard: usize, f: impl FnOnce() -> T) -> T {
        if self.sink.is_none() && self.measured.is_none() {
            return f();
        }
        let start = Instant::now();
        let output = f();
        let _ = B::sync(&self.shards.devices()[shard]);
        let elapsed = start.elapsed();
        if let Some(sink) = &self.sink {
            sink.replica_forward(shard, elapsed);
        }
        if let Some(measured) = &self.measured {
            measured.add(shard, elapsed);
        }
        output
    }

    /// The replicas of the step, with their running states planned.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::SharedRunningStates`] where a replica on another device would
    /// move the module's running states inside its forward on a backend that does not order
    /// such a transfer.
    fn replicate<M: Module<B>>(
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
            &self.ties,
        );
        if states.shared_elsewhere && !B::orders_receives() {
            return Err(DataParallelError::SharedRunningStates {
                devices: format!("{:?}", settings.devices),
            });
        }
        Ok((replicas, states))
    }

    /// Runs `f` on every replica with its input, each on its slot's lane, one at a time where
    /// [`one_at_a_time`](Self::one_at_a_time).
    fn apply<M, I, R, F>(&self, replicas: Vec<M>, inputs: Vec<I>, f: &F) -> Vec<Result<R, Failure>>
    where
        M: Send,
        I: Send,
        R: Send,
        F: Fn(&M, (usize, I)) -> Result<R, BoxError> + Sync,
    {
        if let Some(graphs) = self.ties.graphs() {
            graphs.begin_forward();
        }
        if !self.one_at_a_time {
            return self.run_replicas(replicas, inputs, f);
        }
        let turn = Mutex::new(());
        let one_at_a_time = |m: &M, input: (usize, I)| {
            let _turn = turn.lock().unwrap_or_else(|e| e.into_inner());
            f(m, input)
        };
        self.run_replicas(replicas, inputs, &one_at_a_time)
    }

    /// Runs `f` on every replica with its input, on the lanes where there are.
    fn run_replicas<M, I, R, F>(
        &self,
        replicas: Vec<M>,
        inputs: Vec<I>,
        f: &F,
    ) -> Vec<Result<R, Failure>>
    where
        M: Send,
        I: Send,
        R: Send,
        F: Fn(&M, (usize, I)) -> Result<R, BoxError> + Sync,
    {
        let inputs = inputs.into_iter().enumerate();
        match &self.workers {
            Some(workers) => {
                let slots = self.shards.replicas().iter().copied();
                let jobs = slots.zip(replicas).zip(inputs);
                let jobs = jobs.map(|((slot, replica), input)| (slot, replica, input));
                workers.apply(jobs.collect(), f)
            }
            None => (replicas.iter().zip(inputs))
                .map(|(replica, input)| parallel_apply::run(replica, input, f))
                .collect(),
        }
    }

    /// The replicas' results, or the first replica's failure.
    fn outputs<R>(&self, results: Vec<Result<R, Failure>>) -> Result<Vec<R>, DataParallelError> {
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
        let Some(graphs) = self.ties.graphs() else {
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
        if let Some(graphs) = self.ties.graphs() {
            let _ = graphs.seal();
        }
    }
}
