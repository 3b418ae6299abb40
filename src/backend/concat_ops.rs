//! [`ConcatOps`]: concatenation and splitting in one launch, the kernels of the hot path.

use burn::tensor::TensorMetadata;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};

use super::slices;

/// Single-launch concatenation and splitting.
///
/// Every method has a default body built on Burn's own operations (`cat`, `slice`), so a
/// backend without kernels of its own implements the trait with an empty `impl`. CubeCL
/// backends run this crate's kernels; `Fusion` records them as custom operations; `Autodiff`
/// gives them backward steps (the backward of a concatenation is a split and the other way
/// round).
pub trait ConcatOps: Backend {
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
}
