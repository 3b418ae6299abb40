//! One autodiff graph per replica, and a backward that runs them on the replicas' worker
//! threads at the same time ([`ConcatBackend::replica_graphs`] under `Autodiff`).
//!
//! A replica's forward starts from its own leaves: one *tap* per tracked input (a parameter's
//! copy, an input shard), all children of the replica's *sentinel* node. The replica's
//! outputs enter the caller's graph as *stand-ins*, children of one *hub* node, so no graph
//! is shared between threads and Burn's graph locator never merges graphs concurrently.
//!
//! The backward of a stand-in stores its gradient; the hub's backward, which Burn runs after
//! all of them (it is their parent), starts one backward per replica on the replica's
//! worker, seeded with the stored gradients. A replica's taps store their gradients, and its
//! sentinel (one level below every tap, so it runs last) reports the replica done. The hub
//! then sums the gradients per target, moving each replica's set to the target's device in
//! one transfer per dtype, and registers them for the targets in the caller's gradients.
//!
//! The hub does not wait for the replicas' `backward` calls to return: those end with Burn's
//! graph cleanup, which waits for the caller's graph, locked by the caller's own backward
//! until the hub returns.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Instant;

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{FloatDType, TensorMetadata};

use super::{ConcatBackend, ReplicaGraphs, ReplicaSetup};
use crate::profile;

type Tracked<B> = FloatTensor<Autodiff<B>>;

/// A tracked tensor and the gradient received for it, if any.
type WithGrad<B> = (Tracked<B>, Option<FloatTensor<B>>);

/// The per-replica graphs of one forward.
pub(crate) struct Graphs<B: ConcatBackend, C: CheckpointStrategy> {
    setup: ReplicaSetup<B>,
    state: Mutex<State<B>>,
    done: Condvar,
    _strategy: core::marker::PhantomData<C>,
    /// This value, for the taps' and sentinels' backward steps (weak: those steps live in
    /// the replicas' graphs, which this value keeps alive).
    me: Weak<Self>,
}

struct State<B: ConcatBackend> {
    replicas: Vec<Replica<B>>,
    /// The caller's graph node that every stand-in hangs from; dropped by `seal`.
    hub: Option<Tracked<B>>,
    /// Replicas whose backward has not reported yet, in the running backward.
    pending: usize,
    /// The first replica backward that panicked, with its message.
    failed: Option<(usize, String)>,
    /// When the running backward started, if the step is profiled.
    started: Option<Instant>,
}

#[derive(Default)]
struct Replica<B: ConcatBackend> {
    sentinel: Option<Tracked<B>>,
    /// The tracked tensor each tap sends its gradient to, and the gradient received.
    taps: Vec<WithGrad<B>>,
    /// Each output and the gradient its stand-in received.
    outputs: Vec<WithGrad<B>>,
}

impl<B: ConcatBackend> Default for State<B> {
    fn default() -> Self {
        Self {
            replicas: Vec::new(),
            hub: None,
            pending: 0,
            failed: None,
            started: None,
        }
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> std::fmt::Debug for Graphs<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplicaGraphs")
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> Graphs<B, C> {
    pub(crate) fn new(setup: ReplicaSetup<B>) -> Arc<Self> {
        let count = setup.replicas.len();
        Arc::new_cyclic(|me| Self {
            setup,
            state: Mutex::new(State {
                replicas: (0..count).map(|_| Replica::default()).collect(),
                ..State::default()
            }),
            done: Condvar::new(),
            _strategy: core::marker::PhantomData,
            me: me.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A tracked `[1]` zeros tensor on `device` that starts a new graph.
    fn leaf(device: &B::Device) -> Tracked<B> {
        let zeros = B::float_zeros([1].into(), device, FloatDType::F32);
        <Autodiff<B, C> as AutodiffBackend>::from_inner(zeros).require_grad()
    }

    /// Replica `replica`'s sentinel, made on first use.
    fn sentinel(&self, state: &mut State<B>, replica: usize) -> Tracked<B> {
        let device = &self.setup.replicas[replica].1;
        state.replicas[replica]
            .sentinel
            .get_or_insert_with(|| {
                let leaf = Self::leaf(device);
                let value = leaf.primitive.clone();
                let done = Done {
                    graphs: self.me.clone(),
                    replica,
                };
                match SentinelBackward::<C>(core::marker::PhantomData)
                    .prepare::<C>([leaf.node])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(done, value),
                    OpsKind::UnTracked(prep) => prep.finish(value),
                }
            })
            .clone()
    }

    /// The hub, made on first use: its parents are the taps' targets that are not leaves
    /// (input shards), so that their own backward steps run after the hub has registered
    /// their gradients; a fresh leaf when there is none.
    fn hub(&self, state: &mut State<B>) -> Tracked<B> {
        if let Some(hub) = &state.hub {
            return hub.clone();
        }
        let mut parents: Vec<Tracked<B>> = state
            .replicas
            .iter()
            .flat_map(|replica| replica.taps.iter().map(|(target, _)| target))
            .filter(|target| !target.node.parents.is_empty())
            .cloned()
            .collect();
        if parents.is_empty() {
            let (_, device) = &self.setup.replicas[0];
            parents.push(Self::leaf(device));
        }
        while parents.len() > 1 {
            parents = parents
                .chunks(super::MAX_TRACKED_INPUTS)
                .map(|group| super::autodiff::join::<B, C>(group.to_vec()))
                .collect();
        }
        let parent = parents.pop().expect("one parent");
        let value = parent.primitive.clone();
        let hub = match HubBackward::<C>(core::marker::PhantomData)
            .prepare::<C>([parent.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(self.me.upgrade().expect("alive"), value),
            OpsKind::UnTracked(prep) => prep.finish(value),
        };
        state.hub = Some(hub.clone());
        hub
    }

    /// Runs every replica's backward from its stored output gradients and returns, per
    /// replica, each tap's target and gradient.
    fn run_backward(&self) -> Vec<Vec<WithGrad<B>>> {
        let mut state = self.lock();
        let mut jobs: Vec<(usize, crate::parallel_apply::Detached)> = Vec::new();
        for (index, replica) in state.replicas.iter_mut().enumerate() {
            let seeds: Vec<(Tracked<B>, FloatTensor<B>)> = replica
                .outputs
                .iter_mut()
                .filter_map(|(output, grad)| grad.take().map(|grad| (output.clone(), grad)))
                .collect();
            let Some(sentinel) = replica.sentinel.clone() else {
                continue;
            };
            if seeds.is_empty() {
                continue;
            }
            let graphs = self.me.clone();
            let slot = self.setup.replicas[index].0;
            jobs.push((
                slot,
                Box::new(move || {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        replica_backward::<B, C>(seeds, sentinel)
                    }));
                    if let (Err(payload), Some(graphs)) = (run, graphs.upgrade()) {
                        graphs.report(index, Some(crate::error::panic_message(payload.as_ref())));
                    }
                }),
            ));
        }
        state.pending = jobs.len();
        state.failed = None;
        state.started = self.setup.sink.as_ref().map(|_| Instant::now());
        if !jobs.is_empty() {
            (self.setup.spawner)(jobs);
        }
        while state.pending > 0 && state.failed.is_none() {
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if let Some((replica, message)) = state.failed.take() {
            drop(state);
            panic!("the backward of replica {replica} panicked: {message}");
        }
        state
            .replicas
            .iter_mut()
            .map(|replica| std::mem::take(&mut replica.taps))
            .collect()
    }

    /// A replica's backward is over (`failure`: it panicked with this message).
    fn report(&self, replica: usize, failure: Option<String>) {
        let started = self.lock().started;
        if let (None, Some(sink), Some(started)) = (&failure, &self.setup.sink, started) {
            let device = &self.setup.replicas[replica].1;
            profile::replica_backward::<B>(sink, replica, device, started);
        }
        let mut state = self.lock();
        match failure {
            Some(message) => {
                state.failed.get_or_insert((replica, message));
            }
            None => state.pending = state.pending.saturating_sub(1),
        }
        self.done.notify_all();
    }

    /// Adds `grad` to what `slot` of replica `replica` has received.
    fn store(&self, replica: usize, slot: Slot, index: usize, grad: FloatTensor<B>) {
        let mut state = self.lock();
        let replica = &mut state.replicas[replica];
        let list = match slot {
            Slot::Tap => &mut replica.taps,
            Slot::Output => &mut replica.outputs,
        };
        let stored = &mut list[index].1;
        *stored = Some(match stored.take() {
            Some(previous) => B::float_add(previous, grad),
            None => grad,
        });
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> ReplicaGraphs<Autodiff<B, C>> for Graphs<B, C> {
    fn input(&self, replica: usize, value: Tracked<B>, target: &Tracked<B>) -> Tracked<B> {
        if !target.is_tracked() {
            return value;
        }
        let mut state = self.lock();
        let sentinel = self.sentinel(&mut state, replica);
        let taps = &mut state.replicas[replica].taps;
        let tap = Tap {
            graphs: self.me.clone(),
            replica,
            slot: Slot::Tap,
            index: taps.len(),
        };
        taps.push((target.clone(), None));
        match StoreBackward::<C>(core::marker::PhantomData)
            .prepare::<C>([sentinel.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(tap, value.primitive),
            OpsKind::UnTracked(prep) => prep.finish(value.primitive),
        }
    }

    fn output(&self, replica: usize, output: Tracked<B>) -> Tracked<B> {
        if !output.is_tracked() {
            return output;
        }
        let mut state = self.lock();
        let hub = self.hub(&mut state);
        let outputs = &mut state.replicas[replica].outputs;
        let stand_in = Tap {
            graphs: self.me.clone(),
            replica,
            slot: Slot::Output,
            index: outputs.len(),
        };
        let value = output.primitive.clone();
        outputs.push((output, None));
        match StoreBackward::<C>(core::marker::PhantomData)
            .prepare::<C>([hub.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(stand_in, value),
            OpsKind::UnTracked(prep) => prep.finish(value),
        }
    }

    fn seal(&self) {
        self.lock().hub = None;
    }
}

/// One replica's backward, seeded with its outputs' gradients: the root is the flat
/// concatenation of each output times its gradient (Burn seeds a root with ones, so each
/// output receives its gradient) and of the sentinel times zero, which makes the sentinel
/// part of the backward even when no tap is. A concatenation rather than a sum, so that the
/// seeding adds no reduction for CubeCL to tune.
fn replica_backward<B: ConcatBackend, C: CheckpointStrategy>(
    seeds: Vec<(Tracked<B>, FloatTensor<B>)>,
    sentinel: Tracked<B>,
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
    let _ = <A<B, C> as AutodiffBackend>::backward(A::<B, C>::float_cat(parts, 0));
}

/// Which list of a replica a stored gradient belongs to.
#[derive(Clone, Copy, Debug)]
enum Slot {
    /// A tap (the start of the replica's graph).
    Tap,
    /// A stand-in for one of the replica's outputs (in the caller's graph).
    Output,
}

/// Where a tap's (or a stand-in's) gradient goes.
#[derive(Clone)]
struct Tap<B: ConcatBackend, C: CheckpointStrategy> {
    graphs: Weak<Graphs<B, C>>,
    replica: usize,
    slot: Slot,
    index: usize,
}

impl<B: ConcatBackend, C: CheckpointStrategy> std::fmt::Debug for Tap<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}({}, {})", self.slot, self.replica, self.index)
    }
}

/// The backward of a tap or a stand-in: stores its gradient. A stand-in's hub, their
/// common parent, runs after every stand-in; a replica's sentinel after every tap.
#[derive(Debug)]
struct StoreBackward<C>(core::marker::PhantomData<C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Backward<B, 1> for StoreBackward<C>
where
    Tap<B, C>: Send,
{
    type State = Tap<B, C>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let Tap {
            graphs,
            replica,
            slot,
            index,
        } = ops.state;
        if let Some(graphs) = graphs.upgrade() {
            graphs.store(replica, slot, index, grad);
        }
    }
}

/// A replica's sentinel: reports the replica's backward done.
#[derive(Clone)]
struct Done<B: ConcatBackend, C: CheckpointStrategy> {
    graphs: Weak<Graphs<B, C>>,
    replica: usize,
}

impl<B: ConcatBackend, C: CheckpointStrategy> std::fmt::Debug for Done<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Done({})", self.replica)
    }
}

#[derive(Debug)]
struct SentinelBackward<C>(core::marker::PhantomData<C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Backward<B, 1> for SentinelBackward<C>
where
    Done<B, C>: Send,
{
    type State = Done<B, C>;

    /// Every tap is one level above the sentinel, so every tap's step has run.
    fn backward(self, ops: Ops<Self::State, 1>, _: &mut Gradients, _: &mut Checkpointer) {
        if let Some(graphs) = ops.state.graphs.upgrade() {
            graphs.report(ops.state.replica, None);
        }
    }
}

#[derive(Debug)]
struct HubBackward<C>(core::marker::PhantomData<C>);

impl<B: ConcatBackend, C: CheckpointStrategy> Backward<B, 1> for HubBackward<C>
where
    Graphs<B, C>: Send + Sync,
{
    type State = Arc<Graphs<B, C>>;

    /// Runs the replicas' backward, sums each target's gradients on the target's device and
    /// registers them.
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let graphs = ops.state;
        let per_replica = graphs.run_backward();
        let devices: Vec<&B::Device> = graphs.setup.replicas.iter().map(|(_, d)| d).collect();
        let totals = match uniform(&per_replica) {
            true => reduce_coalesced(per_replica, &devices, graphs.setup.sink.as_deref()),
            false => reduce_each(per_replica, &devices, graphs.setup.sink.as_deref()),
        };
        for (target, total) in totals {
            grads.register::<B>(target.node.id, total);
        }
    }
}

/// Whether every replica has a gradient for the same targets, in the same order (the same
/// model on every shard): then the gradients can be summed as whole buffers.
fn uniform<B: ConcatBackend>(per_replica: &[Vec<WithGrad<B>>]) -> bool {
    let Some(first) = per_replica.first() else {
        return false;
    };
    per_replica.iter().all(|taps| {
        taps.len() == first.len()
            && taps
                .iter()
                .zip(first)
                .all(|((t, g), (f, _))| g.is_some() && t.node.id == f.node.id)
    })
}

/// The taps that received a gradient, grouped by their target's device and the gradient's
/// dtype: the gradients of one group can travel and be summed as one buffer.
fn groups<B: ConcatBackend>(
    taps: &[WithGrad<B>],
) -> Vec<(B::Device, burn::tensor::DType, Vec<usize>)> {
    let mut groups: Vec<(B::Device, burn::tensor::DType, Vec<usize>)> = Vec::new();
    for (i, (target, grad)) in taps.iter().enumerate() {
        let Some(grad) = grad else { continue };
        let destination = B::float_device(&target.primitive);
        let dtype = grad.dtype();
        match groups
            .iter_mut()
            .find(|(d, t, _)| *d == destination && *t == dtype)
        {
            Some((_, _, members)) => members.push(i),
            None => groups.push((destination, dtype, vec![i])),
        }
    }
    groups
}

/// Flat gradients of `members` (a group of [`groups`]), concatenated into one buffer.
fn flatten<B: ConcatBackend>(taps: &[WithGrad<B>], members: &[usize]) -> FloatTensor<B> {
    let flats = members
        .iter()
        .map(|&i| {
            let grad = taps[i].1.clone().expect("a member has a gradient");
            let count = grad.shape().num_elements();
            B::float_reshape(grad, [count].into())
        })
        .collect();
    B::float_concat(flats, 0)
}

/// Cuts a buffer laid out by [`flatten`] back into gradients of the members' shapes.
fn unflatten<B: ConcatBackend>(
    buffer: FloatTensor<B>,
    taps: &[WithGrad<B>],
    members: &[usize],
) -> Vec<FloatTensor<B>> {
    let shapes: Vec<_> = members
        .iter()
        .map(|&i| taps[i].1.as_ref().expect("a member has a gradient").shape())
        .collect();
    let counts: Vec<usize> = shapes.iter().map(|s| s.num_elements()).collect();
    B::float_split(buffer, &counts, 0)
        .into_iter()
        .zip(shapes)
        .map(|(piece, shape)| B::float_reshape(piece, shape))
        .collect()
}

/// Moves `buffer` to `destination`, counting the transfer in the profile.
fn move_counted<B: ConcatBackend>(
    buffer: FloatTensor<B>,
    destination: &B::Device,
    sink: Option<&profile::Sink>,
) -> FloatTensor<B> {
    let Some(sink) = sink else {
        return B::float_move(buffer, destination);
    };
    let start = Instant::now();
    let bytes = (buffer.shape().num_elements() * buffer.dtype().size()) as u64;
    let moved = B::float_move(buffer, destination);
    profile::synchronize::<B>(std::slice::from_ref(destination));
    let mut profile = sink.lock();
    profile.backward_transfers += start.elapsed();
    profile.bytes_reduced += bytes;
    profile.reduce_transfers += 1;
    moved
}

/// Sums the replicas' gradients as whole buffers: per target device and dtype, each replica's
/// gradients are concatenated on its device, replicas on one device added there, each
/// device's sum moved to the target device in one transfer, and the sums split once.
fn reduce_coalesced<B: ConcatBackend>(
    per_replica: Vec<Vec<WithGrad<B>>>,
    devices: &[&B::Device],
    sink: Option<&profile::Sink>,
) -> Vec<(Tracked<B>, FloatTensor<B>)> {
    let first = &per_replica[0];
    let mut totals = Vec::with_capacity(first.len());
    for (destination, _, members) in groups(first) {
        // One partial sum per device, in replica order.
        let mut partial: Vec<(&B::Device, FloatTensor<B>)> = Vec::new();
        for (taps, &device) in per_replica.iter().zip(devices) {
            let buffer = flatten(taps, &members);
            match partial.iter_mut().find(|(d, _)| *d == device) {
                Some((_, sum)) => *sum = B::float_add(sum.clone(), buffer),
                None => partial.push((device, buffer)),
            }
        }
        let mut total: Option<FloatTensor<B>> = None;
        for (device, sum) in partial {
            let arrived = match device == &destination {
                true => sum,
                false => move_counted::<B>(sum, &destination, sink),
            };
            total = Some(match total {
                Some(total) => B::float_add(total, arrived),
                None => arrived,
            });
        }
        let total = total.expect("one replica at least");
        for (&i, grad) in members.iter().zip(unflatten(total, first, &members)) {
            totals.push((first[i].0.clone(), grad));
        }
    }
    totals
}

/// Sums the replicas' gradients target by target (replicas whose gradients differ in
/// targets): gradients bound for another device travel in one buffer per replica, device and
/// dtype.
fn reduce_each<B: ConcatBackend>(
    per_replica: Vec<Vec<WithGrad<B>>>,
    devices: &[&B::Device],
    sink: Option<&profile::Sink>,
) -> Vec<(Tracked<B>, FloatTensor<B>)> {
    let mut totals: Vec<(Tracked<B>, FloatTensor<B>)> = Vec::new();
    for (taps, &device) in per_replica.into_iter().zip(devices) {
        let mut arrived: Vec<Option<FloatTensor<B>>> = (0..taps.len()).map(|_| None).collect();
        for (destination, _, members) in groups(&taps) {
            if &destination == device {
                for &i in &members {
                    arrived[i] = taps[i].1.clone();
                }
                continue;
            }
            let moved = move_counted::<B>(flatten(&taps, &members), &destination, sink);
            for (&i, grad) in members.iter().zip(unflatten(moved, &taps, &members)) {
                arrived[i] = Some(grad);
            }
        }
        for ((target, _), grad) in taps.into_iter().zip(arrived) {
            let Some(grad) = grad else { continue };
            match totals.iter_mut().find(|(t, _)| t.node.id == target.node.id) {
                Some((_, total)) => *total = B::float_add(total.clone(), grad),
                None => totals.push((target, grad)),
            }
        }
    }
    totals
}
