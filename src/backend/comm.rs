//! Every transfer between devices and every sum of replicas' gradients, in one place, the
//! way `torch/nn/parallel/comm.py` holds `broadcast_coalesced` and `reduce_add_coalesced`.
//!
//! - [`move_to`]: one tensor to another device (a shard, an output, a broadcast value).
//! - [`move_coalesced`]: many flat tensors to another device as one buffer (the parameter
//!   broadcast, the running states' way home), with [`plan_buckets`] to cut them into
//!   buckets of a bounded size.
//! - [`return_pieces`]: the backward of a coalesced move: the pieces' gradients go back as one
//!   buffer (the single backward).
//! - [`reduce_add_coalesced`]: the replicas' gradients of the parallel backward and of the
//!   replicas' own training steps, summed (or, for input rows, concatenated) on each target's
//!   device in one transfer per source device and dtype.
//!
//! Transfers are counted in the profile through a [`TransferLog`].

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Shape, Tensor, TensorMetadata, backend::Backend};

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

fn count(bytes: usize) {
    LOG.with(|current| {
        if let Some(log) = current.borrow().as_ref() {
            log.record(bytes as u64, Duration::ZERO);
        }
    });
}

fn bytes_of(tensor: &impl TensorMetadata) -> usize {
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

/// Copies of the flat float tensors `flats` (one device, one dtype) on `device`, moved as one
/// buffer: one concatenation, one transfer (counted even to the same device, where it is
/// free: callers only send what is bound elsewhere), one split. Under `Autodiff` the pieces' gradients
/// come back the same way ([`ConcatBackend::float_move_split`]).
pub(crate) fn move_coalesced<B: ConcatBackend>(
    flats: Vec<Tensor<B, 1>>,
    device: &B::Device,
) -> Vec<Tensor<B, 1>> {
    let counts: Vec<usize> = flats.iter().map(|flat| flat.dims()[0]).collect();
    let buffer = super::coalesce(flats);
    count(buffer.shape().num_elements() * buffer.dtype().size());
    super::move_split(buffer, &counts, device)
}

/// The buckets for parameters of `(dtype, tracked, bytes)`: groups of positions, in order.
///
/// Parameters with the same dtype and tracking are packed in order into buckets of at most
/// `bucket_size` bytes; a parameter larger than that gets a bucket of its own. A size of zero
/// gives every parameter a bucket of its own.
pub(crate) fn plan_buckets(params: &[(DType, bool, usize)], bucket_size: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<((DType, bool), Vec<usize>)> = Vec::new();
    for (i, (dtype, tracked, _)) in params.iter().enumerate() {
        let key = (*dtype, *tracked);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let mut buckets = Vec::new();
    for (_, members) in groups {
        let mut bucket: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for i in members {
            let size = params[i].2;
            if !bucket.is_empty() && bytes + size > bucket_size {
                buckets.push(std::mem::take(&mut bucket));
                bytes = 0;
            }
            bucket.push(i);
            bytes += size;
        }
        if !bucket.is_empty() {
            buckets.push(bucket);
        }
    }
    buckets
}

/// Moves `buffer` to `destination`, counting (and, when the log times transfers, timing) it;
/// a buffer already there is returned as it is, uncounted.
pub(crate) fn move_counted<B: ConcatBackend>(
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

/// How the replicas' gradients of one target combine.
#[derive(Debug, Clone)]
pub(crate) enum Combine {
    /// Summed (parameters, broadcast values).
    Sum,
    /// Concatenated along `dim` in replica order, zeros standing in for replicas without a
    /// gradient (the rows of a scattered input); `shapes[r]` is replica `r`'s piece.
    Rows { dim: usize, shapes: Vec<Shape> },
}

/// A tensor the replicas' gradients go to: its device and how they combine.
#[derive(Debug, Clone)]
pub(crate) struct Target<D> {
    pub(crate) device: D,
    pub(crate) combine: Combine,
}

/// Combines the replicas' gradients per target: `grads[r][t]` is replica `r`'s gradient for
/// `targets[t]` (on replica `r`'s device), scaled by `weights[r]` when given. The result has one entry
/// per target, on the target's device; `None` where no replica has a gradient.
///
/// Gradients that every replica has, for summed targets of one device and dtype, travel as
/// one flat buffer per replica and are added as whole buffers (one addition per replica, not
/// per tensor); the rest travel in one buffer per replica, destination and dtype and are
/// combined tensor by tensor.
pub(crate) fn reduce_add_coalesced<B: ConcatBackend>(
    mut grads: Vec<Vec<Option<FloatTensor<B>>>>,
    targets: &[Target<B::Device>],
    weights: Option<&[f64]>,
    log: Option<&dyn TransferLog>,
) -> Vec<Option<FloatTensor<B>>> {
    let mut totals: Vec<Option<FloatTensor<B>>> = (0..targets.len()).map(|_| None).collect();
    if grads.is_empty() {
        return totals;
    }
    if let Some(weights) = weights {
        for (replica, weight) in grads.iter_mut().zip(weights) {
            if *weight != 1.0 {
                for grad in replica.iter_mut().flatten() {
                    *grad = B::float_mul_scalar(grad.clone(), (*weight).into());
                }
            }
        }
    }
    // Summed targets that every replica has a gradient for, by destination and dtype.
    let mut common: Vec<(B::Device, DType, Vec<usize>)> = Vec::new();
    for (t, target) in targets.iter().enumerate() {
        let Combine::Sum = target.combine else {
            continue;
        };
        let Some(dtype) = grads[0][t].as_ref().map(TensorMetadata::dtype) else {
            continue;
        };
        if grads
            .iter()
            .any(|r| r[t].as_ref().map(TensorMetadata::dtype) != Some(dtype))
        {
            continue;
        }
        match common
            .iter_mut()
            .find(|(d, k, _)| *d == target.device && *k == dtype)
        {
            Some((_, _, members)) => members.push(t),
            None => common.push((target.device.clone(), dtype, vec![t])),
        }
    }
    for (destination, _, members) in common {
        let shapes: Vec<Shape> = members
            .iter()
            .map(|&t| grads[0][t].as_ref().expect("common").shape())
            .collect();
        let mut total: Option<FloatTensor<B>> = None;
        for replica in grads.iter_mut() {
            let flats = members
                .iter()
                .map(|&t| flatten::<B>(replica[t].take().expect("common")))
                .collect();
            let arrived = move_counted::<B>(B::float_concat(flats, 0), &destination, log);
            total = Some(match total {
                Some(total) => B::float_add(total, arrived),
                None => arrived,
            });
        }
        let counts: Vec<usize> = shapes.iter().map(Shape::num_elements).collect();
        let pieces = B::float_split(total.expect("one replica at least"), &counts, 0);
        for ((&t, piece), shape) in members.iter().zip(pieces).zip(shapes) {
            totals[t] = Some(B::float_reshape(piece, shape));
        }
    }
    // The rest: each replica's gradients per destination and dtype in one buffer.
    let mut arrived: Vec<Vec<Option<FloatTensor<B>>>> = Vec::with_capacity(grads.len());
    for replica in grads {
        arrived.push(move_grouped::<B>(replica, targets, log));
    }
    for (t, target) in targets.iter().enumerate() {
        if totals[t].is_some() {
            continue;
        }
        totals[t] = match &target.combine {
            Combine::Sum => arrived
                .iter_mut()
                .filter_map(|replica| replica[t].take())
                .reduce(|sum, grad| B::float_add(sum, grad)),
            Combine::Rows { dim, shapes } => rows::<B>(&mut arrived, t, *dim, shapes, target),
        };
    }
    totals
}

/// One replica's gradients, moved to their targets' devices in one buffer per destination and
/// dtype.
fn move_grouped<B: ConcatBackend>(
    replica: Vec<Option<FloatTensor<B>>>,
    targets: &[Target<B::Device>],
    log: Option<&dyn TransferLog>,
) -> Vec<Option<FloatTensor<B>>> {
    let mut groups: Vec<(B::Device, DType, Vec<usize>)> = Vec::new();
    for (t, grad) in replica.iter().enumerate() {
        let Some(grad) = grad else { continue };
        let destination = &targets[t].device;
        let dtype = grad.dtype();
        match groups
            .iter_mut()
            .find(|(d, k, _)| d == destination && *k == dtype)
        {
            Some((_, _, members)) => members.push(t),
            None => groups.push((destination.clone(), dtype, vec![t])),
        }
    }
    let mut replica = replica;
    let mut out: Vec<Option<FloatTensor<B>>> = (0..replica.len()).map(|_| None).collect();
    for (destination, _, members) in groups {
        let grads: Vec<FloatTensor<B>> = members
            .iter()
            .map(|&t| replica[t].take().expect("member"))
            .collect();
        if B::float_device(&grads[0]) == destination {
            for (&t, grad) in members.iter().zip(grads) {
                out[t] = Some(grad);
            }
            continue;
        }
        let shapes: Vec<Shape> = grads.iter().map(TensorMetadata::shape).collect();
        let counts: Vec<usize> = shapes.iter().map(Shape::num_elements).collect();
        let flats = grads.into_iter().map(flatten::<B>).collect();
        let moved = move_counted::<B>(B::float_concat(flats, 0), &destination, log);
        let pieces = B::float_split(moved, &counts, 0);
        for ((&t, piece), shape) in members.iter().zip(pieces).zip(shapes) {
            out[t] = Some(B::float_reshape(piece, shape));
        }
    }
    out
}

/// The rows of target `t` from every replica, concatenated along `dim` on the target's device.
fn rows<B: ConcatBackend>(
    arrived: &mut [Vec<Option<FloatTensor<B>>>],
    t: usize,
    dim: usize,
    shapes: &[Shape],
    target: &Target<B::Device>,
) -> Option<FloatTensor<B>> {
    let pieces: Vec<Option<FloatTensor<B>>> = arrived.iter_mut().map(|r| r[t].take()).collect();
    let dtype = FloatDType::from(pieces.iter().flatten().next()?.dtype());
    let parts: Vec<FloatTensor<B>> = pieces
        .into_iter()
        .zip(shapes)
        .map(|(piece, shape)| match piece {
            Some(piece) => piece,
            None => B::float_zeros(shape.clone(), &target.device, dtype),
        })
        .collect();
    Some(match parts.len() {
        1 => parts.into_iter().next().expect("one part"),
        _ => B::float_concat(parts, dim),
    })
}

fn flatten<B: Backend>(grad: FloatTensor<B>) -> FloatTensor<B> {
    let count = grad.shape().num_elements();
    B::float_reshape(grad, [count].into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: DType = DType::F32;

    #[test]
    fn buckets_pack_in_order_up_to_the_size() {
        let params = [
            (F32, true, 40),
            (F32, true, 40),
            (F32, true, 30),
            (F32, true, 10),
        ];
        assert_eq!(plan_buckets(&params, 80), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(plan_buckets(&params, 1000), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn a_parameter_larger_than_the_size_gets_its_own_bucket() {
        let params = [(F32, true, 10), (F32, true, 500), (F32, true, 10)];
        assert_eq!(plan_buckets(&params, 100), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn size_zero_moves_every_parameter_alone() {
        let params = [(F32, true, 4); 3];
        assert_eq!(plan_buckets(&params, 0), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn buckets_never_mix_dtypes_or_tracking() {
        let params = [
            (F32, true, 4),
            (DType::BF16, true, 2),
            (F32, false, 4),
            (F32, true, 4),
            (DType::BF16, true, 2),
        ];
        assert_eq!(
            plan_buckets(&params, 1 << 20),
            vec![vec![0, 3], vec![1, 4], vec![2]]
        );
    }

    #[test]
    fn every_parameter_is_in_exactly_one_bucket() {
        let params: Vec<(DType, bool, usize)> = (0..50)
            .map(|i| {
                (
                    if i % 7 == 0 { DType::F16 } else { F32 },
                    i % 5 != 0,
                    4 * (1 + i * 13 % 17),
                )
            })
            .collect();
        for size in [0, 1, 16, 100, 1000] {
            let mut seen: Vec<usize> = plan_buckets(&params, size).concat();
            seen.sort();
            assert_eq!(seen, (0..50).collect::<Vec<_>>(), "bucket size {size}");
        }
    }

    #[cfg(feature = "flex")]
    #[test]
    fn reduce_sums_parameters_and_concatenates_rows() {
        use burn::backend::Flex;
        use burn::tensor::TensorData;
        type B = Flex;
        let device = Default::default();
        let t = |values: Vec<f32>, shape: Vec<usize>| -> FloatTensor<B> {
            Tensor::<B, 2>::from_data(TensorData::new(values, shape), &device)
                .into_primitive()
                .tensor()
        };
        let targets = vec![
            Target {
                device,
                combine: Combine::Sum,
            },
            Target {
                device,
                combine: Combine::Rows {
                    dim: 0,
                    shapes: vec![[2, 1].into(), [1, 1].into()],
                },
            },
            Target {
                device,
                combine: Combine::Sum,
            },
        ];
        // Replica 1 has no gradient for the rows, replica 0 none for the third target.
        let grads = vec![
            vec![
                Some(t(vec![1.0, 2.0], vec![1, 2])),
                Some(t(vec![5.0, 6.0], vec![2, 1])),
                None,
            ],
            vec![
                Some(t(vec![10.0, 20.0], vec![1, 2])),
                None,
                Some(t(vec![7.0], vec![1, 1])),
            ],
        ];
        let totals = reduce_add_coalesced::<B>(grads, &targets, Some(&[1.0, 0.5]), None);
        let values = |t: &Option<FloatTensor<B>>| {
            Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(
                t.clone().expect("a total"),
            ))
            .into_data()
            .to_vec::<f32>()
            .unwrap()
        };
        assert_eq!(values(&totals[0]), vec![6.0, 12.0]);
        assert_eq!(values(&totals[1]), vec![5.0, 6.0, 0.0]);
        assert_eq!(values(&totals[2]), vec![3.5]);
    }
}
