//! [`ShardOps`] under Burn's Fusion: Fusion's own `cat` and slices, not the crate's kernels.
//!
//! Burn 0.22's CubeCL Fusion fuses `cat` with the element-wise operations around it (the
//! loss after a gather): one generated kernel where the crate's kernel, a custom operation
//! Fusion cannot see into, would end the fused block before it and start one after it. As a
//! custom operation the kernel measured slower at the sizes a step gathers, though faster
//! with many large inputs (figures in `benches/RESULTS.md`). Slices are views or fused reads
//! likewise. The autodiff backward around them is still the crate's.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn_fusion::{Fusion, FusionBackend};

use super::ShardOps;

impl<B: FusionBackend> ShardOps for Fusion<B> {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        <Self as FloatTensorOps<Self>>::float_cat(tensors, dim)
    }

    fn split(tensor: FloatTensor<Self>, sizes: &[usize], dim: usize) -> Vec<FloatTensor<Self>> {
        super::by_slices::<Self>(tensor, sizes, dim)
    }
}
