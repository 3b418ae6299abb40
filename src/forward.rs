//! [`Forward`]: the forward a wrapped model's replicas run in [`DataParallel::forward`](crate::DataParallel::forward).

use burn::tensor::backend::Backend;

use crate::gather::Gather;
use crate::scatter::Scatter;

/// A module that [`DataParallel::forward`](crate::DataParallel::forward) can run: one input type to split, one output type
/// to gather.
///
/// # Example
///
/// ```
/// use burn::nn::Linear;
/// use burn::tensor::{Tensor, backend::Backend};
/// use burn_dataparallel::{ConcatBackend, Forward};
///
/// #[derive(burn::module::Module, Debug)]
/// struct Classifier<B: Backend> {
///     linear: Linear<B>,
/// }
///
/// // `ConcatBackend`: every Burn backend but Candle, LibTorch and the router, with or
/// // without autodiff, so that the wrapper's `valid()` copy can run it too.
/// impl<B: ConcatBackend> Forward<B> for Classifier<B> {
///     type Input = Tensor<B, 2>;
///     type Output = Tensor<B, 2>;
///
///     fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
///         self.linear.forward(input)
///     }
/// }
/// ```
pub trait Forward<B: Backend> {
    /// What the forward takes; split into one shard per replica.
    type Input: Scatter<B> + Send;
    /// What the forward returns; gathered from all replicas.
    type Output: Gather<B> + Send;

    /// Runs the module on one shard.
    fn forward(&self, input: Self::Input) -> Self::Output;
}
