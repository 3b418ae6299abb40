//! The autodiff steps of the per-replica graphs: leaves and stand-ins that store their
//! gradients, the sentinel that reports a replica's backward done, the root that reports it
//! started, the hub that runs the replicas' backward, and the join that gives one node many
//! parents.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{FloatDType, TensorMetadata};

use super::super::comm::{self, Target, TransferLog};
use super::super::{ConcatBackend, MAX_TRACKED_INPUTS, ReplicaRuntime};
use super::{Graphs, Tracked};

/// One replica's backward, seeded with its outputs' gradients: the root is the flat
/// concatenation of each output times its gradient (Burn seeds a root with ones, so each
/// output receives its gradient) and of the sentinel times zero, which makes the sentinel
/// part of the backward even when no leaf is; a [`StartBackward`] on top reports that the
/// replica's backward holds its graph. A concatenation rather than a sum, so that the seeding
/// adds no reduction for CubeCL to tune.
pub(super) fn replica_backward<B: ConcatBackend, C: CheckpointStrategy>(
    seeds: Vec<(Tracked<B>, FloatTensor<B>)>,
    sentinel: Tracked<B>,
    key: Key<B, C>,
) {
    type A<B, C> = Autodiff<B, C>;
    let mut parts = vec![A::<B, C>::float_mul_scalar(sentinel, 0.0f32.into())];
    for (output, grad) in seeds {
        let seed = <A<B, C> as AutodiffBackend>::from_inner(grad);
        let term = A::<B, C>::float_mul(output, seed);
        let count = term.shape().num_elements();
        let mut term = A::<B, C>::float_reshape(term, [count].into());
        // Outputs of other float types (half-precision logits) join the f32 sentinel.
        if term.dtype() != burn::tensor::DType::F32 {
            term = A::<B, C>::float_cast(term, FloatDType::F32);
        }
        parts.push(term);
    }
    let cat = A::<B, C>::float_cat(parts, 0);
    let value = cat.primitive.clone();
    let root = match StartBackward::<C>(core::marker::PhantomData)
        .prepare::<C>([cat.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(key, value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    };
    let _ = <A<B, C> as AutodiffBackend>::backward(root);
}

/// Where a leaf's, a stand-in's or a root's backward reports.
pub(super) struct Key<B: ConcatBackend, C: CheckpointStrategy> {
    pub(super) graphs: Weak<Graphs<B, C>>,
    pub(super) replica: usize,
    pub(super) index: usize,
}

impl<B: ConcatBackend, C: CheckpointStrategy> Clone for Key<B, C> {
    fn clone(&self) -> Self {
        Self {
            graphs: self.graphs.clone(),
            replica: self.replica,
            index: self.index,
        }
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> std::fmt::Debug for Key<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}, {})", self.replica, self.index)
    }
}

/// Reports a replica's backward as failed if its job ends (or is dropped unrun) without the
/// sentinel having reported it done.
pub(super) struct Lost<B: ConcatBackend, C: CheckpointStrategy>(pub(super) Key<B, C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Lost<B, C> {
    pub(super) fn fail(&self, message: String) {
        if let Some(graphs) = self.0.graphs.upgrade() {
            graphs.report(self.0.replica, Some(message));
        }
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> Drop for Lost<B, C> {
    fn drop(&mut self) {
        self.fail("its backward ended without reaching its first leaf".into());
    }
}

/// The backward of a leaf (`false`) or a stand-in (`true`): stores its gradient. A
/// stand-in's hub, their common parent, runs after every stand-in; a replica's sentinel after
/// every leaf.
#[derive(Debug)]
pub(super) struct StoreBackward<C>(pub(super) bool, pub(super) core::marker::PhantomData<C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Backward<B, 1> for StoreBackward<C> {
    type State = Key<B, C>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let mut grad = grads.consume::<B>(&ops.node);
        if !self.0 {
            // A leaf's gradient, on the replica's worker.
            grad = comm::contiguous::<B>(grad);
        }
        let key = ops.state;
        if let Some(graphs) = key.graphs.upgrade() {
            graphs.store(key.replica, self.0, key.index, grad);
        }
    }
}

/// A replica's sentinel: reports the replica's backward done.
#[derive(Debug)]
pub(super) struct SentinelBackward<C>(pub(super) core::marker::PhantomData<C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Backward<B, 1> for SentinelBackward<C> {
    type State = Key<B, C>;

    /// Every leaf is one level above the sentinel, so every leaf's step has run.
    fn backward(self, ops: Ops<Self::State, 1>, _: &mut Gradients, _: &mut Checkpointer) {
        if let Some(graphs) = ops.state.graphs.upgrade() {
            graphs.report(ops.state.replica, None);
        }
    }
}

/// The root of a replica's backward: the first step it runs, once it holds its graph.
#[derive(Debug)]
struct StartBackward<C>(core::marker::PhantomData<C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Backward<B, 1> for StartBackward<C> {
    type State = Key<B, C>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        if let Some(graphs) = ops.state.graphs.upgrade() {
            graphs.start(ops.state.replica);
        }
        let grad = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            grads.register::<B>(parent.id, grad);
        }
    }
}

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
        let targets = graphs.reduce_targets();
        let reduce: Vec<Target<B::Device>> = targets.iter().map(|(_, _, t)| t.clone()).collect();
        let devices: Vec<B::Device> = match profiling {
            true => reduce.iter().map(|t| t.device.clone()).collect(),
            false => Vec::new(),
        };
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
        if profiling {
            comm::synchronize::<B>(&devices);
            (graphs.setup.runtime).record_hub(waited, started.elapsed());
        }
        if let Some((replica, message)) = collected.failure {
            let (slot, device) = &graphs.setup.replicas[replica];
            panic!("the backward of replica {slot} on device {device:?} failed: {message}");
        }
    }
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

#[derive(Debug)]
struct JoinBackward;

impl<B: ConcatBackend, const N: usize> Backward<B, N> for JoinBackward {
    type State = ();

    /// Nothing flows back: the join's output is never used.
    fn backward(self, _: Ops<Self::State, N>, _: &mut Gradients, _: &mut Checkpointer) {}
}

/// One graph node with exactly `N` of `tensors` as parents; its value is the first tensor's.
fn join_n<B: ConcatBackend, C: CheckpointStrategy, const N: usize>(
    tensors: Vec<Tracked<B>>,
) -> Tracked<B> {
    let nodes: [_; N] = core::array::from_fn(|i| tensors[i].node.clone());
    let value = tensors[0].primitive.clone();
    match JoinBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((), value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    }
}

/// A tracked join of 1 to 16 tensors.
pub(crate) fn join<B: ConcatBackend, C: CheckpointStrategy>(
    tensors: Vec<Tracked<B>>,
) -> Tracked<B> {
    join_by_count::<B, C>(tensors)
}

fn join_by_count<B: ConcatBackend, C: CheckpointStrategy>(tensors: Vec<Tracked<B>>) -> Tracked<B> {
    macro_rules! by_count {
        ($($n:literal)+) => {
            match tensors.len() {
                $($n => join_n::<B, C, $n>(tensors),)+
                _ => unreachable!("at most {MAX_TRACKED_INPUTS} inputs"),
            }
        };
    }
    by_count!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}
