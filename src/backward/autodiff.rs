//! [`ReplicaOps`] for Burn's `Autodiff`: the per-replica graphs of the parallel backward
//! where the inner backend allows concurrent backwards, and the join that gives the single
//! backward one graph.

use std::sync::Arc;

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::ops::FloatTensor;

use super::graphs::Graphs;
use crate::backend::{ConcatBackend, ReplicaGraphs, ReplicaOps, ReplicaSetup, join_all};

impl<B: ConcatBackend, C: CheckpointStrategy> ReplicaOps for Autodiff<B, C> {
    fn float_is_tracked(tensor: &FloatTensor<Self>) -> bool {
        tensor.is_tracked()
    }

    fn concurrent_backward() -> bool {
        B::concurrent_backward()
    }

    fn fusion_half_precision() -> bool {
        B::fusion_half_precision()
    }

    fn replica_graphs(setup: ReplicaSetup<Self>) -> Option<Arc<dyn ReplicaGraphs<Self>>> {
        if !B::concurrent_backward() {
            return None;
        }
        Some(Graphs::<B, C>::new(setup))
    }

    fn float_join_graphs(tensors: Vec<FloatTensor<Self>>) {
        if tensors.len() > 1 {
            join_all::<B, C>(tensors);
        }
    }
}
