//! How the replicas of one forward are tied to the caller's autodiff graph: the one place that
//! decides it, for the input shards and broadcast copies the scatter makes, the parameter
//! copies the replicate stage makes and the outputs the gather takes back.
//!
//! - [`Ties::Shared`]: the replicas use the caller's graph nodes as they are (one replica, or
//!   no autodiff graph): Burn's backward of the caller's graph reaches them.
//! - [`Ties::Anchored`]: the single backward with several replicas. The replicas' forwards add
//!   to one graph from their threads; so that they never merge two graphs there (Burn 0.21's
//!   graph locator can lose a node registered by one thread while another merges its graph:
//!   a wrong gradient once in hundreds of steps, `tests/backends/races.rs`), the scatter keeps
//!   every tracked shard and copy it makes, and the replicate stage joins them, the
//!   module's trainable parameters (a node each) and the parameters' copies on other
//!   devices into one graph, with one join on the calling thread, before the replicas run.
//!   The copies on other devices are moved from the parameters themselves, not from their
//!   nodes, so that a parameter no replica's loss reaches gets no gradient through the
//!   transfer's backward (`backend/autodiff_broadcast.rs`), as on one device. (Joining each
//!   shard at once into the graph of a fresh anchor leaf instead gave 3 wrong rounds of 750
//!   in that test: the anchor, dropped after the forward, is an unused root that Burn's
//!   cleanup after another thread's backward removes from the graph locator, and with it,
//!   when it was the merged graph's origin, the locator's record of which nodes belong to
//!   that graph.)
//! - [`Ties::Graphs`]: the parallel backward. Every tracked tensor a replica receives becomes
//!   a leaf of the replica's own graph ([`ReplicaGraphs::leaf`]) and every output a stand-in
//!   in the caller's ([`ReplicaGraphs::output`]); see `backend/replica_graphs/`.
//! - [`Ties::Independent`]: burn-train's `TrainStep` on every replica. Parameters become fresh
//!   leaves tied to nothing; each replica's own step returns their gradients.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive, backend::Backend};

use crate::backend::{ConcatBackend, ConcatKind, Part, ReplicaGraphs, is_tracked};

/// Which backward follows a step's forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backward {
    /// The caller's `backward()` on the gathered output (the own training loop), on
    /// per-replica graphs where the backend and the settings allow.
    Caller,
    /// The caller's `backward()` over one graph for every replica, whose forwards run one at
    /// a time: the exact path, for a forward that may reach tracked tensors the wrapper does
    /// not hand out (a capturing closure, a value the scatter cannot see into).
    CallerOneGraph,
    /// Each replica's own training step (burn-train's `TrainStep`, feature `train`).
    #[cfg_attr(not(feature = "train"), allow(dead_code))]
    OwnStep,
}

/// How the replicas of one forward are tied to the caller's graph (see the module docs).
#[derive(Clone)]
pub(crate) enum Ties<B: Backend> {
    Shared,
    /// What the replicate stage joins into one graph before the replicas run.
    Anchored(Arc<Anchor<B>>),
    Graphs(Arc<dyn ReplicaGraphs<B>>),
    Independent,
}

impl<B: Backend> std::fmt::Debug for Ties<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Ties::Shared => "Shared",
            Ties::Anchored(_) => "Anchored",
            Ties::Graphs(_) => "Graphs",
            Ties::Independent => "Independent",
        };
        f.write_str(name)
    }
}

impl<B: ConcatBackend> Ties<B> {
    /// The ties of a step over `replicas` shards followed by `backward`, given the per-replica
    /// graphs it has (the parallel backward).
    pub(crate) fn new(
        backward: Backward,
        replicas: usize,
        graphs: Option<Arc<dyn ReplicaGraphs<B>>>,
    ) -> Self {
        match (backward, graphs) {
            (Backward::OwnStep, _) => Ties::Independent,
            (Backward::Caller, Some(graphs)) => Ties::Graphs(graphs),
            (Backward::Caller | Backward::CallerOneGraph, _) if replicas > 1 => {
                Ties::Anchored(Arc::new(Anchor {
                    nodes: Mutex::default(),
                    leaves: Mutex::default(),
                }))
            }
            (Backward::Caller | Backward::CallerOneGraph, _) => Ties::Shared,
        }
    }
}

impl<B: Backend> Ties<B> {
    /// The per-replica graphs, under the parallel backward.
    pub(crate) fn graphs(&self) -> Option<&dyn ReplicaGraphs<B>> {
        match self {
            Ties::Graphs(graphs) => Some(graphs.as_ref()),
            _ => None,
        }
    }

    /// What the scatter splits or copies of the caller's `tensor`: its values alone where
    /// each replica's piece starts a graph of its own, otherwise the tensor itself.
    pub(crate) fn source<const D: usize, K: ConcatKind<B>>(
        &self,
        tensor: &Tensor<B, D, K>,
    ) -> Tensor<B, D, K> {
        match self {
            Ties::Graphs(_) => K::detach(tensor.clone()),
            _ => tensor.clone(),
        }
    }

    /// Replica `replica`'s `piece` (on its device) of the caller's `source` (rows along a
    /// dimension or the whole tensor, as `part` says), tied to the caller's graph.
    pub(crate) fn input<const D: usize, K: ConcatKind<B>>(
        &self,
        piece: Tensor<B, D, K>,
        source: &Tensor<B, D, K>,
        replica: usize,
        part: Part,
    ) -> Tensor<B, D, K> {
        match self {
            Ties::Graphs(graphs) => K::replica_leaf(piece, source, graphs.as_ref(), replica, part),
            Ties::Anchored(anchor) => {
                if let Some(tracked) = K::tracked_float(&piece) {
                    lock(&anchor.nodes).push(tracked);
                }
                piece
            }
            Ties::Shared | Ties::Independent => piece,
        }
    }

    /// The caller's tensor for replica `replica`'s `output`.
    pub(crate) fn output<const D: usize, K: ConcatKind<B>>(
        &self,
        output: Tensor<B, D, K>,
        replica: usize,
    ) -> Tensor<B, D, K> {
        match self {
            Ties::Graphs(graphs) => K::replica_output(output, graphs.as_ref(), replica),
            _ => output,
        }
    }
}

impl<B: ConcatBackend> Ties<B> {
    /// Whether the replicas' parameter copies are the module's own graph nodes, moved with a
    /// differentiable transfer (otherwise copies carry plain values and get leaves of their
    /// own from [`parameters`](Self::parameters)).
    pub(crate) fn shares_nodes(&self) -> bool {
        matches!(self, Ties::Shared | Ties::Anchored(_))
    }

    /// The module the replicas are copied from: under [`Ties::Anchored`], a clone whose
    /// trainable parameters each have a graph node (a free reshape each), kept for
    /// [`join`](Self::join) with the tracked shards and copies the scatter made, the
    /// parameters themselves kept for the copies on other devices
    /// ([`leaves`](Self::leaves)).
    pub(crate) fn module<M: Module<B>>(&self, module: &M) -> M {
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
    /// gradient gets none (`backend/autodiff_broadcast.rs`), as on one device.
    pub(crate) fn leaves(&self) -> Option<HashMap<ParamId, FloatTensor<B>>> {
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
    pub(crate) fn join<'a, M: Module<B> + 'a>(&self, moved: impl IntoIterator<Item = &'a M>) {
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
    pub(crate) fn targets<M: Module<B>>(&self, module: &M) -> Targets<B> {
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
    pub(crate) fn parameters<M: Module<B>>(
        &self,
        copy: M,
        replica: usize,
        targets: &Targets<B>,
    ) -> M {
        match self {
            Ties::Shared | Ties::Anchored(_) => copy,
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

/// What [`Ties::Anchored`] keeps between the scatter, the replicate stage and the join.
pub(crate) struct Anchor<B: Backend> {
    /// The tracked shards and copies the scatter made, and the parameters' nodes.
    nodes: Mutex<Vec<FloatTensor<B>>>,
    /// The module's trainable parameters before they were given nodes, by id.
    leaves: Mutex<HashMap<ParamId, FloatTensor<B>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

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
