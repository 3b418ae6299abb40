//! How the replicas of one forward are tied to the caller's autodiff graph: the one place that
//! decides it, for the input shards and broadcast copies the scatter makes, the parameter
//! copies the replicate stage makes and the outputs the gather takes back.
//!
//! - [`Ties::Caller`]: the replicas use the caller's graph nodes as they are (one replica, or
//!   no autodiff graph): Burn's backward of the caller's graph reaches them.
//! - [`Ties::Anchored`]: the single backward with several replicas (and the exact path).
//!   The replicas' forwards add to one graph from their threads, and Burn 0.21's graph
//!   locator can lose a node registered by one thread while another merges graphs, so
//!   everything the replicas start from (the tracked shards and copies the scatter made, a
//!   node per trainable parameter, the copies moved to other devices) is joined into one graph
//!   on the calling thread before they run. Copies on other devices are moved from the
//!   parameters themselves, so that a parameter no replica's loss reaches gets no gradient
//!   through the transfer's backward, as on one device. (`tests/backends/races.rs` stresses
//!   it.)
//! - [`Ties::Graphs`]: the parallel backward. Every tracked tensor a replica receives becomes
//!   a leaf of the replica's own graph ([`ReplicaGraphs::leaf`]) and every output a stand-in
//!   in the caller's ([`ReplicaGraphs::output`]); see `backward/graphs/`.
//! - [`Ties::Independent`]: burn-train's `TrainStep` on every replica. Parameters become fresh
//!   leaves tied to nothing; each replica's own step returns their gradients.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use burn::module::ParamId;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, backend::Backend};

use crate::backend::{ConcatBackend, ConcatKind, Part, ReplicaGraphs};

mod module;

/// A step's path: which backward follows its forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// The caller's `backward()` on the gathered output (the own training loop), on
    /// per-replica graphs where the backend and the settings allow.
    Fast,
    /// The caller's `backward()` over one graph for every replica, whose forwards run one at
    /// a time: for a forward that may reach tracked tensors the wrapper does not hand out (a
    /// capturing closure, a value the scatter cannot see into).
    Exact,
    /// Each replica's own training step (burn-train's `TrainStep`, feature `train`).
    #[cfg_attr(not(feature = "train"), allow(dead_code))]
    OwnStep,
}

/// How the replicas of one forward are tied to the caller's graph (see the module docs).
#[derive(Clone)]
pub(crate) enum Ties<B: Backend> {
    Caller,
    /// What the replicate stage joins into one graph before the replicas run.
    Anchored(Arc<Anchor<B>>),
    Graphs(Arc<dyn ReplicaGraphs<B>>),
    Independent,
}

impl<B: Backend> std::fmt::Debug for Ties<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Ties::Caller => "Caller",
            Ties::Anchored(_) => "Anchored",
            Ties::Graphs(_) => "Graphs",
            Ties::Independent => "Independent",
        };
        f.write_str(name)
    }
}

impl<B: ConcatBackend> Ties<B> {
    /// The ties of a step over `replicas` shards on `path`, given the per-replica graphs it
    /// has (the parallel backward).
    pub(crate) fn new(
        path: Path,
        replicas: usize,
        graphs: Option<Arc<dyn ReplicaGraphs<B>>>,
    ) -> Self {
        match (path, graphs) {
            (Path::OwnStep, _) => Ties::Independent,
            (Path::Fast, Some(graphs)) => Ties::Graphs(graphs),
            (Path::Fast | Path::Exact, _) if replicas > 1 => Ties::Anchored(Arc::new(Anchor {
                nodes: Mutex::default(),
                leaves: Mutex::default(),
            })),
            (Path::Fast | Path::Exact, _) => Ties::Caller,
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
            Ties::Caller | Ties::Independent => piece,
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

thread_local! {
    /// The ties of the step whose scatter or gather runs on this thread ([`within`]).
    static CURRENT: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Runs `f` (a step's scatter or gather, on the calling thread) with `ties` as the ties of
/// the tensors the crate's [`Scatter`](crate::Scatter) and [`Gather`](crate::Gather) impls
/// make: the graph policy travels beside the public [`Shards`](crate::Shards), which is the
/// split plan alone.
pub(crate) fn within<B: Backend, T>(ties: &Ties<B>, f: impl FnOnce() -> T) -> T {
    let previous = CURRENT.with(|current| current.replace(Some(Box::new(ties.clone()))));
    let output = f();
    CURRENT.with(|current| *current.borrow_mut() = previous);
    output
}

/// The ties set by [`within`] on this thread; [`Ties::Caller`] outside a step (a `Scatter`
/// or `Gather` called on its own).
pub(crate) fn current<B: Backend>() -> Ties<B> {
    CURRENT.with(|current| {
        (current.borrow().as_ref())
            .and_then(|ties| ties.downcast_ref::<Ties<B>>())
            .cloned()
            .unwrap_or(Ties::Caller)
    })
}

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
