//! [`ReplicaOps`]: what a backend allows of replicas (concurrent backward passes, half
//! precision under Fusion) and, under `Autodiff`, the per-replica graphs of the parallel
//! backward (implemented for `Autodiff` in `backward/`).

use std::sync::Arc;
use std::time::Duration;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::comm;

/// What a backend allows of replicas, and the graph hooks the wrapper needs under `Autodiff`.
///
/// Every method has a default (concurrent backward passes allowed, no per-replica graphs), so
/// a backend implements the trait with an empty `impl`.
pub trait ReplicaOps: Backend {
    /// Joins the autodiff graphs of `tensors` into one without computing anything: under
    /// `Autodiff`, one graph node with all of them as parents (its output is discarded);
    /// elsewhere nothing. Used to prepare one graph before replicas add to it from several
    /// threads (the single backward).
    #[doc(hidden)]
    fn float_join_graphs(tensors: Vec<FloatTensor<Self>>) {
        drop(tensors);
    }

    /// Whether `tensor` is part of an autodiff graph: a leaf that requires a gradient or the
    /// output of an operation on one (Burn's `is_require_grad` says the former only).
    #[doc(hidden)]
    fn float_is_tracked(tensor: &FloatTensor<Self>) -> bool {
        Self::float_is_require_grad(tensor)
    }

    /// Whether this backend is Burn 0.21's `Fusion` in f16, which computes wrong outputs when
    /// several forwards of different row counts are queued before one is read (the crate's
    /// `upstream/half_precision.rs` reproduces it without the wrapper), as replicas do.
    #[doc(hidden)]
    fn fusion_half_precision() -> bool {
        false
    }

    /// One autodiff graph per replica for a forward whose replicas run on worker threads, or
    /// `None` where there is no autodiff graph (the default) or the backend keeps one graph
    /// for all replicas ([`concurrent_backward`](Self::concurrent_backward) false).
    ///
    /// Under `Autodiff`, each replica's forward then starts from its own leaves and never
    /// touches the caller's graph; the caller's graph gets one stand-in per replica output,
    /// and the backward of those stand-ins runs each replica's backward on its own worker
    /// thread at the same time, then sums the gradients into the caller's tensors.
    #[doc(hidden)]
    fn replica_graphs(setup: ReplicaSetup<Self>) -> Option<Arc<dyn ReplicaGraphs<Self>>> {
        drop(setup);
        None
    }

    /// Whether replicas' backward passes may run on their worker threads at the same time
    /// ([`DataParallelConfig::parallel_backward`](crate::DataParallelConfig::parallel_backward)).
    /// True by default; false for `Fusion`, whose per-thread streams gave wrong gradients and
    /// slower steps that way (see the crate's benchmark results).
    fn concurrent_backward() -> bool {
        true
    }
}

/// What [`ReplicaOps::replica_graphs`] needs: where each replica runs and the pipeline's
/// services (workers, profile).
#[doc(hidden)]
pub struct ReplicaSetup<B: Backend> {
    /// Per replica (shard order): the worker slot and the device.
    pub(crate) replicas: Vec<(usize, B::Device)>,
    pub(crate) runtime: Arc<dyn ReplicaRuntime>,
    /// With a size, the reduce of whole targets' gradients overlaps the backward in buckets
    /// of at most that many bytes ([`DataParallelConfig::overlap_reduce`](crate::DataParallelConfig::overlap_reduce)).
    pub(crate) reduce_bucket_size: Option<usize>,
    /// How long the hub waits for the replicas' backwards before it gives up on them
    /// ([`DataParallelConfig::backward_timeout_secs`](crate::DataParallelConfig::backward_timeout_secs)).
    pub(crate) backward_timeout: Option<Duration>,
}

/// The pipeline's services for the per-replica backward, implemented by the worker pool.
#[doc(hidden)]
pub trait ReplicaRuntime: Send + Sync {
    /// Starts `job` on the worker of `slot` if it is idle, otherwise on another thread kept
    /// for that slot, and returns at once.
    fn spawn(&self, slot: usize, job: Box<dyn FnOnce() + Send>);

    /// Whether the step is profiled.
    fn profiling(&self) -> bool;

    /// Whether each replica's backward is timed up to its device having run it (profiling, or
    /// the adaptive split).
    fn times_backwards(&self) -> bool;

    /// Records that replica `replica`'s backward took `elapsed` (when timed).
    fn record_backward(&self, replica: usize, elapsed: Duration);

    /// Records one gradient transfer of the backward (when profiling).
    fn record_transfer(&self, bytes: u64, elapsed: Duration);

    /// Records the hub's time on the calling thread (when profiling): `wait`, from starting
    /// the replicas' backwards to the last one done; `reduce`, combining their gradients and
    /// registering them.
    fn record_hub(&self, wait: Duration, reduce: Duration);

    /// Records one bucket of the overlapped reduce (when profiling).
    fn record_bucket(&self, bucket: comm::ReduceBucket);
}

/// How a replica's leaf relates to the caller's tensor it copies.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The whole tensor (a parameter, a broadcast value): the replicas' gradients are summed.
    Whole,
    /// The replica's rows of the tensor along `dim` (an input shard): the replicas' gradients
    /// are concatenated in shard order.
    Rows {
        /// The batch dimension.
        dim: usize,
    },
}

/// The per-replica graphs of one forward ([`ReplicaOps::replica_graphs`]).
#[doc(hidden)]
pub trait ReplicaGraphs<B: Backend>: Send + Sync + std::fmt::Debug {
    /// Replica `replica`'s leaf for `target`, a tracked tensor of the caller's graph: a tensor
    /// holding `value` (the target's data, or the replica's rows of it, on the replica's
    /// device) at the start of the replica's own graph, whose gradient goes back to `target`
    /// as `part` says. `value` itself when `target` is not tracked.
    fn leaf(
        &self,
        replica: usize,
        value: FloatTensor<B>,
        target: &FloatTensor<B>,
        part: Part,
    ) -> FloatTensor<B>;

    /// Notes that the replicas' forwards start now (every leaf has been made).
    fn begin_forward(&self);

    /// The stand-in, in the caller's graph, for `output` of replica `replica` (itself when
    /// not tracked). Called on the calling thread after every replica's forward.
    fn output(&self, replica: usize, output: FloatTensor<B>) -> FloatTensor<B>;

    /// Drops what only the forward needed and reports the first replica whose outputs were
    /// computed directly from a tracked tensor that it did not receive through its input.
    fn seal(&self) -> Result<(), usize>;
}
