//! The concatenate/split/move seam of the pipeline.
//!
//! Every concatenation, split and device move that scatter and gather perform goes through
//! these functions; concatenation and splitting run this crate's kernels ([`crate::kernels`]).

use burn::tensor::{Tensor, backend::Backend};

use crate::kernels::{self, ConcatKind};

/// Concatenates `tensors` (all on one device) along `dim`.
pub(crate) fn concat<B: Backend, const D: usize, K: ConcatKind<B>>(
    mut tensors: Vec<Tensor<B, D, K>>,
    dim: usize,
) -> Tensor<B, D, K> {
    if tensors.len() == 1 {
        return tensors.pop().expect("one tensor");
    }
    kernels::concat(tensors, dim)
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
    kernels::split(tensor, sizes, dim)
}

/// Moves `tensor` to `device`, fenced on both sides ([`ConcatKind::move_to`]); a tensor
/// already there is returned as it is.
pub(crate) fn move_to<B: Backend, const D: usize, K: ConcatKind<B>>(
    tensor: Tensor<B, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K> {
    if tensor.device() == *device {
        tensor
    } else {
        let bytes = tensor.shape().num_elements() * tensor.dtype().size();
        crate::profile::count_move(bytes as u64);
        K::move_to(tensor, device)
    }
}
