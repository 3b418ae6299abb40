//! [`ConcatOps`] under Burn's Fusion: Fusion's own `cat`, not the crate's kernel.
//!
//! Burn 0.22's CubeCL Fusion fuses `cat` with the element-wise operations around it (the
//! loss after a gather): one generated kernel where the crate's kernel, a custom operation
//! Fusion cannot see into, would end the fused block before it and start one after it. As a
//! custom operation the kernel measured slower at the sizes a step gathers, though faster
//! with many large inputs (figures in `benches/RESULTS.md`). The autodiff backward around it
//! is still the crate's.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn_fusion::{Fusion, FusionBackend};

use super::ConcatOps;

impl<B: FusionBackend> ConcatOps for Fusion<B> {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        <Self as FloatTensorOps<Self>>::float_cat(tensors, dim)
    }
}
