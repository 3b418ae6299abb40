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

use burn::module::Module;
use burn::tensor::backend::Backend;

use crate::backend::ConcatBackend;
use crate::backward::ties::Path;
use crate::balance;
use crate::config::Settings;
use crate::error::{BoxError, DataParallelError};
use crate::gather::Gather;
use crate::parallel_apply;
use crate::profile::Stage;
use crate::running_states::OwnStates;
use crate::scatter::Scatter;
use crate::shards::sizes::adaptive_sizes;
use crate::shards::{Shards, shard_sizes};

mod stages;
pub(crate) use stages::Step;

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
                Some(balancer) => adaptive_sizes(batch_size, &balance::lock(balancer).weights()),
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
