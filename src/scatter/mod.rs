//! Splitting a batch into one shard per replica: [`Scatter`] and its impls for tensors and
//! the containers that hold them.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};

use burn::tensor::Tensor;
use burn::tensor::kind::Basic;

use crate::error::DataParallelError;
use crate::shards::Shards;
use crate::transfer::move_to;

mod whole;

pub use whole::{Broadcast, Shared};

/// A value that can be split into one part per replica.
///
/// Tensors are split along the batch dimension and moved to each shard's device; tuples,
/// `Vec`, arrays, `Option` and maps are walked; [`Broadcast`] tensors and plain values
/// (numbers, strings, [`Shared`]) go whole to every replica. For a struct of your own,
/// `#[derive(Scatter)]` writes the impl from its fields (generic structs too;
/// `#[scatter(loss_weight = f)]` states [`loss_weight`](Scatter::loss_weight)), as does
/// [`impl_scatter!`](crate::impl_scatter).
///
/// # Example
///
/// ```
/// use burn::tensor::{Device, Tensor};
/// use burn_dataparallel::{Scatter, Shards};
///
/// let device = Device::flex();
/// let batch = (Tensor::<2>::ones([5, 3], &device), 0.5f32);
/// let shards = Shards::new(5, &[device.clone(), device.clone()], None, 0, device);
/// let parts = batch.scatter(&shards);
/// assert_eq!(parts[0].0.dims(), [3, 3]);
/// assert_eq!(parts[1].0.dims(), [2, 3]);
/// assert_eq!(parts[1].1, 0.5);
/// ```
///
/// A batch struct:
///
/// ```
/// use burn::tensor::{Device, Int, Tensor};
/// use burn_dataparallel::{Scatter, Shards};
///
/// #[derive(Debug, Clone, Scatter)]
/// struct ImageBatch {
///     images: Tensor<4>,
///     targets: Tensor<1, Int>,
/// }
///
/// let device = Device::flex();
/// let batch = ImageBatch {
///     images: Tensor::zeros([6, 3, 8, 8], &device),
///     targets: Tensor::zeros([6], &device),
/// };
/// let shards = Shards::new(6, &[device.clone(), device.clone()], None, 0, device);
/// assert_eq!(batch.scatter(&shards)[1].images.dims(), [3, 3, 8, 8]);
/// ```
///
/// The derive needs a struct with named fields; an enum is refused:
///
/// ```compile_fail
/// use burn::tensor::Tensor;
/// use burn_dataparallel::Scatter;
///
/// #[derive(Scatter)]
/// enum Input {
///     Features(Tensor<2>),
///     Images(Tensor<4>),
/// }
/// ```
pub trait Scatter: Sized {
    /// The size of the batch along `dim`, or `None` when the value holds no tensor to split.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::DimOutOfRange`] for a tensor without `dim`;
    /// [`DataParallelError::BatchSizeMismatch`] when two tensors disagree on the size.
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError>;

    /// Splits the value into one part per shard, each on its shard's device.
    fn scatter(self, shards: &Shards) -> Vec<Self>;

    /// The weight of this part in the batch's loss, where the number of rows is not it (a
    /// masked mean, a class-weighted loss): the wrapper combines the replicas' [`Mean`]
    /// losses by these weights instead of by rows. `None` (the default) leaves rows.
    ///
    /// [`Mean`]: crate::Mean
    fn loss_weight(&self) -> Option<f64> {
        None
    }

    /// Whether a tensor of the value takes part in an autodiff graph (a parameter, or the
    /// output of operations on one). On burn-train's path, where every replica runs its own
    /// backward, replicas whose inputs carry no gradients run at once; otherwise one after
    /// the other (Burn 0.22.1 loses a recorded step when threads record into one graph).
    /// The default, for values the crate cannot look into, is `true`.
    fn carries_gradients(&self) -> bool {
        true
    }
}

/// The batch size of two parts of one input, for [`Scatter::batch_size`] impls.
///
/// # Errors
///
/// [`DataParallelError::BatchSizeMismatch`] when both have a size and they differ.
#[doc(hidden)]
pub fn merge_batch_size(
    first: Option<usize>,
    second: Option<usize>,
    dim: usize,
) -> Result<Option<usize>, DataParallelError> {
    match (first, second) {
        (Some(expected), Some(found)) if expected != found => {
            Err(DataParallelError::BatchSizeMismatch {
                dim,
                expected,
                found,
            })
        }
        (Some(size), _) | (None, Some(size)) => Ok(Some(size)),
        (None, None) => Ok(None),
    }
}

/// Whether `tensor` is a float tensor in an autodiff graph (other kinds never are).
pub(crate) fn tracked<const D: usize, K: Basic + 'static>(tensor: &Tensor<D, K>) -> bool {
    (tensor as &dyn Any)
        .downcast_ref::<Tensor<D>>()
        .is_some_and(Tensor::is_tracked)
}

impl<const D: usize, K: Basic + 'static> Scatter for Tensor<D, K> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        if dim >= D {
            return Err(DataParallelError::DimOutOfRange { dim, rank: D });
        }
        Ok(Some(self.dims()[dim]))
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        crate::kernels::split(self, shards.sizes().to_vec(), shards.dim())
            .into_iter()
            .zip(shards.devices())
            .map(|(piece, device)| move_to(piece, device))
            .collect()
    }

    fn carries_gradients(&self) -> bool {
        tracked(self)
    }
}

impl<T: Scatter> Scatter for Option<T> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        match self {
            Some(value) => value.batch_size(dim),
            None => Ok(None),
        }
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        match self {
            Some(value) => value.scatter(shards).into_iter().map(Some).collect(),
            None => (0..shards.len()).map(|_| None).collect(),
        }
    }

    fn loss_weight(&self) -> Option<f64> {
        self.as_ref().and_then(Scatter::loss_weight)
    }

    fn carries_gradients(&self) -> bool {
        self.as_ref().is_some_and(Scatter::carries_gradients)
    }
}

/// The batch size of several parts of one input.
fn merge_all<'a, T: Scatter + 'a>(
    items: impl IntoIterator<Item = &'a T>,
    dim: usize,
) -> Result<Option<usize>, DataParallelError> {
    items.into_iter().try_fold(None, |size, item| {
        merge_batch_size(size, item.batch_size(dim)?, dim)
    })
}

impl<T: Scatter> Scatter for Vec<T> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        merge_all(self, dim)
    }

    fn carries_gradients(&self) -> bool {
        self.iter().any(Scatter::carries_gradients)
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        let mut parts: Vec<Self> = (0..shards.len())
            .map(|_| Vec::with_capacity(self.len()))
            .collect();
        for item in self {
            for (part, piece) in parts.iter_mut().zip(item.scatter(shards)) {
                part.push(piece);
            }
        }
        parts
    }
}

impl<T: Scatter, const N: usize> Scatter for [T; N] {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        merge_all(self, dim)
    }

    fn carries_gradients(&self) -> bool {
        self.iter().any(Scatter::carries_gradients)
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        Vec::from(self)
            .scatter(shards)
            .into_iter()
            .map(|part| {
                let mut items = part.into_iter();
                core::array::from_fn(|_| items.next().expect("one piece per item"))
            })
            .collect()
    }
}

macro_rules! scatter_tuple {
    ($($name:ident : $index:tt),+) => {
        impl<$($name: Scatter),+> Scatter for ($($name,)+) {
            fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
                let size = None;
                $(let size = merge_batch_size(size, self.$index.batch_size(dim)?, dim)?;)+
                Ok(size)
            }

            #[allow(non_snake_case)]
            fn scatter(self, shards: &Shards) -> Vec<Self> {
                $(let mut $name = self.$index.scatter(shards).into_iter();)+
                (0..shards.len())
                    .map(|_| ($($name.next().expect("one piece per shard"),)+))
                    .collect()
            }

            fn loss_weight(&self) -> Option<f64> {
                None$(.or_else(|| self.$index.loss_weight()))+
            }

            fn carries_gradients(&self) -> bool {
                false $(|| self.$index.carries_gradients())+
            }
        }
    };
}

scatter_tuple!(T0: 0);
scatter_tuple!(T0: 0, T1: 1);
scatter_tuple!(T0: 0, T1: 1, T2: 2);
scatter_tuple!(T0: 0, T1: 1, T2: 2, T3: 3);
scatter_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4);
scatter_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4, T5: 5);
scatter_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4, T5: 5, T6: 6);
scatter_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4, T5: 5, T6: 6, T7: 7);

impl<K: Ord + Clone, V: Scatter> Scatter for BTreeMap<K, V> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        merge_all(self.values(), dim)
    }

    fn carries_gradients(&self) -> bool {
        self.values().any(Scatter::carries_gradients)
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        let mut parts: Vec<Self> = (0..shards.len()).map(|_| BTreeMap::new()).collect();
        for (key, value) in self {
            for (part, piece) in parts.iter_mut().zip(value.scatter(shards)) {
                part.insert(key.clone(), piece);
            }
        }
        parts
    }
}

impl<K, V, S> Scatter for HashMap<K, V, S>
where
    K: Eq + Hash + Clone,
    V: Scatter,
    S: BuildHasher + Clone,
{
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        merge_all(self.values(), dim)
    }

    fn carries_gradients(&self) -> bool {
        self.values().any(Scatter::carries_gradients)
    }

    fn scatter(self, shards: &Shards) -> Vec<Self> {
        let hasher = self.hasher().clone();
        let mut parts: Vec<Self> = (0..shards.len())
            .map(|_| HashMap::with_capacity_and_hasher(self.len(), hasher.clone()))
            .collect();
        for (key, value) in self {
            for (part, piece) in parts.iter_mut().zip(value.scatter(shards)) {
                part.insert(key.clone(), piece);
            }
        }
        parts
    }
}

/// Each part's share of the batch's loss where the parts state loss weights
/// ([`Scatter::loss_weight`]), `None` where none does.
///
/// # Errors
///
/// [`DataParallelError::InvalidLossWeight`] for a weight that is negative, not finite or
/// missing beside others; [`DataParallelError::ZeroLossWeights`] when they add up to zero.
pub(crate) fn stated_shares<I: Scatter>(
    parts: &[I],
) -> Result<Option<Vec<f64>>, DataParallelError> {
    let weights: Vec<Option<f64>> = parts.iter().map(Scatter::loss_weight).collect();
    if weights.iter().all(Option::is_none) {
        return Ok(None);
    }
    let bad = |w: &Option<f64>| !w.is_some_and(|w| w.is_finite() && w >= 0.0);
    if let Some(shard) = weights.iter().position(bad) {
        return Err(DataParallelError::InvalidLossWeight {
            shard,
            weight: weights[shard],
        });
    }
    let weights: Vec<f64> = weights.into_iter().flatten().collect();
    let total: f64 = weights.iter().sum();
    if total == 0.0 {
        return Err(DataParallelError::ZeroLossWeights);
    }
    Ok(Some(weights.iter().map(|w| w / total).collect()))
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::tensor::{Device, Int, Tensor};

    use super::{Broadcast, Scatter, Shared};

    #[test]
    fn tensors_in_a_graph_carry_gradients() {
        let device = Device::flex().autodiff();
        let plain = Tensor::<2>::ones([2, 2], &device);
        let leaf = Tensor::<2>::ones([2, 2], &device).require_grad();
        let derived = leaf.clone() * 2.0;
        assert!(!plain.carries_gradients());
        assert!(leaf.carries_gradients());
        assert!(derived.carries_gradients());
        assert!(!Tensor::<1, Int>::zeros([2], &device).carries_gradients());
        assert!((plain.clone(), Broadcast(derived)).carries_gradients());
        assert!(!(plain.clone(), 3usize, Some(plain.clone())).carries_gradients());
        assert!(!vec![plain].carries_gradients());
        // What the crate cannot look into counts as carrying them.
        assert!(Shared(1).carries_gradients());
    }
}
