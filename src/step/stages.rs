//! The stages of one step, on the step's shards, ties, devices and profile: replicate,
//! apply on the lanes, collect the outputs, seal the ties.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::module::Module;

use crate::backend::{ConcatBackend, ReplicaSetup};
use crate::backward::ties::{self, Path, Ties};
use crate::balance::{self, Measured};
use crate::config::Settings;
use crate::error::{BoxError, DataParallelError};
use crate::parallel_apply::{self, Failure, Runtime, Workers};
use crate::profile::{self, Sink, Stage};
use crate::replicate::replicate_for_step;
use crate::running_states::{self, OwnStates, RunningStates};
use crate::scatter::{self, Scatter};
use crate::shards::Shards;

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
        if let Some(sink) = &sink {
            sink.lock().exact_path = path == Path::Exact;
        }
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
    pub(super) fn weigh<I: Scatter<B>>(&mut self, parts: &[I]) -> Result<(), DataParallelError> {
        if let Some(shares) = scatter::stated_shares(parts)? {
            self.shards.set_loss_shares(shares);
        }
        Ok(())
    }

    /// Whether the module runs as it is, on the calling thread: one shard on the module's
    /// own device, or a wrapper inside another wrapper's replica, whose input that replica
    /// already holds.
    pub(super) fn direct(&self, settings: &Settings<B::Device>) -> bool {
        let devices = self.shards.devices();
        parallel_apply::in_replica() || (devices.len() == 1 && devices[0] == settings.output_device)
    }

    /// Runs the module itself on the whole input, as the bare model would.
    pub(super) fn run_module<M, I, R, F>(
        &self,
        module: &M,
        input: I,
        f: &F,
    ) -> Result<R, DataParallelError>
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
    pub(super) fn replica<T>(&self, shard: usize, f: impl FnOnce() -> T) -> T {
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
    pub(super) fn replicate<M: Module<B>>(
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
    pub(super) fn apply<M, I, R, F>(
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
    pub(super) fn run_replicas<M, I, R, F>(
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
    pub(super) fn outputs<R>(
        &self,
        results: Vec<Result<R, Failure>>,
    ) -> Result<Vec<R>, DataParallelError> {
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
    pub(super) fn seal(&self) -> Result<(), DataParallelError> {
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
