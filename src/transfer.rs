//! Every move of a tensor between devices: Burn's `to_device`, differentiable under autodiff
//! (its backward moves the gradient back), skipped where the tensor is there already.

use burn::tensor::kind::Basic;
use burn::tensor::{Device, Tensor};

/// `tensor` on `device`.
pub(crate) fn move_to<const D: usize, K: Basic>(
    tensor: Tensor<D, K>,
    device: &Device,
) -> Tensor<D, K> {
    if tensor.device() == *device {
        tensor
    } else {
        tensor.to_device(device)
    }
}
