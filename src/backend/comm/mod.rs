//! Every transfer between devices and every sum of replicas' gradients, in one place, the
//! way `torch/nn/parallel/comm.py` holds `broadcast_coalesced` and `reduce_add_coalesced`.
//!
//! - [`move_to`]: one tensor to another device (a shard, an output, a broadcast value).
//! - [`move_coalesced`]: many tensors to another device as one buffer (the parameter
//!   broadcast), with [`plan_buckets`] to cut them into buckets of a bounded size.
//! - [`return_present`]: the backward of the parameter broadcast under the single backward:
//!   the gradients of the pieces that received one go back as one buffer;
//!   [`return_pieces`], the same for the public `move_split`, zeros for the others.
//! - [`reduce_add_coalesced`]: the replicas' gradients of the parallel backward and of the
//!   replicas' own training steps, summed (or, for input rows, concatenated) on each target's
//!   device in one transfer per source device and dtype.
//!
//! Transfers are counted in the profile through a [`TransferLog`].

mod buckets;
mod reduce;

pub(crate) use buckets::plan_buckets;
pub(crate) use reduce::{Combine, Target, contiguous, reduce_add_coalesced, sum_flat};

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Tensor, TensorMetadata, backend::Backend};

use super::{ConcatBackend, ConcatKind};

/// Where the transfers of a profiled step are counted.
pub(crate) trait TransferLog: Send + Sync {
    /// One transfer of `bytes` to another device; `elapsed` is its time up to the destination
    /// having received it, when measured (backward transfers), zero otherwise.
    fn record(&self, bytes: u64, elapsed: Duration);

    /// Whether transfers are timed (the destination synchronised after each).
    fn timed(&self) -> bool {
        false
    }

    /// Where the backward of the transfers counted here counts its own (the single
    /// backward's gradient buffers).
    fn for_backward(&self) -> Option<Arc<dyn TransferLog>> {
        None
    }
}

thread_local! {
    static LOG: RefCell<Option<Arc<dyn TransferLog>>> = const { RefCell::new(None) };
}

/// Runs `f` with its transfers on this thread counted in `log`.
pub(crate) fn logged<T>(log: Option<Arc<dyn TransferLog>>, f: impl FnOnce() -> T) -> T {
    let previous = LOG.with(|current| current.replace(log));
    let output = f();
    LOG.with(|current| *current.borrow_mut() = previous);
    output
}

/// The log transfers on this thread are counted in, for backward steps to keep.
pub(crate) fn current_log() -> Option<Arc<dyn TransferLog>> {
    LOG.with(|current| current.borrow().clone())
}

/// Bytes moved between distinct devices by this crate in this process (see
/// [`bytes_moved`](crate::bytes_moved)).
static MOVED: AtomicU64 = AtomicU64::new(0);

/// Adds `bytes` to the process's total of bytes moved between devices: called by every move
/// between distinct devices ([`TransferOps::float_move`](super::TransferOps::float_move) and
/// the integer and boolean moves), forward and backward, profiled or not.
pub(crate) fn note_moved(bytes: usize) {
    MOVED.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// The process's total so far (see [`bytes_moved`](crate::bytes_moved)).
pub(crate) fn moved_total() -> u64 {
    MOVED.load(Ordering::Relaxed)
}

fn count(bytes: usize) {
    LOG.with(|current| {
        if let Some(log) = current.borrow().as_ref() {
            log.record(bytes as u64, Duration::ZERO);
        }
    });
}

pub(crate) fn bytes_of(tensor: &impl TensorMetadata) -> usize {
    tensor.shape().num_elements() * tensor.dtype().size()
}

/// Moves `tensor` to `device`, fenced on both sides ([`ConcatKind::move_to`]) and counted; a
/// tensor already there is returned as it is.
pub(crate) fn move_to<B: Backend, const D: usize, K: ConcatKind<B>>(
    tensor: Tensor<B, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K> {
    if tensor.device() == *device {
        return tensor;
    }
    count(tensor.shape().num_elements() * tensor.dtype().size());
    K::move_to(tensor, device)
}

/// Concatenates `tensors` (all on one device) along `dim`; one tensor is returned as it is.
pub(crate) fn concat<B: Backend, const D: usize, K: ConcatKind<B>>(
    mut tensors: Vec<Tensor<B, D, K>>,
    dim: usize,
) -> Tensor<B, D, K> {
    if tensors.len() == 1 {
        return tensors.pop().expect("one tensor");
    }
    super::concat(tensors, dim)
}

/// Splits `tensor` along `dim` into pieces of the given positive sizes.
pub(crate) fn split<B: Backend, const D: usize, K: ConcatKind<B>>(
    tensor: Tensor<B, D, K>,
    sizes: &[usize],
    dim: usize,
) -> Vec<Tensor<B, D, K>> {
    if sizes.len() == 1 {
        return vec![tensor];
    }
    super::split(tensor, sizes, dim)
}

/// Copies of the float tensors `tensors` (any shapes, one device, one dtype) on `device`,
/// moved as one buffer: one concatenation, one transfer (counted even to the same device,
/// where it is free: callers only send what is bound elsewhere), one split. Under `Autodiff`
/// the gradients of the pieces that received one come back the same way
/// ([`TransferOps::float_move_coalesced`](super::TransferOps::float_move_coalesced)).
pub(crate) fn move_coalesced<B: ConcatBackend>(
    tensors: Vec<FloatTensor<B>>,
    device: &B::Device,
) -> Vec<FloatTensor<B>> {
    count(tensors.iter().map(bytes_of).sum());
    B::float_move_coalesced(tensors, device)
}

/// Moves `buffer` to `destination`, counting (and, when the log times transfers, timing) it;
/// a buffer already there is returned as it is, uncounted.
pub(super) fn move_counted<B: ConcatBackend>(
    buffer: FloatTensor<B>,
    destination: &B::Device,
    log: Option<&dyn TransferLog>,
) -> FloatTensor<B> {
    if B::float_device(&buffer) == *destination {
        return buffer;
    }
    transfer::<B>(buffer, destination, log)
}

/// Moves `buffer` to `destination`, counted and timed as [`move_counted`] does.
fn transfer<B: ConcatBackend>(
    buffer: FloatTensor<B>,
    destination: &B::Device,
    log: Option<&dyn TransferLog>,
) -> FloatTensor<B> {
    let Some(log) = log else {
        return B::float_move(buffer, destination);
    };
    let bytes = bytes_of(&buffer) as u64;
    if !log.timed() {
        let moved = B::float_move(buffer, destination);
        log.record(bytes, Duration::ZERO);
        return moved;
    }
    let source = B::float_device(&buffer);
    let _ = B::sync(&source);
    let start = Instant::now();
    let moved = B::float_move(buffer, destination);
    let _ = B::sync(destination);
    log.record(bytes, start.elapsed());
    moved
}

/// The backward of a coalesced move: the pieces' gradients (zeros for pieces without one),
/// flattened into one buffer on their device and moved back to `source` in one transfer
/// (counted like the move it reverses). `None` when no piece has a gradient.
pub(crate) fn return_pieces<B: ConcatBackend>(
    pieces: Vec<Option<FloatTensor<B>>>,
    counts: &[usize],
    source: &B::Device,
    log: Option<&dyn TransferLog>,
) -> Option<FloatTensor<B>> {
    let first = pieces.iter().flatten().next()?;
    let device = B::float_device(first);
    let dtype = FloatDType::from(first.dtype());
    let parts = pieces
        .into_iter()
        .zip(counts)
        .map(|(grad, &count)| match grad {
            Some(grad) => B::float_reshape(grad, [count].into()),
            None => B::float_zeros([count].into(), &device, dtype),
        })
        .collect();
    Some(transfer::<B>(B::float_concat(parts, 0), source, log))
}

/// The backward of the single backward's parameter broadcast
/// ([`TransferOps::float_move_coalesced`](super::TransferOps::float_move_coalesced)): the
/// pieces that received a gradient, flattened into one buffer on their device and moved back
/// to `source` in one transfer (counted like the move it reverses), each in its shape again;
/// pieces without a gradient stay `None`.
pub(crate) fn return_present<B: ConcatBackend>(
    mut pieces: Vec<Option<FloatTensor<B>>>,
    source: &B::Device,
    log: Option<&dyn TransferLog>,
) -> Vec<Option<FloatTensor<B>>> {
    let present: Vec<(usize, burn::tensor::Shape)> = (pieces.iter().enumerate())
        .filter_map(|(i, piece)| piece.as_ref().map(|piece| (i, piece.shape())))
        .collect();
    if present.is_empty() {
        return pieces;
    }
    let counts: Vec<usize> = present
        .iter()
        .map(|(_, shape)| shape.num_elements())
        .collect();
    let flats = (present.iter().zip(&counts))
        .filter_map(|((i, _), &count)| Some(B::float_reshape(pieces[*i].take()?, [count].into())))
        .collect();
    let back = move_counted::<B>(B::float_concat(flats, 0), source, log);
    for ((i, shape), piece) in present.into_iter().zip(B::float_split(back, &counts, 0)) {
        pieces[i] = Some(B::float_reshape(piece, shape));
    }
    pieces
}

/// One bucket of gradients reduced while the replicas' backward ran: its times are from the
/// start of the replicas' backward, like [`StepProfile::backward`](crate::StepProfile::backward)'s.
///
/// # Example
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Tensor;
/// use burn_dataparallel::DataParallelConfig;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let model: Linear<B> = LinearConfig::new(8, 2).init(&device);
/// let dp = DataParallelConfig::new()
///     .with_overlap_reduce(true)
///     .with_profile(true)
///     .init(model, vec![device; 2])
///     .unwrap();
/// let output = dp.forward_with(Tensor::<B, 2>::ones([6, 8], &device), |m, x| m.forward(x));
/// output.sum().backward();
/// let buckets = dp.profile().expect("profiling is on").reduce_buckets;
/// // The weight and the bias, in one bucket of the default 25 MiB.
/// assert_eq!(buckets.len(), 1);
/// assert_eq!(buckets[0].tensors, 2);
/// assert!(buckets[0].start <= buckets[0].end);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReduceBucket {
    /// The bucket's place in the plan: 0 holds the last parameters of the module.
    pub index: usize,
    /// When the calling thread started reducing it (every replica's part was there).
    pub start: Duration,
    /// When its sum was on the parameters' device.
    pub end: Duration,
    /// One replica's gradient bytes in it.
    pub bytes: u64,
    /// The number of gradients in it.
    pub tensors: usize,
}

/// Waits for every device's queued work; errors only make the profile less exact.
pub(crate) fn synchronize<B: Backend>(devices: &[B::Device]) {
    let mut seen: Vec<&B::Device> = Vec::new();
    for device in devices {
        if !seen.contains(&device) {
            seen.push(device);
            let _ = B::sync(device);
        }
    }
}
