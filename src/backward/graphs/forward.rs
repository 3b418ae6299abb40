//! The forward's side of the parallel backward: each replica's leaves (children of its
//! sentinel) for the tracked tensors it receives, and the caller's stand-ins (children of the
//! hub) for its outputs.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::ops::{Backward, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{FloatDType, TensorMetadata};

use crate::backend::{ConcatBackend, Part, ReplicaGraphs, join_all};

use super::hub::HubBackward;
use super::replica::{Key, SentinelBackward, StoreBackward};
use super::{Graphs, Leaf, State, TargetEntry, Tracked};

impl<B: ConcatBackend, C: CheckpointStrategy> Graphs<B, C> {
    /// A tracked `[1]` zeros tensor on `device` that starts a new graph.
    fn new_leaf(device: &B::Device) -> Tracked<B> {
        let zeros = B::float_zeros([1].into(), device, FloatDType::F32);
        <Autodiff<B, C> as AutodiffBackend>::from_inner(zeros).require_grad()
    }

    /// Replica `replica`'s sentinel, made on first use.
    pub(super) fn sentinel(&self, state: &mut State<B>, replica: usize) -> Tracked<B> {
        if let Some(sentinel) = &state.replicas[replica].sentinel {
            return sentinel.clone();
        }
        let leaf = Self::new_leaf(&self.setup.replicas[replica].1);
        let value = leaf.primitive.clone();
        let key = Key {
            graphs: self.me.clone(),
            replica,
            index: 0,
        };
        let sentinel = match SentinelBackward::<C>(core::marker::PhantomData)
            .prepare::<C>([leaf.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(key, value),
            OpsKind::UnTracked(prep) => prep.finish(value),
        };
        state.own.insert(leaf.node.id);
        state.own.insert(sentinel.node.id);
        state.replicas[replica].sentinel = Some(sentinel.clone());
        sentinel
    }

    /// The hub, made on first use: its parents are the targets that are not leaves and that
    /// some replica used; a fresh leaf when there is none. Drops the leaves' references.
    fn hub(&self, state: &mut State<B>) -> Tracked<B> {
        if let Some(hub) = &state.hub {
            return hub.clone();
        }
        let mut used = vec![false; state.targets.len()];
        for replica in &mut state.replicas {
            for leaf in &mut replica.leaves {
                if let Some(tensor) = leaf.tensor.take() {
                    leaf.used = used_by_forward(tensor);
                    used[leaf.target] |= leaf.used;
                }
            }
        }
        let mut parents: Vec<Tracked<B>> = Vec::new();
        for (target, used) in state.targets.iter_mut().zip(used) {
            // A leaf is what `require_grad` made (Burn's `Requirement::Grad`, the public
            // `is_require_grad`); a tracked tensor computed from others is not.
            let leaf = <Autodiff<B, C> as FloatTensorOps<_>>::float_is_require_grad(&target.tensor);
            target.linked = used && !leaf;
            if target.linked {
                parents.push(target.tensor.clone());
            }
        }
        if parents.is_empty() {
            parents.push(Self::new_leaf(&self.setup.replicas[0].1));
        }
        let parent = join_all::<B, C>(parents);
        let value = parent.primitive.clone();
        let graphs = self.me.upgrade().expect("alive while the forward runs");
        let hub = match HubBackward::<C>(core::marker::PhantomData)
            .prepare::<C>([parent.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(graphs, value),
            OpsKind::UnTracked(prep) => prep.finish(value),
        };
        state.hub = Some(hub.clone());
        hub
    }
}

/// Whether a replica's forward used `leaf` (the reference [`Graphs::leaf`] kept, taken once
/// the replicas' forwards have returned): the one decision of the parallel backward read off
/// Burn's autodiff internals, since Burn 0.21's public API does not list a node's children.
///
/// It relies on how Burn 0.21 holds graph nodes (`burn-autodiff` `ops/base.rs`,
/// `runtime/server.rs`): a node (`NodeRef`, an `Arc`) is held by each tensor that is it, by
/// the backward step registered for it, and by the step of every tracked operation that
/// takes it as a parent, for as long as the graph keeps that step. Once the replica's own
/// copies are dropped, a leaf is held by its step and by `leaf`: any third holder is an
/// operation of the forward that used it, or an output that is it. The test
/// `leaf_use_is_read_off_the_node_count` below fails if Burn changes that.
fn used_by_forward<B: ConcatBackend>(leaf: Tracked<B>) -> bool {
    Arc::strong_count(&leaf.node) > 2
}

impl<B: ConcatBackend, C: CheckpointStrategy> ReplicaGraphs<Autodiff<B, C>> for Graphs<B, C> {
    fn leaf(
        &self,
        replica: usize,
        value: Tracked<B>,
        target: &Tracked<B>,
        part: Part,
    ) -> Tracked<B> {
        if !target.is_tracked() {
            return value;
        }
        let shape = value.primitive.shape();
        let mut state = self.lock();
        let key = (target.node.id, matches!(part, Part::Rows { .. }));
        let count = self.setup.replicas.len();
        let t = match state.by_node.get(&key) {
            Some(&t) => t,
            None => {
                state.targets.push(TargetEntry {
                    tensor: target.clone(),
                    part,
                    shapes: vec![None; count],
                    linked: false,
                });
                let t = state.targets.len() - 1;
                state.by_node.insert(key, t);
                t
            }
        };
        state.targets[t].shapes[replica] = Some(shape);
        let sentinel = self.sentinel(&mut state, replica);
        let index = state.replicas[replica].leaves.len();
        let key = Key {
            graphs: self.me.clone(),
            replica,
            index,
        };
        let leaf = match StoreBackward::<C>(false, core::marker::PhantomData)
            .prepare::<C>([sentinel.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(key, value.primitive),
            OpsKind::UnTracked(prep) => prep.finish(value.primitive),
        };
        state.own.insert(leaf.node.id);
        state.replicas[replica].leaves.push(Leaf {
            target: t,
            tensor: Some(leaf.clone()),
            used: false,
            grad: None,
        });
        leaf
    }

    fn begin_forward(&self) {
        self.lock().mark = Some(NodeId::new().value);
    }

    fn output(&self, replica: usize, output: Tracked<B>) -> Tracked<B> {
        if !output.is_tracked() {
            return output;
        }
        let mut state = self.lock();
        if let Some(mark) = state.mark {
            let foreign = |id: NodeId| id.value < mark && !state.own.contains(&id);
            if foreign(output.node.id) || output.node.parents.iter().any(|p| foreign(p.id)) {
                state.captured.get_or_insert(replica);
            }
        }
        let hub = self.hub(&mut state);
        let outputs = &mut state.replicas[replica].outputs;
        let key = Key {
            graphs: self.me.clone(),
            replica,
            index: outputs.len(),
        };
        let value = output.primitive.clone();
        outputs.push((output, None));
        match StoreBackward::<C>(true, core::marker::PhantomData)
            .prepare::<C>([hub.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(key, value),
            OpsKind::UnTracked(prep) => prep.finish(value),
        }
    }

    fn seal(&self) -> Result<(), usize> {
        let mut state = self.lock();
        state.hub = None;
        for replica in &mut state.replicas {
            for leaf in &mut replica.leaves {
                leaf.tensor = None;
            }
        }
        match state.captured {
            Some(replica) => Err(replica),
            None => Ok(()),
        }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use burn::backend::Flex;
    use burn::backend::autodiff::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::ops::FloatTensorOps;
    use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

    use super::Graphs;
    use crate::backend::comm::ReduceBucket;
    use crate::backend::{Part, ReplicaGraphs, ReplicaRuntime, ReplicaSetup};

    type A = Autodiff<Flex>;

    struct NoRuntime;

    impl ReplicaRuntime for NoRuntime {
        fn spawn(&self, _: usize, job: Box<dyn FnOnce() + Send>) {
            job();
        }
        fn profiling(&self) -> bool {
            false
        }
        fn times_backwards(&self) -> bool {
            false
        }
        fn record_backward(&self, _: usize, _: Duration) {}
        fn record_transfer(&self, _: u64, _: Duration) {}
        fn record_hub(&self, _: Duration, _: Duration) {}
        fn record_bucket(&self, _: ReduceBucket) {}
    }

    /// The Burn 0.21 behaviour `used_by_forward` relies on: after the forward, a leaf that an
    /// operation took as a parent has a third holder, and one that was only read without
    /// tracking (detached, compared) or not at all has two, whether the operation's output is
    /// still alive or not.
    #[test]
    fn leaf_use_is_read_off_the_node_count() {
        let device = Default::default();
        let graphs = Graphs::<Flex, NoCheckpointing>::new(ReplicaSetup {
            replicas: vec![(0, device)],
            runtime: Arc::new(NoRuntime),
            reduce_bucket_size: None,
            backward_timeout: None,
        });
        let target = <A as AutodiffBackend>::from_inner(Flex::float_zeros(
            [2, 3].into(),
            &device,
            FloatDType::F32,
        ))
        .require_grad();
        let leaves: Vec<_> = (0..5)
            .map(|_| graphs.leaf(0, target.clone(), &target, Part::Whole))
            .collect();
        graphs.begin_forward();
        let [unused, detached, compared, kept, dropped] = <[_; 5]>::try_from(leaves).unwrap();
        let _ = A::float_detach(detached);
        let compared = Tensor::<A, 2>::from_primitive(TensorPrimitive::Float(compared));
        let _ = compared.greater_elem(0.0);
        let output = A::float_mul_scalar(kept, 2.0f32.into());
        drop(A::float_exp(dropped));
        drop(unused);
        let _ = graphs.output(0, output);
        let state = graphs.lock();
        let used: Vec<bool> = state.replicas[0].leaves.iter().map(|l| l.used).collect();
        assert_eq!(
            used,
            [false, false, false, true, true],
            "which leaves count as used"
        );
    }
}
