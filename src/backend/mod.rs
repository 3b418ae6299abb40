//! Concatenation, splitting and device moves as a Burn backend extension, and the transfers
//! and reductions built on them: the layer every byte the pipeline moves goes through.
//!
//! [`ConcatBackend`] adds `concat` (any number of inputs along any dimension, in one kernel
//! launch) and `split` (one tensor into pieces, zero-copy views where the layout allows,
//! otherwise one kernel launch) to a backend, with fenced device moves. Each backend has its
//! file:
//!
//! - `cubecl.rs`: CubeCL backends run this crate's kernels (`src/kernels/`);
//! - `fusion.rs`: `Fusion` records them as custom operations;
//! - `autodiff.rs`: `Autodiff` gives them custom backward steps (the backward of a
//!   concatenation is a split and the other way round; the backward of a coalesced transfer
//!   brings every piece's gradient back in one transfer);
//! - `cpu.rs`: Flex and NdArray use Burn's own operations;
//! - `replica_graphs/`: under `Autodiff`, the per-replica graphs and backward of the
//!   parallel backward.
//!
//! `comm/` holds every transfer and gradient sum of the pipeline (broadcast of parameters,
//! reduce-add of gradients, move-and-split), used by the forward and by both backwards.
//!
//! [`concat()`], [`split()`], [`coalesce()`], [`uncoalesce()`] and [`move_split()`] are the
//! tensor-level entry points. Another backend gets Burn's own operations from an empty
//! `impl ConcatBackend for MyBackend {}`.

mod autodiff;
pub(crate) mod comm;
#[cfg(any(feature = "flex", feature = "ndarray"))]
mod cpu;
#[cfg(feature = "cubecl")]
mod cubecl;
#[cfg(feature = "cubecl")]
mod fusion;
mod replica_graphs;
mod tensor;

use std::sync::Arc;
use std::time::Duration;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Slice, TensorMetadata};

pub(crate) use tensor::is_tracked;
pub use tensor::{ConcatKind, coalesce, concat, move_split, split, uncoalesce};

/// A backend with single-launch concatenation and splitting.
///
/// Every method has a default body built on Burn's own operations, so a backend without
/// kernels of its own implements the trait with an empty `impl`.
pub trait ConcatBackend: Backend {
    /// Concatenates float tensors along `dim`.
    ///
    /// # Panics
    ///
    /// If `tensors` is empty, or the tensors differ in rank, dtype, device or in a dimension
    /// other than `dim`.
    fn float_concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        Self::float_cat(tensors, dim)
    }

    /// Concatenates int tensors along `dim`.
    ///
    /// # Panics
    ///
    /// As [`float_concat`](Self::float_concat).
    fn int_concat(tensors: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self> {
        Self::int_cat(tensors, dim)
    }

    /// Splits a float tensor along `dim` into pieces of the given sizes.
    ///
    /// # Panics
    ///
    /// If the sizes do not sum to the tensor's size along `dim`.
    fn float_split(
        tensor: FloatTensor<Self>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<FloatTensor<Self>> {
        let shape = tensor.shape().to_vec();
        slices(&shape, sizes, dim)
            .map(|slices| Self::float_slice(tensor.clone(), &slices))
            .collect()
    }

    /// Splits an int tensor along `dim` into pieces of the given sizes.
    ///
    /// # Panics
    ///
    /// As [`float_split`](Self::float_split).
    fn int_split(tensor: IntTensor<Self>, sizes: &[usize], dim: usize) -> Vec<IntTensor<Self>> {
        let shape = tensor.shape().to_vec();
        slices(&shape, sizes, dim)
            .map(|slices| Self::int_slice(tensor.clone(), &slices))
            .collect()
    }

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
    /// `tests/half_precision.rs` reproduces it without the wrapper), as replicas do.
    #[doc(hidden)]
    fn fusion_half_precision() -> bool {
        false
    }

    /// Whether tensors can move between two distinct devices of this backend, directly or
    /// through host memory ([`host_staged_transfers`](Self::host_staged_transfers)). True by
    /// default.
    fn device_transfers() -> bool {
        true
    }

    /// Whether this crate moves tensors between distinct devices by reading them on one and
    /// writing them on the other, because Burn 0.21's `to_device` between them is not
    /// implemented: CubeCL runtimes without device-to-device communication (wgpu's Vulkan,
    /// Metal and DX12 devices, HIP, CubeCL's CPU). False by default (Burn's `to_device`).
    ///
    /// Burn's own `to_device` inside a replica's forward (batch norm moving its running
    /// statistics) still fails there, so such backends report
    /// [`orders_receives`](Self::orders_receives) false and need running states per device.
    fn host_staged_transfers() -> bool {
        false
    }

    /// Orders later work on `source` after the transfers already queued from it, so that their
    /// source buffers are not overwritten before they have been read.
    ///
    /// CubeCL 0.10 sends between CUDA devices on a separate communication stream and frees the
    /// source buffer as soon as the send is queued; the next kernel on the source device can
    /// reuse that memory before the send has read it, and the receiver gets corrupted values.
    /// On CubeCL runtimes with device-to-device transfers this makes the source's compute
    /// stream wait for its communication stream; elsewhere it does nothing.
    fn fence_transfers(source: &Self::Device) {
        let _ = source;
    }

    /// Orders a transfer into `destination` after the work the calling thread has queued
    /// there, so that the transfer cannot overwrite memory that work still reads.
    ///
    /// CubeCL 0.10 receives on the destination's communication stream into memory reserved
    /// from the compute stream's pool without waiting for that stream: memory freed by a
    /// kernel still queued can be overwritten before the kernel reads it (seen as
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` when that memory held indices). On CubeCL runtimes with
    /// device-to-device transfers this makes the destination's communication stream wait for
    /// the calling thread's compute stream (a one-device all-reduce of four bytes, the one
    /// operation that orders them that way); elsewhere it does nothing.
    fn fence_receive(destination: &Self::Device) {
        let _ = destination;
    }

    /// Whether a transfer into a device that this crate does not fence (Burn's own
    /// `to_device` inside a replica's forward, such as batch norm moving its running
    /// statistics) is ordered after the work queued on that device. True by default; false on
    /// CubeCL runtimes with device-to-device transfers (CUDA), where such a transfer can
    /// overwrite memory that queued kernels still read ([`fence_receive`](Self::fence_receive)).
    fn orders_receives() -> bool {
        true
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
    /// slower steps that way on two H200s (see the crate's benchmark results).
    fn concurrent_backward() -> bool {
        true
    }

    /// Moves a float tensor to `device` (Burn's `to_device`) between a fence on the
    /// destination ([`fence_receive`](Self::fence_receive)) and one on the source
    /// ([`fence_transfers`](Self::fence_transfers)). Under `Autodiff`, the backward moves the
    /// gradient back the same way.
    ///
    /// With [`host_staged_transfers`](Self::host_staged_transfers), the tensor is read on its
    /// device and written on `device` instead (waiting for the read).
    fn float_move(tensor: FloatTensor<Self>, device: &Self::Device) -> FloatTensor<Self> {
        let source = Self::float_device(&tensor);
        if &source == device {
            return tensor;
        }
        if Self::host_staged_transfers() {
            // As a flat tensor of rank 1 (the Tensor API wants the rank), then reshaped back.
            let shape = burn::tensor::TensorMetadata::shape(&tensor);
            let flat = Self::float_reshape(tensor, [shape.num_elements()].into());
            let flat = burn::tensor::Tensor::<Self, 1>::from_primitive(
                burn::tensor::TensorPrimitive::Float(flat),
            );
            let moved = host_staged(flat, device).into_primitive().tensor();
            return Self::float_reshape(moved, shape);
        }
        Self::fence_receive(device);
        let moved = Self::float_to_device(tensor, device);
        Self::fence_transfers(&source);
        moved
    }

    /// Moves a flat float buffer to `device` in one transfer and cuts it there into flat pieces
    /// of `counts` elements: the receiving half of a coalesced transfer.
    ///
    /// Under `Autodiff`, the backward collects the pieces' gradients into one buffer (zeros for
    /// pieces without a gradient) and moves it back in one transfer.
    ///
    /// # Panics
    ///
    /// If `buffer` is not of rank 1 or the counts do not sum to its length.
    fn float_move_split(
        buffer: FloatTensor<Self>,
        counts: &[usize],
        device: &Self::Device,
    ) -> Vec<FloatTensor<Self>> {
        Self::float_split(Self::float_move(buffer, device), counts, 0)
    }
}

/// `tensor`, any rank, read on its device and written on `device`: the transfer of backends
/// with [`ConcatBackend::host_staged_transfers`]. Waits for the read.
pub(crate) fn host_staged<B: Backend, const D: usize, K: burn::tensor::BasicOps<B>>(
    tensor: burn::tensor::Tensor<B, D, K>,
    device: &B::Device,
) -> burn::tensor::Tensor<B, D, K> {
    burn::tensor::Tensor::from_data(tensor.into_data(), device)
}

/// An autodiff backend that [`DataParallel`](crate::DataParallel) trains on: it and its inner
/// backend (used by `valid()` models) both have the kernels. One bound for generic training
/// code: `fn train<B: DataParallelBackend>(...)`.
pub trait DataParallelBackend:
    AutodiffBackend<InnerBackend: ConcatBackend> + ConcatBackend
{
}

impl<B> DataParallelBackend for B
where
    B: AutodiffBackend + ConcatBackend,
    B::InnerBackend: ConcatBackend,
{
}

/// Largest number of inputs one tracked concatenation (or graph join) takes; more are taken in
/// groups.
const MAX_TRACKED_INPUTS: usize = 16;

/// What [`ConcatBackend::replica_graphs`] needs: where each replica runs and the pipeline's
/// services (workers, profile).
#[doc(hidden)]
pub struct ReplicaSetup<B: Backend> {
    /// Per replica (shard order): the worker slot and the device.
    pub(crate) replicas: Vec<(usize, B::Device)>,
    pub(crate) runtime: Arc<dyn ReplicaRuntime>,
    /// With a size, the reduce of whole targets' gradients overlaps the backward in buckets
    /// of at most that many bytes ([`DataParallelConfig::overlap_reduce`](crate::DataParallelConfig::overlap_reduce)).
    pub(crate) reduce_bucket_size: Option<usize>,
}

/// The pipeline's services for the per-replica backward, implemented by the worker pool.
#[doc(hidden)]
pub trait ReplicaRuntime: Send + Sync {
    /// Starts `job` on the worker of `slot` if it is idle, otherwise on another thread kept
    /// for that slot, and returns at once.
    fn spawn(&self, slot: usize, job: Box<dyn FnOnce() + Send>);

    /// Whether the step is profiled.
    fn profiling(&self) -> bool;

    /// Records that replica `replica`'s backward took `elapsed` (when profiling).
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

/// The per-replica graphs of one forward ([`ConcatBackend::replica_graphs`]).
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

/// The slices that cut `shape` along `dim` into pieces of `sizes`.
///
/// # Panics
///
/// If the sizes do not sum to `shape[dim]`.
pub(crate) fn slices<'a>(
    shape: &'a [usize],
    sizes: &'a [usize],
    dim: usize,
) -> impl Iterator<Item = Vec<Slice>> + 'a {
    assert_eq!(
        sizes.iter().sum::<usize>(),
        shape[dim],
        "split sizes {sizes:?} do not sum to dim {dim} of shape {shape:?}"
    );
    sizes.iter().scan(0, move |start, &size| {
        let begin = *start;
        *start += size;
        Some(
            shape
                .iter()
                .enumerate()
                .map(|(d, &len)| match d == dim {
                    true => Slice::new(begin as isize, Some((begin + size) as isize), 1),
                    false => Slice::new(0, Some(len as isize), 1),
                })
                .collect(),
        )
    })
}
