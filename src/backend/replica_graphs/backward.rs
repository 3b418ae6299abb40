//! The hub's side of the parallel backward: starting the replicas' backwards, collecting what
//! their leaves store, reducing ready buckets while they run ([`overlap`](super::overlap)),
//! and handing the rest to the final reduce.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::TensorMetadata;
use burn::tensor::ops::FloatTensor;

use super::super::comm::{self, Combine, ReduceBucket, Target, TransferLog};
use super::super::{ConcatBackend, Part};
use super::overlap::{Overlap, Ready, TargetInfo};
use super::steps::{Key, Lost, replica_backward};
use super::{Graphs, PerReplica, Replica, START_LIMIT, State, Status, Tracked};

/// What the replicas' backward left: per replica, the gradient of every target not reduced
/// yet (leaves of one target added); per target, the sum already reduced in a bucket; the
/// first failure.
pub(super) struct Collected<B: ConcatBackend> {
    pub(super) per_replica: PerReplica<B>,
    pub(super) reduced: Vec<Option<FloatTensor<B>>>,
    pub(super) failure: Option<(usize, String)>,
}

impl<B: ConcatBackend, C: CheckpointStrategy> Graphs<B, C> {
    /// Runs every replica's backward from its stored output gradients, reducing each bucket
    /// of gradients that becomes ready while they run.
    pub(super) fn run_backward(&self, log: Option<&dyn TransferLog>) -> Collected<B> {
        let mut state = self.lock();
        let mut jobs: Vec<(usize, Box<dyn FnOnce() + Send>)> = Vec::new();
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
            let lost = Lost(key.clone());
            state.status[index] = Status::Queued;
            jobs.push((
                self.setup.replicas[index].0,
                Box::new(move || {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        replica_backward::<B, C>(seeds, sentinel, key)
                    }));
                    if let Err(payload) = run {
                        lost.fail(crate::error::panic_message(payload.as_ref()));
                    }
                    drop(lost);
                }),
            ));
        }
        // A bucket needs every replica's gradients: only when every replica runs a backward.
        state.overlap = match self.setup.reduce_bucket_size {
            Some(size) if jobs.len() == state.replicas.len() => Some(plan(&state, size)),
            _ => None,
        };
        let started = Instant::now();
        state.started_at = Some(started);
        drop(state);
        for (slot, job) in jobs {
            self.setup.runtime.spawn(slot, job);
        }
        let mut reduced: Vec<Option<FloatTensor<B>>> = Vec::new();
        let mut state = self.lock();
        reduced.resize_with(state.targets.len(), || None);
        let begun = Instant::now();
        loop {
            if let Some(ready) = state.overlap.as_mut().and_then(Overlap::next_ready) {
                state = self.reduce_ready(state, ready, &mut reduced, started, log);
                continue;
            }
            let waiting = |s: &Status| matches!(s, Status::Queued | Status::Started);
            if !state.status.iter().any(waiting) {
                break;
            }
            let unstarted = state.status.contains(&Status::Queued);
            let elapsed = begun.elapsed();
            if unstarted && elapsed >= START_LIMIT {
                self.cancelled.store(true, Ordering::SeqCst);
                for status in state.status.iter_mut() {
                    if *status == Status::Queued {
                        *status = Status::Failed(format!(
                            "its backward did not start within {} s: another backward holds \
                             its autodiff graph, which happens when the replica's forward used \
                             a tracked tensor that it did not receive through its input (a \
                             tensor captured by the forward closure); pass such tensors in the \
                             input (`Broadcast` for a whole tensor) or turn \
                             `parallel_backward` off",
                            START_LIMIT.as_secs()
                        ));
                    }
                }
                break;
            }
            let wait = match unstarted {
                true => START_LIMIT - elapsed,
                false => Duration::from_secs(3600),
            };
            state = self
                .changed
                .wait_timeout(state, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        // Buckets made ready by the last leaves, stored just before their replica was done.
        while let Some(ready) = state.overlap.as_mut().and_then(Overlap::next_ready) {
            state = self.reduce_ready(state, ready, &mut reduced, started, log);
        }
        state.overlap = None;
        let failure = state
            .status
            .iter()
            .enumerate()
            .find_map(|(replica, status)| match status {
                Status::Failed(message) => Some((replica, message.clone())),
                _ => None,
            });
        let targets = state.targets.len();
        let per_replica = state
            .replicas
            .iter_mut()
            .map(|replica| take_sums(replica, targets, Some))
            .collect();
        Collected {
            per_replica,
            reduced,
            failure,
        }
    }

    /// Reduces a ready bucket with the state unlocked, its sums going to `reduced`; a bucket
    /// whose gradients are not all of one dtype stays where it is, for the final reduce.
    fn reduce_ready<'a>(
        &'a self,
        mut state: std::sync::MutexGuard<'a, State<B>>,
        ready: Ready<B::Device>,
        reduced: &mut [Option<FloatTensor<B>>],
        started: Instant,
        log: Option<&dyn TransferLog>,
    ) -> std::sync::MutexGuard<'a, State<B>> {
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

    /// Replica `replica`'s backward has taken its graph and started.
    pub(super) fn start(&self, replica: usize) {
        if self.cancelled.load(Ordering::SeqCst) {
            panic!("the backward of replica {replica} was given up on");
        }
        let mut state = self.lock();
        if state.status[replica] == Status::Queued {
            state.status[replica] = Status::Started;
        }
        self.changed.notify_all();
    }

    /// Replica `replica`'s backward is over (`failure`: it panicked with this message).
    pub(super) fn report(&self, replica: usize, failure: Option<String>) {
        if failure.is_none() && self.setup.runtime.profiling() {
            let started = self.lock().started_at;
            let device = &self.setup.replicas[replica].1;
            let _ = B::sync(device);
            if let Some(started) = started {
                self.setup
                    .runtime
                    .record_backward(replica, started.elapsed());
            }
        }
        let mut state = self.lock();
        if matches!(state.status[replica], Status::Queued | Status::Started) {
            state.status[replica] = match failure {
                Some(message) => Status::Failed(message),
                None => Status::Done,
            };
        }
        self.changed.notify_all();
    }

    /// Adds `grad` to what leaf (or output, `output`) `index` of replica `replica` received;
    /// wakes the hub when a leaf's gradient makes a bucket ready.
    pub(super) fn store(&self, replica: usize, output: bool, index: usize, grad: FloatTensor<B>) {
        let mut state = self.lock();
        let state = &mut *state;
        let entry = &mut state.replicas[replica];
        let stored = match output {
            true => &mut entry.outputs[index].1,
            false => &mut entry.leaves[index].grad,
        };
        add_to::<B>(stored, grad);
        if output {
            return;
        }
        let leaf = &entry.leaves[index];
        if let (true, Some(overlap)) = (leaf.used, state.overlap.as_mut())
            && overlap.stored(replica, leaf.target)
        {
            self.changed.notify_all();
        }
    }

    /// The targets, in the form the reduction takes.
    pub(super) fn reduce_targets(&self) -> Vec<(Tracked<B>, bool, Target<B::Device>)> {
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

/// The buckets of this backward, from the targets and the leaves the forwards used.
fn plan<B: ConcatBackend>(state: &State<B>, bucket_size: usize) -> Overlap<B::Device> {
    let targets: Vec<TargetInfo<B::Device>> = (state.targets.iter())
        .map(|target| TargetInfo {
            device: B::float_device(&target.tensor.primitive),
            dtype: target.tensor.primitive.dtype(),
            bytes: comm::bytes_of(&target.tensor.primitive),
            whole: target.part == Part::Whole,
        })
        .collect();
    let leaves: Vec<Vec<(usize, bool)>> = (state.replicas.iter())
        .map(|replica| {
            let leaves = replica.leaves.iter();
            leaves.map(|leaf| (leaf.target, leaf.used)).collect()
        })
        .collect();
    Overlap::plan(&targets, &leaves, bucket_size)
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

/// `grad` added to what `slot` holds.
fn add_to<B: ConcatBackend>(slot: &mut Option<FloatTensor<B>>, grad: FloatTensor<B>) {
    *slot = Some(match slot.take() {
        Some(sum) => B::float_add(sum, grad),
        None => grad,
    });
}
