//! The replica's side of the parallel backward, on the replica's worker: its backward seeded
//! with the gradients its outputs' stand-ins received, which reports that it started (the
//! root's step), stores each leaf's gradient for the hub, and reports it done (the
//! sentinel's step, after every leaf's).

use std::sync::Weak;
use std::sync::atomic::Ordering;

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{FloatDType, TensorMetadata};

use super::{Graphs, Status, Tracked};
use crate::backend::comm;
use crate::backend::{ConcatBackend, add_to};

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
    /// Reports that the replica's backward runs on its worker, about to call Burn's
    /// `backward()`.
    pub(super) fn enter(&self) {
        if let Some(graphs) = self.0.graphs.upgrade() {
            graphs.enter(self.0.replica);
        }
    }

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

impl<B: ConcatBackend, C: CheckpointStrategy> Graphs<B, C> {
    /// Replica `replica`'s backward runs on its worker and calls Burn's `backward()`.
    fn enter(&self, replica: usize) {
        let mut state = self.lock();
        if state.status[replica] == Status::Queued {
            state.status[replica] = Status::Entered;
        }
    }

    /// Replica `replica`'s backward has taken its graph and started.
    fn start(&self, replica: usize) {
        if self.cancelled.load(Ordering::SeqCst) {
            panic!("the backward of replica {replica} was given up on");
        }
        let mut state = self.lock();
        if matches!(state.status[replica], Status::Queued | Status::Entered) {
            state.status[replica] = Status::Started;
        }
        self.changed.notify_all();
    }

    /// Replica `replica`'s backward is over (`failure`: it panicked with this message).
    fn report(&self, replica: usize, failure: Option<String>) {
        if failure.is_none() && self.setup.runtime.times_backwards() {
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
        if state.status[replica].pending() {
            state.status[replica] = match failure {
                Some(message) => Status::Failed(message),
                None => Status::Done,
            };
        }
        self.changed.notify_all();
    }

    /// Adds `grad` to what leaf (or output, `output`) `index` of replica `replica` received;
    /// wakes the hub when a leaf's gradient makes a bucket ready.
    fn store(&self, replica: usize, output: bool, index: usize, grad: FloatTensor<B>) {
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
}
