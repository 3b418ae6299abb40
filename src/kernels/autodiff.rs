//! [`ConcatBackend`] for `Autodiff`: the backward of a concatenation splits the gradient, and
//! the backward of each split piece concatenates its gradient with zeros for the others.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{FloatDType, TensorMetadata};

use super::ConcatBackend;

/// Largest number of inputs one tracked concatenation takes; more are concatenated in groups.
const MAX_TRACKED_INPUTS: usize = 16;

#[derive(Debug)]
struct ConcatBackward;

impl<B: ConcatBackend, const N: usize> Backward<B, N> for ConcatBackward {
    /// Each input's size along `dim`, and `dim`.
    type State = (Vec<usize>, usize);

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (sizes, dim) = ops.state;
        let pieces = B::float_split(grad, &sizes, dim);
        for (node, piece) in ops.parents.into_iter().zip(pieces) {
            if let Some(node) = node {
                grads.register::<B>(node.id, piece);
            }
        }
    }
}

#[derive(Debug)]
struct SplitBackward;

impl<B: ConcatBackend> Backward<B, 1> for SplitBackward {
    /// The input's shape, the piece's start and size along `dim`, and `dim`.
    type State = (Vec<usize>, usize, usize, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        let Some(parent) = parent else { return };
        let (shape, start, size, dim) = ops.state;
        let device = B::float_device(&grad);
        let dtype = FloatDType::from(grad.dtype());
        let zeros = |length: usize| {
            let mut zeros_shape = shape.clone();
            zeros_shape[dim] = length;
            B::float_zeros(zeros_shape.into(), &device, dtype)
        };
        let after = shape[dim] - start - size;
        let mut parts = Vec::with_capacity(3);
        if start > 0 {
            parts.push(zeros(start));
        }
        parts.push(grad);
        if after > 0 {
            parts.push(zeros(after));
        }
        grads.register::<B>(parent.id, B::float_concat(parts, dim));
    }
}

type Tensor<B> = FloatTensor<Autodiff<B>>;

/// A tracked concatenation of exactly `N` inputs.
fn concat_n<B: ConcatBackend, C: CheckpointStrategy, const N: usize>(
    tensors: Vec<Tensor<B>>,
    dim: usize,
) -> Tensor<B> {
    let nodes: [_; N] = core::array::from_fn(|i| tensors[i].node.clone());
    let sizes: Vec<usize> = tensors.iter().map(|t| t.primitive.shape()[dim]).collect();
    let primitives = tensors.into_iter().map(|t| t.primitive).collect();
    match ConcatBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((sizes, dim), B::float_concat(primitives, dim)),
        OpsKind::UnTracked(prep) => prep.finish(B::float_concat(primitives, dim)),
    }
}

macro_rules! concat_by_count {
    ($tensors:ident, $dim:ident, $($n:literal)+) => {
        match $tensors.len() {
            $($n => concat_n::<B, C, $n>($tensors, $dim),)+
            _ => unreachable!("at most {MAX_TRACKED_INPUTS} inputs"),
        }
    };
}

impl<B: ConcatBackend, C: CheckpointStrategy> ConcatBackend for Autodiff<B, C> {
    fn float_concat(mut tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        if tensors.len() > MAX_TRACKED_INPUTS {
            let mut groups = Vec::new();
            while !tensors.is_empty() {
                let rest = tensors.split_off(tensors.len().min(MAX_TRACKED_INPUTS));
                groups.push(Self::float_concat(tensors, dim));
                tensors = rest;
            }
            return Self::float_concat(groups, dim);
        }
        concat_by_count!(tensors, dim, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }

    fn int_concat(tensors: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self> {
        B::int_concat(tensors, dim)
    }

    fn float_split(
        tensor: FloatTensor<Self>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<FloatTensor<Self>> {
        let shape = tensor.primitive.shape().to_vec();
        let pieces = B::float_split(tensor.primitive.clone(), sizes, dim);
        let mut start = 0;
        pieces
            .into_iter()
            .zip(sizes)
            .map(|(piece, &size)| {
                let state = (shape.clone(), start, size, dim);
                start += size;
                match SplitBackward
                    .prepare::<C>([tensor.node.clone()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(state, piece),
                    OpsKind::UnTracked(prep) => prep.finish(piece),
                }
            })
            .collect()
    }

    fn int_split(tensor: IntTensor<Self>, sizes: &[usize], dim: usize) -> Vec<IntTensor<Self>> {
        B::int_split(tensor, sizes, dim)
    }
}
