//! One autodiff graph per replica, and a backward that runs them on the replicas' worker
//! threads at the same time ([`ReplicaOps::replica_graphs`](crate::ReplicaOps::replica_graphs)
//! under `Autodiff`): the parallel backward.
//!
//! The files follow a gradient:
//!
//! 1. `forward.rs`, during the forward: a replica's forward starts from its own leaves, one
//!    per tracked tensor it receives (a parameter's copy, an input shard, a broadcast value),
//!    all children of the replica's *sentinel*. The caller's tensor each leaf copies is its
//!    *target*. The replica's outputs enter the caller's graph as *stand-ins*, children of one
//!    *hub* per forward, so no graph is shared between threads and Burn's graph locator never
//!    merges graphs concurrently.
//! 2. `replica.rs`, in the caller's backward: each stand-in stores its gradient; the hub,
//!    their common parent, runs after all of them (`hub.rs`) and starts one backward per
//!    replica that received a gradient, seeded with the stored gradients, on the replica's
//!    worker. A replica's leaves store their gradients there (several leaves of one target
//!    are added, on the hub's thread, in leaf order); its sentinel, one level below every
//!    leaf, reports the replica done.
//! 3. `overlap.rs`, while the replicas' backwards run (when the overlapped reduce is on):
//!    the hub sums each bucket of parameter gradients as soon as every replica has stored it.
//! 4. `hub.rs`, once every replica is done: the hub combines the rest per target
//!    (`comm::reduce_add_coalesced`: summed for
//!    parameters, rows concatenated for inputs) and registers each target's gradient in the
//!    caller's gradients.
//!
//! Where each sum happens: under this parallel backward, every sum over replicas is in
//! `comm` (`sum_flat` for the overlap's buckets, `reduce_add_coalesced` at the end); only a
//! replica's leaves of one target are added here first. Under the single backward (no
//! per-replica graphs), the replicas' forwards add to the caller's graph, and Burn's own
//! gradient registry adds each replica's gradient to a parameter as its backward step
//! reaches it (the backward of `comm`'s coalesced moves brings a device's pieces back in one
//! transfer first).
//!
//! The hub does not wait for the replicas' `backward` calls to return: they end with Burn's
//! graph cleanup, which waits for every graph, the caller's included, which the caller's own
//! backward holds until the hub returns. The hub is a child of the targets that are not
//! leaves and that some replica used (so that their own backward steps run after the hub
//! has registered their gradients): a target no replica used gets no gradient, as with the
//! bare model. `backend/join.rs` makes the one graph node with many parents that this needs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Instant;

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::Shape;
use burn::tensor::ops::FloatTensor;

use crate::backend::{ConcatBackend, Part, ReplicaSetup};

mod forward;
mod hub;
mod overlap;
mod replica;

use overlap::Overlap;

pub(super) type Tracked<B> = FloatTensor<Autodiff<B>>;

/// Per replica, the gradient each target received from it.
type PerReplica<B> = Vec<Vec<Option<FloatTensor<B>>>>;

/// The per-replica graphs of one forward.
pub(crate) struct Graphs<B: ConcatBackend, C: CheckpointStrategy> {
    setup: ReplicaSetup<Autodiff<B, C>>,
    state: Mutex<State<B>>,
    changed: Condvar,
    /// Set when the hub has given up on the replicas' backwards (after the setup's
    /// `backward_timeout`): a backward that starts after that gives up at once.
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

/// Where a replica's backward stands, as the replica reports it.
#[derive(Debug, Clone, PartialEq)]
enum Status {
    /// No backward this step (its stand-ins received no gradient).
    Idle,
    /// Handed to its worker, not running yet.
    Queued,
    /// Running on its worker, inside Burn's `backward()`, which has not yet run the root's
    /// step: it is taking its graph's lock and building its tape.
    Entered,
    /// Burn's `backward()` holds the graph and runs its steps.
    Started,
    Done,
    Failed(String),
}

impl Status {
    /// Whether the backward is still to come or under way.
    fn pending(&self) -> bool {
        matches!(self, Status::Queued | Status::Entered | Status::Started)
    }
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
}
