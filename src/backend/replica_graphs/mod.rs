//! One autodiff graph per replica, and a backward that runs them on the replicas' worker
//! threads at the same time ([`ConcatBackend::replica_graphs`] under `Autodiff`).
//!
//! A replica's forward starts from its own leaves: one per tracked tensor it receives (a
//! parameter's copy, an input shard, a broadcast value), all children of the replica's
//! *sentinel*. The caller's tensor each leaf copies is its *target*. The replica's outputs
//! enter the caller's graph as *stand-ins*, children of one *hub* per forward, so no graph is
//! shared between threads and Burn's graph locator never merges graphs concurrently.
//!
//! In the caller's backward, each stand-in stores its gradient; the hub, their common parent,
//! runs after all of them and starts one backward per replica that received a gradient,
//! seeded with the stored gradients, on the replica's worker (or on another thread kept for
//! that worker, when a backward started earlier in the same caller's backward still occupies
//! it). A replica's leaves store their gradients; its sentinel, one level below every leaf,
//! reports the replica done. The hub then combines the gradients per target
//! ([`comm::reduce_add_coalesced`]: summed for parameters, rows concatenated for inputs) and
//! registers them for the targets in the caller's gradients.
//!
//! The hub does not wait for the replicas' `backward` calls to return: they end with Burn's
//! graph cleanup, which waits for every graph, the caller's included, which the caller's own
//! backward holds until the hub returns. The hub is a child of the targets that are not
//! leaves and that some replica used (so that their own backward steps run after the hub
//! has registered their gradients): a target no replica used gets no gradient, as with the
//! bare model.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::ops::{Backward, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Shape, TensorMetadata};

use super::{ConcatBackend, Part, ReplicaGraphs, ReplicaSetup};

mod backward;
mod overlap;
mod steps;

use overlap::Overlap;
pub(super) use steps::join;
use steps::{HubBackward, Key, SentinelBackward, StoreBackward};

pub(super) type Tracked<B> = FloatTensor<Autodiff<B>>;

/// Per replica, the gradient each target received from it.
type PerReplica<B> = Vec<Vec<Option<FloatTensor<B>>>>;

/// How long a replica's backward may wait for its graph before the hub gives up on it: it
/// only waits when another backward holds the graph, which means that the replica's forward
/// merged its graph with a graph outside it (a captured tracked tensor).
const START_LIMIT: Duration = Duration::from_secs(10);

/// The per-replica graphs of one forward.
pub(crate) struct Graphs<B: ConcatBackend, C: CheckpointStrategy> {
    setup: ReplicaSetup<Autodiff<B, C>>,
    state: Mutex<State<B>>,
    changed: Condvar,
    /// Set when the hub has given up on replicas whose backward did not start.
    cancelled: AtomicBool,
    /// This value, for the backward steps of leaves, sentinels and roots (weak: those steps
    /// live in the replicas' graphs, which this value keeps alive).
    me: Weak<Self>,
}

struct State<B: ConcatBackend> {
    targets: Vec<TargetEntry<B>>,
    by_node: HashMap<(NodeId, bool), usize>,
    replicas: Vec<Replica<B>>,
    /// The caller's graph node that every stand-in hangs from; dropped by `seal`.
    hub: Option<Tracked<B>>,
    /// The ids of this forward's own nodes made before the replicas ran (leaves, sentinels).
    own: HashSet<NodeId>,
    /// The first node id of the replicas' forwards.
    mark: Option<u64>,
    /// The first replica whose outputs use a tracked tensor it did not receive.
    captured: Option<usize>,
    status: Vec<Status>,
    started_at: Option<Instant>,
    /// The buckets of the backward running now, when its reduce overlaps it.
    overlap: Option<Overlap<B::Device>>,
}

/// A tensor of the caller's graph that replicas copy.
struct TargetEntry<B: ConcatBackend> {
    tensor: Tracked<B>,
    part: Part,
    /// Each replica's piece of it (rows targets), for zeros where a replica has no gradient.
    shapes: Vec<Option<Shape>>,
    /// Whether the hub is its child (a used target that is not a leaf).
    linked: bool,
}

#[derive(Default)]
struct Replica<B: ConcatBackend> {
    sentinel: Option<Tracked<B>>,
    leaves: Vec<Leaf<B>>,
    /// Each output and the gradient its stand-in received.
    outputs: Vec<(Tracked<B>, Option<FloatTensor<B>>)>,
}

struct Leaf<B: ConcatBackend> {
    target: usize,
    /// The leaf itself until the hub is made, to see whether the replica used it.
    tensor: Option<Tracked<B>>,
    /// Whether the replica's forward used it (known once the hub is made).
    used: bool,
    grad: Option<FloatTensor<B>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Status {
    Idle,
    Queued,
    Started,
    Done,
    Failed(String),
}

impl<B: ConcatBackend, C: CheckpointStrategy> std::fmt::Debug for Graphs<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplicaGraphs({} replicas)", self.setup.replicas.len())
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> Graphs<B, C> {
    pub(crate) fn new(setup: ReplicaSetup<Autodiff<B, C>>) -> Arc<Self> {
        let count = setup.replicas.len();
        Arc::new_cyclic(|me| Self {
            setup,
            state: Mutex::new(State {
                targets: Vec::new(),
                by_node: HashMap::new(),
                replicas: (0..count).map(|_| Replica::default()).collect(),
                hub: None,
                own: HashSet::new(),
                mark: None,
                captured: None,
                status: vec![Status::Idle; count],
                started_at: None,
                overlap: None,
            }),
            changed: Condvar::new(),
            cancelled: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A tracked `[1]` zeros tensor on `device` that starts a new graph.
    fn new_leaf(device: &B::Device) -> Tracked<B> {
        let zeros = B::float_zeros([1].into(), device, FloatDType::F32);
        <Autodiff<B, C> as AutodiffBackend>::from_inner(zeros).require_grad()
    }

    /// Replica `replica`'s sentinel, made on first use.
    fn sentinel(&self, state: &mut State<B>, replica: usize) -> Tracked<B> {
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
        // A leaf is held by its own backward step and by the reference kept here; any other
        // holder is a step of the replica's forward that used it (or an output that is it).
        let mut used = vec![false; state.targets.len()];
        for replica in &mut state.replicas {
            for leaf in &mut replica.leaves {
                if let Some(tensor) = leaf.tensor.take() {
                    leaf.used = Arc::strong_count(&tensor.node) > 2;
                    used[leaf.target] |= leaf.used;
                }
            }
        }
        let mut parents: Vec<Tracked<B>> = Vec::new();
        for (target, used) in state.targets.iter_mut().zip(used) {
            target.linked = used && !target.tensor.node.parents.is_empty();
            if target.linked {
                parents.push(target.tensor.clone());
            }
        }
        if parents.is_empty() {
            parents.push(Self::new_leaf(&self.setup.replicas[0].1));
        }
        while parents.len() > 1 {
            parents = parents
                .chunks(super::MAX_TRACKED_INPUTS)
                .map(|group| join::<B, C>(group.to_vec()))
                .collect();
        }
        let parent = parents.pop().expect("one parent");
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
