//! The sum of the replicas' gradients (and, for input rows, their concatenation) on each
//! target's device: the reduce-add of the parallel backward and of the replicas' own training
//! steps.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata, backend::Backend};

use super::{TransferLog, move_counted};
use crate::backend::ConcatBackend;

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
        scale::<B>(&mut grads, weights);
    }
    for (destination, members) in common_sums::<B>(&grads, targets) {
        let parts = grads
            .iter_mut()
            .map(|replica| {
                let part = members.iter().map(|&t| replica[t].take().expect("common"));
                part.collect()
            })
            .collect();
        let sums = sum_flat::<B>(parts, &destination, log);
        for (&t, sum) in members.iter().zip(sums) {
            totals[t] = Some(sum);
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

/// Every replica's gradients scaled by its weight (left alone for a weight of one).
fn scale<B: ConcatBackend>(grads: &mut [Vec<Option<FloatTensor<B>>>], weights: &[f64]) {
    for (replica, weight) in grads.iter_mut().zip(weights) {
        if *weight != 1.0 {
            for grad in replica.iter_mut().flatten() {
                *grad = B::float_mul_scalar(grad.clone(), (*weight).into());
            }
        }
    }
}

/// The summed targets that every replica has a gradient for, all of one dtype, grouped by
/// destination and dtype: each group's sums travel as one flat buffer per replica.
fn common_sums<B: ConcatBackend>(
    grads: &[Vec<Option<FloatTensor<B>>>],
    targets: &[Target<B::Device>],
) -> Vec<(B::Device, Vec<usize>)> {
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
    common
        .into_iter()
        .map(|(d, _, members)| (d, members))
        .collect()
}

/// The sums on `destination` of gradients that every replica has: `parts[r][i]` is replica
/// `r`'s gradient of the `i`-th tensor (one dtype, the same shapes in every replica). Each
/// replica's gradients travel as one flat buffer and are added as whole buffers, in replica
/// order; one sum per tensor comes back, in its shape.
///
/// Elementwise, the sums do not depend on how the tensors are grouped into calls: the
/// overlapped reduce, which sums a bucket at a time, gives the same bits as one call for all.
///
/// # Panics
///
/// If `parts` is empty.
pub(crate) fn sum_flat<B: ConcatBackend>(
    parts: Vec<Vec<FloatTensor<B>>>,
    destination: &B::Device,
    log: Option<&dyn TransferLog>,
) -> Vec<FloatTensor<B>> {
    let shapes: Vec<Shape> = parts[0].iter().map(TensorMetadata::shape).collect();
    let mut total: Option<FloatTensor<B>> = None;
    for part in parts {
        let flats = part.into_iter().map(flatten::<B>).collect();
        let arrived = move_counted::<B>(B::float_concat(flats, 0), destination, log);
        total = Some(match total {
            Some(total) => B::float_add(total, arrived),
            None => arrived,
        });
    }
    let counts: Vec<usize> = shapes.iter().map(Shape::num_elements).collect();
    let pieces = B::float_split(total.expect("one replica at least"), &counts, 0);
    (pieces.into_iter().zip(shapes))
        .map(|(piece, shape)| B::float_reshape(piece, shape))
        .collect()
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

/// A replica's gradient laid out contiguously for the reduce: a reshape to one dimension (a
/// copy only where the layout is strided, as a convolution's weight gradient often is) and
/// back (free). Done on the replica's worker, in parallel with the other replicas, it spares
/// the reduce on the calling thread a strided copy per replica and parameter in [`flatten`].
pub(crate) fn contiguous<B: Backend>(grad: FloatTensor<B>) -> FloatTensor<B> {
    let shape = grad.shape();
    B::float_reshape(flatten::<B>(grad), shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Tensor;

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
