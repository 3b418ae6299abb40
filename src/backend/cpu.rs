//! The extension traits for Burn's CPU backends: Burn's own operations, no kernels of this
//! crate's. Both run the whole pipeline with replicas sharing the one CPU device.

use super::{ConcatOps, ReplicaOps, TransferOps};

#[cfg(feature = "flex")]
impl ConcatOps for burn::backend::Flex {}
#[cfg(feature = "flex")]
impl TransferOps for burn::backend::Flex {}
#[cfg(feature = "flex")]
impl ReplicaOps for burn::backend::Flex {}

#[cfg(feature = "ndarray")]
impl<E, I, Q> ConcatOps for burn::backend::NdArray<E, I, Q>
where
    burn::backend::NdArray<E, I, Q>: burn::tensor::backend::Backend,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
}
#[cfg(feature = "ndarray")]
impl<E, I, Q> TransferOps for burn::backend::NdArray<E, I, Q>
where
    burn::backend::NdArray<E, I, Q>: burn::tensor::backend::Backend,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
}
#[cfg(feature = "ndarray")]
impl<E, I, Q> ReplicaOps for burn::backend::NdArray<E, I, Q>
where
    burn::backend::NdArray<E, I, Q>: burn::tensor::backend::Backend,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
}
