//! One forward of a [`DataParallel`](crate::DataParallel), the whole algorithm:
//!
//! ```text
//! shards   = scatter(input, devices, dim)     // scatter/: split the batch, move each shard
//! replicas = replicate(module, shard devices) // replicate.rs: copies of the parameters
//! outputs  = parallel_apply(replicas, shards) // parallel_apply.rs: one lane per device
//! gather(outputs, output_device, dim)         // gather.rs: differentiable concatenation
//! ```

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::{Duration, Instant};

use burn::module::Module;

use crate::balance;
use crate::config::Settings;
use crate::error::{BoxError, DataParallelError, panic_message};
use crate::gather::Gather;
use crate::parallel_apply::{self, Failure};
use crate::profile::{self, Recording};
use crate::replicate::{Replicas, bring_home, merge_graphs, timed_replicas};
use crate::scatter::{Scatter, stated_shares};
use crate::shards::{Shards, adaptive_sizes, shard_sizes};

/// Runs `forward` on every shard of `input` and gathers the outputs. `captures`: `forward`
/// may read tensors besides its module and input (a closure's captures), whose graphs the
/// replicas must then record into in turn.
///
/// # Errors
///
/// Those of [`apply`] and of [`Gather::gather`].
pub(crate) fn forward<M, I, O, F>(
    module: &M,
    settings: &Settings,
    input: I,
    forward: F,
    captures: bool,
) -> Result<O, DataParallelError>
where
    M: Module,
    I: Scatter + Send,
    O: Gather + Send,
    F: Fn(&M, I) -> Result<O, BoxError> + Sync,
{
    on_devices(settings, || {
        let how = match captures {
            true => Replicas::TiedInTurn,
            false => Replicas::Tied,
        };
        match apply(module, settings, input, how, forward)? {
            Applied::Direct(output) => Ok(output),
            Applied::Replicas(replicated) => {
                let Replicated {
                    shards,
                    outputs,
                    mut recording,
                } = *replicated;
                let gathered = O::gather(outputs, &shards)?;
                profile::stage(recording.as_mut(), |p| &mut p.gather);
                settings.profiler.keep(recording);
                Ok(gathered)
            }
        }
    })
}

/// Runs `step`, a step's work on the calling thread, which moves tensors to and from the
/// replicas' devices. A panic there with a device that no longer answers (a remote server
/// gone) becomes [`DataParallelError::DeviceFailed`] for the first such device; a panic with
/// every device answering goes on unwinding as it was.
///
/// # Errors
///
/// Those of `step`, and [`DataParallelError::DeviceFailed`].
pub(crate) fn on_devices<T>(
    settings: &Settings,
    step: impl FnOnce() -> Result<T, DataParallelError>,
) -> Result<T, DataParallelError> {
    let payload = match catch_unwind(AssertUnwindSafe(step)) {
        Ok(result) => return result,
        Err(payload) => payload,
    };
    for (replica, device) in settings.devices.iter().enumerate() {
        let reason = match catch_unwind(AssertUnwindSafe(|| device.sync())) {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error.to_string(),
            Err(answer) => panic_message(answer.as_ref()),
        };
        return Err(DataParallelError::DeviceFailed {
            replica,
            device: format!("{device:?}"),
            reason: reason.replace('\n', " "),
            message: panic_message(payload.as_ref()).replace('\n', " "),
        });
    }
    resume_unwind(payload)
}

/// What [`apply`] gives back.
pub(crate) enum Applied<R> {
    /// The module's own result: one shard on its device, or a wrapper inside a replica.
    Direct(R),
    /// Each replica's result, for the stage that follows.
    Replicas(Box<Replicated<R>>),
}

/// The replicas' results of one step.
pub(crate) struct Replicated<R> {
    /// The split that gave them.
    pub(crate) shards: Shards,
    /// Each replica's result, in shard order.
    pub(crate) outputs: Vec<R>,
    /// The step's profile so far, where profiling is on.
    pub(crate) recording: Option<Recording>,
}

/// The stages every step shares: scatter `input`, replicate `module` (tied as `how` says),
/// run `f` on every replica with its shard, each on its lane.
///
/// # Errors
///
/// Those of [`shards`]; those of the loss weights the parts state; the first replica's
/// failure.
pub(crate) fn apply<M, I, R, F>(
    module: &M,
    settings: &Settings,
    input: I,
    how: Replicas,
    f: F,
) -> Result<Applied<R>, DataParallelError>
where
    M: Module,
    I: Scatter + Send,
    R: Send,
    F: Fn(&M, I) -> Result<R, BoxError> + Sync,
{
    let mut shards = shards(settings, &input)?;
    let direct = shards.len() == 1 && shards.devices()[0] == settings.output_device;
    let workers = match (&settings.workers, direct || parallel_apply::in_replica()) {
        (Some(workers), false) => workers,
        // One shard on the module's device, or a wrapper inside a replica: the module itself,
        // on the calling thread, as the bare model. The first is the wrapper's step, and its
        // profile says so: one shard, the module's time its one replica's.
        _ => {
            let output_device = std::slice::from_ref(&settings.output_device);
            let mut recording = direct
                .then(|| settings.profiler.start(shards.sizes(), output_device))
                .flatten();
            let output = direct_forward(module, settings, input, &f)?;
            if let Some(recording) = recording.as_mut() {
                recording.end_alone();
            }
            settings.profiler.keep(recording);
            return Ok(Applied::Direct(output));
        }
    };
    // Replicas whose operations cannot merge graphs while they record run at once: Burn's
    // graph race needs a merge (`parallel_apply.rs`).
    let at_once = how != Replicas::TiedInTurn && !input.carries_gradients();
    if at_once && how == Replicas::Tied {
        merge_graphs(module);
    }
    let mut involved = shards.devices().to_vec();
    involved.push(settings.output_device.clone());
    let mut recording = settings.profiler.start(shards.sizes(), &involved);
    let inputs = input.scatter(&shards);
    if let Some(shares) = stated_shares(&inputs)? {
        shards.set_loss_shares(shares);
    }
    profile::stage(recording.as_mut(), |p| &mut p.scatter);
    let (copies, moves): (Vec<M>, Vec<Duration>) = timed_replicas(module, shards.devices(), how)
        .into_iter()
        .unzip();
    profile::stage(recording.as_mut(), |p| &mut p.replicate);
    let jobs = (shards.replicas().iter().copied())
        .zip(copies)
        .zip(inputs.into_iter().enumerate())
        .map(|((entry, replica), input)| (entry, replica, input))
        .collect();
    // Adaptive shards and the profile time each replica's work up to its device having
    // run it; adaptive shards also what making each replica held the calling thread.
    let measured = (settings.balancer.as_ref())
        .and_then(|balancer| balance::lock(balancer).measure(shards.replicas(), shards.sizes()));
    if let Some(measured) = &measured {
        measured.set_moves(&moves);
    }
    let wait = measured.is_some() || recording.is_some();
    let timed = |replica: &M, (index, input): (usize, I)| {
        let start = Instant::now();
        let result = f(replica, input)?;
        if wait {
            // A failed device reports it at its next use; a time is all this needs.
            let _ = shards.devices()[index].sync();
        }
        let elapsed = start.elapsed();
        if let Some(measured) = &measured {
            measured.add(index, elapsed);
        }
        Ok((result, elapsed))
    };
    let rounds = parallel_apply::rounds(shards.devices(), at_once);
    let results = workers.apply(jobs, &rounds, &timed);
    if let Some(recording) = recording.as_mut() {
        recording.end_replicas();
    }
    if shards
        .devices()
        .iter()
        .any(|d| *d != settings.output_device)
    {
        bring_home(module, &settings.output_device);
        profile::stage(recording.as_mut(), |p| &mut p.running_states);
    }
    let mut outputs = Vec::with_capacity(results.len());
    let mut times = Vec::with_capacity(results.len());
    let places = shards.replicas().iter().zip(shards.devices());
    for (result, (&entry, device)) in results.into_iter().zip(places) {
        let (output, time) =
            result.map_err(|failure| failure.into_error(entry, format!("{device:?}")))?;
        outputs.push(output);
        times.push(time);
    }
    if let Some(recording) = recording.as_mut() {
        recording.set_forward(times);
    }
    Ok(Applied::Replicas(Box::new(Replicated {
        shards,
        outputs,
        recording,
    })))
}

/// The module's own forward on the whole input, on the calling thread, its failures typed as
/// replica 0's.
fn direct_forward<M, I, O, F>(
    module: &M,
    settings: &Settings,
    input: I,
    forward: &F,
) -> Result<O, DataParallelError>
where
    F: Fn(&M, I) -> Result<O, BoxError>,
{
    let device = || format!("{:?}", settings.output_device);
    match catch_unwind(AssertUnwindSafe(|| forward(module, input))) {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(error)) => Err(Failure::Failed(error).into_error(0, device())),
        Err(payload) => Err(Failure::Panicked(payload).into_error(0, device())),
    }
}

/// How `input` would be split over the devices of `settings`.
///
/// # Errors
///
/// [`DataParallelError::NothingToScatter`] when `input` holds no tensor to split along the
/// settings' `dim`, [`DataParallelError::EmptyBatch`] when its batch is empty, and the
/// errors of [`Scatter::batch_size`] (tensors that disagree on the batch size).
pub(crate) fn shards<I: Scatter>(
    settings: &Settings,
    input: &I,
) -> Result<Shards, DataParallelError> {
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
