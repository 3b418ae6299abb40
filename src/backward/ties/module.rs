//! How the replicate stage's copies of a module are tied to the module's parameters
//! ([`Ties::prepare`]): the same graph nodes, leaves of each replica's graph, or fresh
//! leaves.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive, backend::Backend};

use super::{Ties, lock};
use crate::backend::{ConcatBackend, Part, ReplicaGraphs, is_tracked};

/// A module as the replicate stage copies it, with what the ties need to tie the copies
/// ([`Ties::prepare`]).
pub(crate) struct Tied<B: Backend, M> {
    ties: Ties<B>,
    /// The module the copies start from: under [`Ties::Anchored`], a clone whose trainable
    /// parameters each have a graph node.
    pub(crate) module: M,
    /// Under [`Ties::Anchored`], the trainable parameters before they were given nodes, by
    /// id: the copies on other devices are moved from these
    /// ([`leaves`](Ties::leaves)).
    pub(crate) leaves: Option<HashMap<ParamId, FloatTensor<B>>>,
    targets: Targets<B>,
}

impl<B: ConcatBackend> Ties<B> {
    /// `module` prepared for the replicate stage, once per step.
    pub(crate) fn prepare<M: Module<B>>(&self, module: &M) -> Tied<B, M> {
        let module = self.module(module);
        Tied {
            leaves: self.leaves(),
            targets: self.targets(&module),
            module,
            ties: self.clone(),
        }
    }
}

impl<B: ConcatBackend, M: Module<B>> Tied<B, M> {
    /// Whether the replicas' parameter copies are the module's own graph nodes, moved with a
    /// differentiable transfer (otherwise copies carry plain values and get leaves of their
    /// own from [`parameters`](Self::parameters)).
    pub(crate) fn shares_nodes(&self) -> bool {
        matches!(self.ties, Ties::Caller | Ties::Anchored(_))
    }

    /// Replica `replica`'s `copy` of the module, tied as [`Ties::parameters`] says.
    pub(crate) fn parameters(&self, copy: M, replica: usize) -> M {
        self.ties.parameters(copy, replica, &self.targets)
    }

    /// Joins the step's graph before the replicas run ([`Ties::join`]), with `moved`, the
    /// copies moved to other devices.
    pub(crate) fn join<'a>(&self, moved: impl IntoIterator<Item = &'a M>)
    where
        M: 'a,
    {
        self.ties.join(moved)
    }
}

impl<B: ConcatBackend> Ties<B> {
    /// Whether the replicas' parameter copies are the module's own graph nodes.
    fn shares_nodes(&self) -> bool {
        matches!(self, Ties::Caller | Ties::Anchored(_))
    }

    /// The module the replicas are copied from: under [`Ties::Anchored`], a clone whose
    /// trainable parameters each have a graph node (a free reshape each), kept for
    /// [`join`](Self::join) with the tracked shards and copies the scatter made, the
    /// parameters themselves kept for the copies on other devices
    /// ([`leaves`](Self::leaves)).
    fn module<M: Module<B>>(&self, module: &M) -> M {
        let Ties::Anchored(anchor) = self else {
            return module.clone();
        };
        let mut nodes = AnchorNodes {
            nodes: Vec::new(),
            leaves: HashMap::new(),
        };
        let module = module.clone().map(&mut nodes);
        lock(&anchor.nodes).extend(nodes.nodes);
        *lock(&anchor.leaves) = nodes.leaves;
        module
    }

    /// Under [`Ties::Anchored`], the module's trainable parameters as they were before
    /// [`module`](Self::module) gave them nodes of their own, by id: the copies on other
    /// devices are moved from these, so that a parameter none of whose copies receives a
    /// gradient gets none (`backend/autodiff_coalesced.rs`), as on one device.
    fn leaves(&self) -> Option<HashMap<ParamId, FloatTensor<B>>> {
        match self {
            Ties::Anchored(anchor) => Some(lock(&anchor.leaves).clone()),
            _ => None,
        }
    }

    /// Under [`Ties::Anchored`], joins into one graph, on the calling thread and before the
    /// replicas run, everything the replicas' forwards start from: the parameters' nodes, the
    /// tracked shards and copies the scatter made, and the tracked parameters of `moved`, the
    /// copies moved to other devices (new nodes), taken from the iterator only here. One join
    /// node per 16 parents, no kernel; the join is never part of a backward.
    fn join<'a, M: Module<B> + 'a>(&self, moved: impl IntoIterator<Item = &'a M>) {
        let Ties::Anchored(anchor) = self else {
            return;
        };
        let mut nodes = std::mem::take(&mut *lock(&anchor.nodes));
        for copy in moved {
            let mut tracked = TrackedFloats {
                found: HashMap::new(),
            };
            copy.visit(&mut tracked);
            nodes.extend(tracked.found.into_values().filter_map(|value| match value {
                TensorPrimitive::Float(node) => Some(node),
                TensorPrimitive::QFloat(_) => None,
            }));
        }
        if nodes.len() >= 2 {
            B::float_join_graphs(nodes);
        }
    }

    /// The module's tracked float parameters by id, for [`parameters`](Self::parameters):
    /// none where the copies share the module's nodes.
    fn targets<M: Module<B>>(&self, module: &M) -> Targets<B> {
        let mut tracked = TrackedFloats {
            found: HashMap::new(),
        };
        if !self.shares_nodes() {
            module.visit(&mut tracked);
        }
        Targets(tracked.found)
    }

    /// Replica `replica`'s `copy` of the module with every trainable parameter a leaf of the
    /// replica's own graph: one whose gradient goes to the module's parameter (the parallel
    /// backward), or a fresh one (each replica's own step). The copy itself where the copies
    /// share the module's nodes.
    fn parameters<M: Module<B>>(&self, copy: M, replica: usize, targets: &Targets<B>) -> M {
        match self {
            Ties::Caller | Ties::Anchored(_) => copy,
            // With the per-replica graphs, leaves whose gradients go to the module's; without
            // (each replica's own step), fresh ones.
            Ties::Graphs(_) | Ties::Independent => copy.map(&mut Leaves {
                graphs: self.graphs(),
                replica,
                targets: &targets.0,
            }),
        }
    }
}

/// The module's tracked float parameters (trainable leaves, and tensors computed from them).
pub(crate) struct Targets<B: Backend>(HashMap<ParamId, TensorPrimitive<B>>);

/// Gives trainable parameters a graph node each and keeps those nodes, and the parameters
/// as they were.
struct AnchorNodes<B: Backend> {
    nodes: Vec<FloatTensor<B>>,
    leaves: HashMap<ParamId, FloatTensor<B>>,
}

impl<B: ConcatBackend> ModuleMapper<B> for AnchorNodes<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let tensor = param.val();
        if !is_tracked(&tensor) || tensor.shape().num_elements() == 0 {
            return param;
        }
        if let TensorPrimitive::Float(leaf) = tensor.into_primitive() {
            self.leaves.insert(param.id, leaf);
        }
        param.map(|tensor| {
            let dims = tensor.dims();
            let node = tensor.reshape(dims);
            // Quantized parameters are not trained; only float nodes need joining.
            if let TensorPrimitive::Float(primitive) = node.clone().into_primitive() {
                self.nodes.push(primitive);
            }
            node
        })
    }
}

/// Collects the tracked float parameters by id.
struct TrackedFloats<B: Backend> {
    found: HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: ConcatBackend> ModuleVisitor<B> for TrackedFloats<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        if is_tracked(&tensor) {
            self.found.insert(param.id, tensor.into_primitive());
        }
    }
}

/// Makes a replica's copy of every trainable parameter a leaf of the replica's own graph:
/// with `graphs`, one whose gradient goes to the module's parameter; without, a fresh one.
struct Leaves<'a, B: Backend> {
    graphs: Option<&'a dyn ReplicaGraphs<B>>,
    replica: usize,
    targets: &'a HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: ConcatBackend> ModuleMapper<B> for Leaves<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(target) = self.targets.get(&param.id) else {
            return param;
        };
        let Some(graphs) = self.graphs else {
            // A new node for each replica: replicas that share a device share the copy's
            // tensors, and a graph shared between threads would be merged by Burn while
            // another replica's backward holds it (a lock-order deadlock in Burn 0.21).
            let trainable = match target {
                TensorPrimitive::Float(target) => B::float_is_require_grad(target),
                TensorPrimitive::QFloat(_) => false,
            };
            return param.map(|value| match trainable {
                true => value.detach().require_grad(),
                // Computed from a trainable leaf (not one itself): the copy too, so that the
                // replica's own step finds no gradient for it, as the bare model's does.
                false => value.detach().require_grad().mul_scalar(1.0),
            });
        };
        param.map(|value| match (value.into_primitive(), target) {
            (TensorPrimitive::Float(value), TensorPrimitive::Float(target)) => {
                Tensor::from_primitive(TensorPrimitive::Float(graphs.leaf(
                    self.replica,
                    value,
                    target,
                    Part::Whole,
                )))
            }
            (value, _) => Tensor::from_primitive(value),
        })
    }
}
