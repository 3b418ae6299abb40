//! [`ConcatOps`] under Burn's Fusion: Fusion's own `cat`, not the crate's kernel.
//!
//! Burn 0.22's CubeCL Fusion fuses `cat` with the element-wise operations around it (the
//! loss after a gather): one generated kernel where the crate's kernel, a custom operation
//! Fusion cannot see into, would end the fused block before it and start one after it. The
//! crate's kernel as a custom operation measured 1.4-2x `Tensor::cat`'s time a call on an
//! H200 up to 16 MiB, and 0.7-6x on lavapipe, where without Fusion it is 0.17-0.75x
//! (`benches/RESULTS.md`). The autodiff backward around it is still the crate's.

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn_fusion::{Fusion, FusionBackend};

use super::ConcatOps;

impl<B: FusionBackend> ConcatOps for Fusion<B> {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        <Self as FloatTensorOps<Self>>::float_cat(tensors, dim)
    }
}
