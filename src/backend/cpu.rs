//! [`ConcatBackend`] for Burn's CPU backends: Burn's own operations, no kernels of this
//! crate's. Both run the whole pipeline with replicas sharing the one CPU device.

use super::ConcatBackend;

#[cfg(feature = "flex")]
impl ConcatBackend for burn::backend::Flex {}

#[cfg(feature = "ndarray")]
impl<E, I, Q> ConcatBackend for burn::backend::NdArray<E, I, Q>
where
    burn::backend::NdArray<E, I, Q>: burn::tensor::backend::Backend,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<E>>,
    burn::backend::ndarray::NdArrayTensor: From<burn::backend::ndarray::SharedArray<I>>,
{
}
