//! [`ConcatOps`] under Burn's autodiff: the forward runs the inner backend's kernel, the
//! backward slices the output's gradient back into each input's part.
//!
//! Burn's public `Backward` takes its inputs as an array of a size known when compiling, so
//! the concatenation is written for 2 to 16 inputs (a replica's output each), chosen by the
//! inputs' count; more inputs than that take Burn's own `float_cat`.

use burn::backend::Backend;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, TensorMetadata};
use burn::tensor::Slice;

use super::ConcatOps;

impl<B: Backend + ConcatOps, C: CheckpointStrategy> ConcatOps for Autodiff<B, C> {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        macro_rules! by_count {
            ($($n:literal)*) => {
                match tensors.len() {
                    $($n => concat_n::<B, C, $n>(tensors, dim),)*
                    _ => <Self as FloatTensorOps<Self>>::float_cat(tensors, dim),
                }
            };
        }
        by_count!(2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }
}

/// The backward of a concatenation: each input's rows of the output's gradient.
#[derive(Debug)]
struct ConcatBackward;

/// What the backward needs: the dimension and each input's size along it.
#[derive(Clone, Debug)]
struct Parts {
    dim: usize,
    sizes: Vec<usize>,
}

impl<B: Backend, const N: usize> Backward<B, N> for ConcatBackward {
    type State = Parts;

    fn backward(self, ops: Ops<Parts, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let shape = grad.shape();
        let Parts { dim, sizes } = ops.state;
        let mut start = 0;
        for (parent, size) in ops.parents.into_iter().zip(sizes) {
            let end = start + size;
            if let Some(node) = parent {
                let slices: Vec<Slice> = (0..shape.num_dims())
                    .map(|d| match d == dim {
                        true => Slice::from(start..end),
                        false => Slice::from(0..shape[d]),
                    })
                    .collect();
                grads.register::<B>(node.id, B::float_slice(grad.clone(), &slices));
            }
            start = end;
        }
    }
}

fn concat_n<B: Backend + ConcatOps, C: CheckpointStrategy, const N: usize>(
    tensors: Vec<FloatTensor<Autodiff<B, C>>>,
    dim: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes: [_; N] = tensors
        .iter()
        .map(|tensor| tensor.node())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| unreachable!("called with N tensors"));
    let sizes = tensors.iter().map(|t| t.primitive().shape()[dim]).collect();
    let primitives = tensors.into_iter().map(|t| t.into_primitive()).collect();
    let output = B::concat(primitives, dim);
    match <ConcatBackward as Backward<B, N>>::prepare::<C>(ConcatBackward, nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(Parts { dim, sizes }, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
