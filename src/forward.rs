//! [`Forward`]: the forward a wrapped model's replicas run in
//! [`DataParallel::forward`](crate::DataParallel::forward).

use crate::gather::Gather;
use crate::scatter::Scatter;

/// A module that [`DataParallel::forward`](crate::DataParallel::forward) can run: one input
/// type to split, one output type to gather.
///
/// # Example
///
/// ```
/// use burn::module::Module;
/// use burn::nn::Linear;
/// use burn::tensor::Tensor;
/// use burn_dataparallel::Forward;
///
/// #[derive(Module, Debug)]
/// struct Classifier {
///     linear: Linear,
/// }
///
/// impl Forward for Classifier {
///     type Input = Tensor<2>;
///     type Output = Tensor<2>;
///
///     fn forward(&self, input: Tensor<2>) -> Tensor<2> {
///         self.linear.forward(input)
///     }
/// }
/// ```
pub trait Forward {
    /// What the forward takes; split into one shard per replica.
    type Input: Scatter + Send;
    /// What the forward returns; gathered from all replicas.
    type Output: Gather + Send;

    /// Runs the module on one shard.
    fn forward(&self, input: Self::Input) -> Self::Output;
}
