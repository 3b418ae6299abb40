//! The hub's side of the parallel backward, on the caller's thread inside the caller's
//! backward: start the replicas' backwards, wait for them while reducing the buckets that
//! become ready ([`overlap`](super::overlap)), then reduce the rest and register every
//! target's gradient in the caller's gradients.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, TensorMetadata};

use super::overlap::{Overlap, Ready};
use super::replica::{Key, Lost, replica_backward};
use super::{Graphs, PerReplica, Replica, State, Status, Tracked};
use crate::backend::comm::{self, Combine, ReduceBucket, Target, TransferLog};
use crate::backend::{ConcatBackend, Part, ReplicaRuntime, add_to};

/// A replica's backward, ready to run on its worker.
type Job = Box<dyn FnOnce() + Send>;

/// What the replicas' backward left: per replica, the gradient of every target not reduced
/// yet (leaves of one target added); per target, the sum already reduced in a bucket; the
/// first failure.
struct Collected<B: ConcatBackend> {
    per_replica: PerReplica<B>,
    reduced: Vec<Option<FloatTensor<B>>>,
    failure: Option<(usize, String)>,
}

/// The hub: the common parent of a forward's stand-ins, whose backward step runs once every
/// stand-in has stored its gradient.
#[derive(Debug)]
pub(super) struct HubBackward<C>(pub(super) core::marker::PhantomData<C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Backward<B, 1> for HubBackward<C> {
    type State = Arc<Graphs<B, C>>;

    /// Runs the replicas' backward (reducing the buckets of gradients that are ready while it
    /// runs), combines the rest of each target's gradients on the target's device and
    /// registers them.
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let graphs = ops.state;
        let profiling = graphs.setup.runtime.profiling();
        let log = Log(graphs.setup.runtime.clone());
        let log: Option<&dyn TransferLog> = match profiling {
            true => Some(&log),
            false => None,
        };
        let started = Instant::now();
        let collected = graphs.run_backward(log);
        let waited = started.elapsed();
        let started = Instant::now();
        let failure = graphs.finish(collected, grads, log);
        if profiling {
            (graphs.setup.runtime).record_hub(waited, started.elapsed());
        }
        if let Some((replica, message)) = failure {
            let (slot, device) = &graphs.setup.replicas[replica];
            panic!("the backward of replica {slot} on device {device:?} failed: {message}");
        }
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> Graphs<B, C> {
    /// Runs every replica's backward from its stored output gradients, reducing each bucket
    /// of gradients that becomes ready while they run.
    fn run_backward(&self, log: Option<&dyn TransferLog>) -> Collected<B> {
        let started = Instant::now();
        for (slot, job) in self.queue_backwards(started) {
            self.setup.runtime.spawn(slot, job);
        }
        let (state, reduced) = self.wait(started, log);
        collect(state, reduced)
    }

    /// One job per replica whose stand-ins received a gradient, each marked queued; the
    /// overlap's buckets when every replica runs one (a bucket needs every replica's
    /// gradients).
    fn queue_backwards(&self, started: Instant) -> Vec<(usize, Job)> {
        let mut state = self.lock();
        let mut jobs: Vec<(usize, Job)> = Vec::new();
        for index in 0..state.replicas.len() {
            let seeds: Vec<(Tracked<B>, FloatTensor<B>)> = state.replicas[index]
                .outputs
                .iter_mut()
                .filter_map(|(output, grad)| grad.take().map(|grad| (output.clone(), grad)))
                .collect();
            if seeds.is_empty() {
                continue;
            }
            let sentinel = self.sentinel(&mut state, index);
            let key = Key {
                graphs: self.me.clone(),
                replica: index,
                index: 0,
            };
            state.status[index] = Status::Queued;
            jobs.push((self.setup.replicas[index].0, job(seeds, sentinel, key)));
        }
        state.overlap = match self.setup.reduce_bucket_size {
            Some(size) if jobs.len() == state.replicas.len() => {
                Some(Overlap::of_backward(&state, size))
            }
            _ => None,
        };
        state.started_at = Some(started);
        jobs
    }

    /// Waits until no replica's backward is queued or running, reducing each bucket as it
    /// becomes ready; after the setup's `backward_timeout`, gives up on the replicas not done
    /// ([`give_up`](Self::give_up)). Returns the state, locked, and the buckets' sums per
    /// target.
    fn wait(
        &self,
        started: Instant,
        log: Option<&dyn TransferLog>,
    ) -> (MutexGuard<'_, State<B>>, Vec<Option<FloatTensor<B>>>) {
        let mut state = self.lock();
        let mut reduced: Vec<Option<FloatTensor<B>>> = Vec::new();
        reduced.resize_with(state.targets.len(), || None);
        let deadline = (self.setup.backward_timeout).and_then(|limit| started.checked_add(limit));
        loop {
            if let Some(ready) = state.overlap.as_mut().and_then(Overlap::next_ready) {
                state = self.reduce_ready(state, ready, &mut reduced, started, log);
                continue;
            }
            if !state.status.iter().any(Status::pending) {
                break;
            }
            state = match deadline {
                None => (self.changed.wait(state)).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.give_up(&mut state, started.elapsed());
                        break;
                    }
                    let waited = self.changed.wait_timeout(state, left);
                    waited.unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
        // Buckets made ready by the last leaves, stored just before their replica was done.
        while let Some(ready) = state.overlap.as_mut().and_then(Overlap::next_ready) {
            state = self.reduce_ready(state, ready, &mut reduced, started, log);
        }
        state.overlap = None;
        (state, reduced)
    }

    /// Marks every replica whose backward is not done after `waited` as failed, saying where
    /// it stands, and tells those backwards to give up when they start.
    fn give_up(&self, state: &mut State<B>, waited: Duration) {
        self.cancelled.store(true, Ordering::SeqCst);
        let waited = waited.as_secs();
        let hint = "(`DataParallelConfig::backward_timeout_secs`; raise it if the backward is \
                    only slow)";
        for status in state.status.iter_mut() {
            let stands = match status {
                Status::Queued => format!(
                    "its backward was handed to its worker {waited} s ago and has not run there"
                ),
                Status::Entered => format!(
                    "its backward has waited {waited} s for its autodiff graph, which another \
                     backward holds: the replica's forward used a tracked tensor that it did \
                     not receive through its input (one reached through a global), and the \
                     caller's graph uses it too. Pass such tensors in the input (`Broadcast` \
                     for a whole tensor) or use `forward_with_captures`"
                ),
                Status::Started => format!(
                    "its backward has run for {waited} s without finishing (a kernel that does \
                     not return, an operation of the model that waits for ever, or a tracked \
                     tensor reached through a global, whose graph Burn merged with the \
                     replica's)"
                ),
                _ => continue,
            };
            *status = Status::Failed(format!("{stands} {hint}"));
        }
    }

    /// Reduces a ready bucket with the state unlocked, its sums going to `reduced`; a bucket
    /// whose gradients are not all of one dtype stays where it is, for the final reduce.
    fn reduce_ready<'a>(
        &'a self,
        mut state: MutexGuard<'a, State<B>>,
        ready: Ready<B::Device>,
        reduced: &mut [Option<FloatTensor<B>>],
        started: Instant,
        log: Option<&dyn TransferLog>,
    ) -> MutexGuard<'a, State<B>> {
        let Some(parts) = take_bucket(&mut state, &ready.targets) else {
            return state;
        };
        drop(state);
        let start = started.elapsed();
        let bytes: usize = parts[0].iter().map(comm::bytes_of).sum();
        let sums = comm::sum_flat::<B>(parts, &ready.device, log);
        for (&target, sum) in ready.targets.iter().zip(sums) {
            reduced[target] = Some(sum);
        }
        if self.setup.runtime.profiling() {
            let _ = B::sync(&ready.device);
            self.setup.runtime.record_bucket(ReduceBucket {
                index: ready.index,
                start,
                end: started.elapsed(),
                bytes: bytes as u64,
                tensors: ready.targets.len(),
            });
        }
        self.lock()
    }

    /// The final reduce: every target's gradients not yet reduced in a bucket, combined on
    /// the target's device and registered in the caller's `grads` (zeros for a target whose
    /// own backward step follows the hub and that no replica gave a gradient). Returns the
    /// first replica's failure.
    fn finish(
        &self,
        collected: Collected<B>,
        grads: &mut Gradients,
        log: Option<&dyn TransferLog>,
    ) -> Option<(usize, String)> {
        let targets = self.reduce_targets();
        let reduce: Vec<Target<B::Device>> = targets.iter().map(|(_, _, t)| t.clone()).collect();
        let mut totals = comm::reduce_add_coalesced::<B>(collected.per_replica, &reduce, None, log);
        for (total, reduced) in totals.iter_mut().zip(collected.reduced) {
            if reduced.is_some() {
                *total = reduced;
            }
        }
        for ((tensor, linked, _), total) in targets.into_iter().zip(totals) {
            match total {
                Some(total) => grads.register::<B>(tensor.node.id, total),
                // Its own backward step runs after the hub and needs a gradient.
                None if linked => {
                    let primitive = &tensor.primitive;
                    let zeros = B::float_zeros(
                        primitive.shape(),
                        &B::float_device(primitive),
                        FloatDType::from(primitive.dtype()),
                    );
                    grads.register::<B>(tensor.node.id, zeros);
                }
                None => {}
            }
        }
        if self.setup.runtime.profiling() {
            let devices: Vec<B::Device> = reduce.iter().map(|t| t.device.clone()).collect();
            comm::synchronize::<B>(&devices);
        }
        collected.failure
    }

    /// The targets, in the form the reduction takes, with whether the hub is their child.
    fn reduce_targets(&self) -> Vec<(Tracked<B>, bool, Target<B::Device>)> {
        self.lock()
            .targets
            .iter()
            .map(|target| {
                let device = B::float_device(&target.tensor.primitive);
                let combine = match target.part {
                    Part::Whole => Combine::Sum,
                    Part::Rows { dim } => Combine::Rows {
                        dim,
                        shapes: target
                            .shapes
                            .iter()
                            .map(|shape| shape.clone().unwrap_or_else(|| [0].into()))
                            .collect(),
                    },
                };
                (
                    target.tensor.clone(),
                    target.linked,
                    Target { device, combine },
                )
            })
            .collect()
    }
}

/// Replica `key.replica`'s backward from `seeds`; reported failed if it panics or ends
/// without its sentinel reporting it done.
fn job<B: ConcatBackend, C: CheckpointStrategy>(
    seeds: Vec<(Tracked<B>, FloatTensor<B>)>,
    sentinel: Tracked<B>,
    key: Key<B, C>,
) -> Job {
    let lost = Lost(key.clone());
    Box::new(move || {
        lost.enter();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            replica_backward::<B, C>(seeds, sentinel, key)
        }));
        if let Err(payload) = run {
            lost.fail(crate::error::panic_message(payload.as_ref()));
        }
        drop(lost);
    })
}

/// What the replicas left in `state`, with the buckets' sums `reduced`.
fn collect<B: ConcatBackend>(
    mut state: MutexGuard<'_, State<B>>,
    reduced: Vec<Option<FloatTensor<B>>>,
) -> Collected<B> {
    let failure = (state.status.iter().enumerate()).find_map(|(replica, status)| match status {
        Status::Failed(message) => Some((replica, message.clone())),
        _ => None,
    });
    let targets = state.targets.len();
    let per_replica = (state.replicas.iter_mut())
        .map(|replica| take_sums(replica, targets, Some))
        .collect();
    Collected {
        per_replica,
        reduced,
        failure,
    }
}

/// Takes every replica's gradients of `targets` (leaves of one target added, in leaf order,
/// as the final reduce does): `parts[r][i]` is replica `r`'s of `targets[i]`. `None`, leaving
/// them in place, unless every replica has all of them in one dtype.
fn take_bucket<B: ConcatBackend>(
    state: &mut State<B>,
    targets: &[usize],
) -> Option<Vec<Vec<FloatTensor<B>>>> {
    let position: HashMap<usize, usize> =
        targets.iter().enumerate().map(|(i, &t)| (t, i)).collect();
    let mut dtype = None;
    for replica in &state.replicas {
        let mut present = vec![false; targets.len()];
        for leaf in &replica.leaves {
            if let (Some(&i), Some(grad)) = (position.get(&leaf.target), &leaf.grad) {
                present[i] = true;
                if *dtype.get_or_insert(grad.dtype()) != grad.dtype() {
                    return None;
                }
            }
        }
        if present.contains(&false) {
            return None;
        }
    }
    let parts = (state.replicas.iter_mut())
        .map(|replica| {
            let sums = take_sums(replica, targets.len(), |t| position.get(&t).copied());
            sums.into_iter().map(|sum| sum.expect("present")).collect()
        })
        .collect();
    Some(parts)
}

/// Takes `replica`'s leaf gradients into `slots` sums, each leaf's into slot
/// `slot(its target)` (the gradients of leaves without a slot stay), added in leaf order.
fn take_sums<B: ConcatBackend>(
    replica: &mut Replica<B>,
    slots: usize,
    slot: impl Fn(usize) -> Option<usize>,
) -> Vec<Option<FloatTensor<B>>> {
    let mut sums: Vec<Option<FloatTensor<B>>> = (0..slots).map(|_| None).collect();
    for leaf in &mut replica.leaves {
        if let Some(i) = slot(leaf.target)
            && let Some(grad) = leaf.grad.take()
        {
            add_to::<B>(&mut sums[i], grad);
        }
    }
    sums
}

/// The runtime as the reduction's transfer log.
struct Log(Arc<dyn ReplicaRuntime>);

impl TransferLog for Log {
    fn record(&self, bytes: u64, elapsed: Duration) {
        self.0.record_transfer(bytes, elapsed);
    }

    fn timed(&self) -> bool {
        true
    }
}
