//! Values given whole to every replica rather than split: [`Broadcast`] tensors, [`Shared`]
//! values, and plain values (numbers, strings) that hold no tensor.

use burn::tensor::Tensor;
use burn::tensor::kind::Basic;

use super::Scatter;
use crate::error::DataParallelError;
use crate::shards::Shards;
use crate::transfer::move_to;

/// A tensor every replica receives whole, on its own device: a learnable scale, prototypes,
/// a shared embedding table. Its gradient is the sum of the replicas', as for a parameter.
///
/// # Example
///
/// ```
/// use burn::tensor::{Device, Tensor};
/// use burn_dataparallel::{Broadcast, Scatter, Shards};
///
/// let device = Device::flex();
/// let input = (Tensor::<2>::ones([4, 3], &device), Broadcast(Tensor::<1>::ones([3], &device)));
/// let shards = Shards::new(4, &[device.clone(), device.clone()], None, 0, device);
/// let parts = input.scatter(&shards);
/// assert_eq!(parts[1].1.0.dims(), [3]);
/// ```
#[derive(Debug, Clone)]
pub struct Broadcast<T>(pub T);

impl<const D: usize, K: Basic + 'static> Scatter for Broadcast<Tensor<D, K>> {
    fn batch_size(&self, _dim: usize) -> Result<Option<usize>, DataParallelError> {
        Ok(None)
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        let Broadcast(tensor) = self;
        shards
            .devices()
            .iter()
            .map(|device| Broadcast(move_to(tensor.clone(), device)))
            .collect()
    }

    fn carries_gradients(&self) -> bool {
        super::tracked(&self.0)
    }
}

/// A value given to every replica as it is (cloned): a configuration, a tokenizer, a flag.
///
/// A tensor inside it is not moved to the replicas' devices: pass tensors as they are (split)
/// or in [`Broadcast`] (whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shared<T>(pub T);

impl<T: Clone> Scatter for Shared<T> {
    fn batch_size(&self, _dim: usize) -> Result<Option<usize>, DataParallelError> {
        Ok(None)
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        vec![self; shards.len()]
    }
}

macro_rules! scatter_shared {
    ($($ty:ty),+) => {
        $(
            impl Scatter for $ty {
                fn batch_size(&self, _dim: usize) -> Result<Option<usize>, DataParallelError> {
                    Ok(None)
                }

                fn scatter(self, shards: &Shards) -> Vec<Self> {
                    vec![self; shards.len()]
                }

                fn carries_gradients(&self) -> bool {
                    false
                }
            }
        )+
    };
}

scatter_shared!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    usize,
    i8,
    i16,
    i32,
    i64,
    isize,
    f32,
    f64,
    String,
    &'static str
);
