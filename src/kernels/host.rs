//! [`ShardOps`] on Flex, Burn's CPU backend: its own `cat` and slices (a copy on the CPU is
//! a copy whichever way it is launched), so that tensors on it take the crate's autodiff
//! backward, a split's a single concatenation.

use burn::backend::Flex;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;

use super::ShardOps;

impl ShardOps for Flex {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        <Self as FloatTensorOps<Self>>::float_cat(tensors, dim)
    }

    fn split(tensor: FloatTensor<Self>, sizes: &[usize], dim: usize) -> Vec<FloatTensor<Self>> {
        super::by_slices::<Self>(tensor, sizes, dim)
    }
}
