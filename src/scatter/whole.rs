//! Values given whole to every replica rather than split: [`Broadcast`] tensors, [`Shared`]
//! values, and plain values (numbers, strings) that hold no tensor.

use burn::tensor::{Tensor, backend::Backend};

use super::Scatter;
use crate::backend::{ConcatKind, Part, comm};
use crate::backward::ties;
use crate::error::DataParallelError;
use crate::shards::Shards;

/// A tensor given whole to every replica, on the replica's device, rather than split: a
/// lookup table, a set of class prototypes, a learnable value used by every shard's loss.
///
/// Under `Autodiff`, the replicas' gradients of a tracked tensor are summed back into it, as
/// for a parameter. This is how a replica's forward uses a tracked tensor that is not part of
/// the batch: the forward passed to [`forward_with`](crate::DataParallel::forward_with)
/// captures nothing, so such a tensor travels in the input.
///
/// # Example
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Tensor;
/// use burn_dataparallel::{Broadcast, DataParallel};
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let model: Linear<B> = LinearConfig::new(4, 3).init(&device);
/// let dp = DataParallel::new(model, vec![device; 2]).unwrap();
/// let scale = Tensor::<B, 2>::ones([1, 3], &device).require_grad();
/// let x = Tensor::<B, 2>::ones([6, 4], &device);
/// let y = dp.forward_with((x, Broadcast(scale.clone())), |m, (x, Broadcast(s))| {
///     m.forward(x) * s
/// });
/// let grads = y.sum().backward();
/// assert_eq!(scale.grad(&grads).unwrap().dims(), [1, 3]);
/// ```
#[derive(Debug, Clone)]
pub struct Broadcast<T>(pub T);

impl<B: Backend, const D: usize, K: ConcatKind<B>> Scatter<B> for Broadcast<Tensor<B, D, K>> {
    fn batch_size(&self, _dim: usize) -> Result<Option<usize>, DataParallelError> {
        Ok(None)
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
        let Broadcast(tensor) = self;
        let ties = ties::current::<B>();
        let value = ties.source(&tensor);
        shards
            .devices()
            .iter()
            .enumerate()
            .map(|(replica, device)| {
                let copy = comm::move_to(value.clone(), device);
                Broadcast(ties.input(copy, &tensor, replica, Part::Whole))
            })
            .collect()
    }

    fn scatters_every_tensor(&self) -> bool {
        true
    }
}

/// A value given unchanged to every replica.
///
/// Wrap any `Clone` value that is not a batch (a config, a lookup table, a flag) so that it can
/// travel inside a scattered input.
///
/// The wrapper cannot see inside a `Shared` value, and one that could own a tensor (a type
/// with drop glue: a `Vec`, a `String`, a module, a tensor) may hand every replica the
/// caller's own tracked tensor. A forward whose input holds such a value therefore runs the
/// exact path of [`forward_with_captures`](crate::DataParallel::forward_with_captures), which
/// gives every tracked tensor its gradient; plain values (numbers, flags, `Copy` structs) do
/// not change the path. A tensor every replica reads whole goes faster in [`Broadcast`], and
/// a `Vec` of numbers or strings is itself a [`Scatter`] value, given to every replica as is.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use burn_dataparallel::{Scatter, Shared, Shards};
///
/// let device = Default::default();
/// let input = (Tensor::<Flex, 1>::ones([4], &device), Shared(vec!["label"; 3]));
/// let shards = Shards::<Flex>::new(4, &[device, device], None, 0, device);
/// for (tensor, shared) in input.scatter(&shards) {
///     assert_eq!(tensor.dims(), [2]);
///     assert_eq!(shared.0.len(), 3);
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shared<T>(pub T);

fn replicate_value<T: Clone, B: Backend>(value: T, shards: &Shards<B>) -> Vec<T> {
    vec![value; shards.len()]
}

impl<B: Backend, T: Clone + 'static> Scatter<B> for Shared<T> {
    fn batch_size(&self, _dim: usize) -> Result<Option<usize>, DataParallelError> {
        Ok(None)
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
        replicate_value(self, shards)
    }

    /// A `'static` type without drop glue owns no tensor (a tensor holds reference counts).
    fn scatters_every_tensor(&self) -> bool {
        !std::mem::needs_drop::<T>()
    }
}

macro_rules! scatter_shared {
    ($($ty:ty),+) => {
        $(
            impl<B: Backend> Scatter<B> for $ty {
                fn batch_size(&self, _dim: usize) -> Result<Option<usize>, DataParallelError> {
                    Ok(None)
                }

                fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
                    replicate_value(self, shards)
                }

                fn scatters_every_tensor(&self) -> bool {
                    true
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
