//! Splitting a batch into one shard per replica.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};

use burn::tensor::{Tensor, backend::Backend};

use crate::backend::{ConcatKind, Part, comm};
use crate::backward::ties;
use crate::error::DataParallelError;
use crate::shards::Shards;

mod whole;

pub use whole::{Broadcast, Shared};

/// A value that can be split into one shard per replica.
///
/// Tensors are split along [`Shards::dim`] and moved to each shard's device; tuples, `Vec`,
/// arrays and `Option` are walked; values that hold no tensor (numbers, strings, [`Shared`])
/// are cloned into every shard. A user struct gets an implementation from
/// [`impl_scatter!`](crate::impl_scatter).
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::{Int, Tensor};
/// use burn_dataparallel::{Scatter, Shards};
///
/// let device = Default::default();
/// let batch = (
///     Tensor::<Flex, 2>::ones([5, 3], &device),
///     Tensor::<Flex, 1, Int>::arange(0..5, &device),
/// );
/// assert_eq!(batch.batch_size(0).unwrap(), Some(5));
///
/// let shards = Shards::<Flex>::new(5, &[device, device], None, 0, device);
/// let parts = batch.scatter(&shards);
/// assert_eq!(parts[0].0.dims(), [3, 3]);
/// assert_eq!(parts[1].1.dims(), [2]);
/// ```
pub trait Scatter<B: Backend>: Sized {
    /// Size of the batch along `dim`, or `None` when the value holds no tensor.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::BatchSizeMismatch`] when two tensors disagree, and
    /// [`DataParallelError::DimOutOfRange`] when a tensor has no dimension `dim`.
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError>;

    /// Splits the value into [`Shards::len`] parts, part `i` on `shards.devices()[i]`.
    ///
    /// # Panics
    ///
    /// If the value's batch size is not [`Shards::batch_size`]; call
    /// [`batch_size`](Scatter::batch_size) first.
    fn scatter(self, shards: &Shards<B>) -> Vec<Self>;

    /// This part's weight in a mean-reduced loss, when it is not its number of rows.
    ///
    /// Under [`LossReduction::Mean`](crate::LossReduction::Mean) the wrapper weights each
    /// replica's gradients (under burn-train's `Learner`) and each replica's [`Mean`](crate::Mean)
    /// value by its shard's share of the batch ([`Shards::loss_shares`]). By default a share
    /// is the shard's rows over the batch's, which is exact when the loss is a plain mean over
    /// rows. A loss normalised by something else is the whole batch's only when each shard is
    /// weighted by that normaliser: return it here, for each scattered part (for a
    /// class-weighted cross-entropy, the sum of the class weights of the part's targets; for
    /// masked tokens, the part's unmasked count; for per-sample weights, their sum). A part
    /// whose weight is zero (every token masked) adds nothing, where its own mean is 0/0.
    ///
    /// Called on the calling thread, on every part, after [`scatter`](Scatter::scatter) and
    /// before the replicas run; reading a tensor here waits for it. Tuples and `Option` pass
    /// on the first weight among their fields; `None`, the default, means rows.
    /// [`impl_scatter!`](crate::impl_scatter) takes `loss_weight = |part| ...`.
    ///
    /// # Errors
    ///
    /// The forward or the step returns [`DataParallelError::InvalidLossWeight`] for a weight
    /// that is negative, infinite or NaN, or that only some parts state, and
    /// [`DataParallelError::ZeroLossWeights`] when every part's weight is zero.
    fn loss_weight(&self) -> Option<f64> {
        None
    }

    /// Whether every tensor that [`scatter`](Scatter::scatter) hands to the parts goes through
    /// a `Scatter` of this crate's own (a tensor's split, a [`Broadcast`] copy, a value that
    /// holds no tensor), which ties it to the caller's autodiff graph.
    ///
    /// The forward's fast path (each replica's backward on its own graph, at the same time)
    /// needs every tracked tensor a replica touches to be tied that way; a value the wrapper
    /// cannot see into might hand a replica the caller's own tensor, so a forward whose
    /// input answers `false` runs the exact path instead, as
    /// [`forward_with_captures`](crate::DataParallel::forward_with_captures) does. `false`
    /// by default; the crate's impls and [`impl_scatter!`](crate::impl_scatter) answer for
    /// their contents, and a hand-written impl that scatters every field through the
    /// field's own `Scatter` may answer as its fields do. A step's profile says which path it
    /// took ([`StepProfile::exact_path`](crate::StepProfile::exact_path)).
    fn scatters_every_tensor(&self) -> bool {
        false
    }
}

/// Combines the batch sizes of two parts of one input (used by [`impl_scatter!`](crate::impl_scatter)).
///
/// # Errors
///
/// [`DataParallelError::BatchSizeMismatch`] when both are known and differ.
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

impl<B: Backend, const D: usize, K: ConcatKind<B>> Scatter<B> for Tensor<B, D, K> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        if dim >= D {
            return Err(DataParallelError::DimOutOfRange { dim, rank: D });
        }
        Ok(Some(self.dims()[dim]))
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
        let ties = ties::current::<B>();
        let part = Part::Rows { dim: shards.dim() };
        comm::split(ties.source(&self), shards.sizes(), shards.dim())
            .into_iter()
            .zip(shards.devices())
            .enumerate()
            .map(|(replica, (piece, device))| {
                ties.input(comm::move_to(piece, device), &self, replica, part)
            })
            .collect()
    }

    fn scatters_every_tensor(&self) -> bool {
        true
    }
}

impl<B: Backend, T: Scatter<B>> Scatter<B> for Option<T> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        match self {
            Some(value) => value.batch_size(dim),
            None => Ok(None),
        }
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
        match self {
            Some(value) => value.scatter(shards).into_iter().map(Some).collect(),
            None => (0..shards.len()).map(|_| None).collect(),
        }
    }

    fn loss_weight(&self) -> Option<f64> {
        self.as_ref().and_then(Scatter::<B>::loss_weight)
    }

    fn scatters_every_tensor(&self) -> bool {
        self.as_ref()
            .is_none_or(Scatter::<B>::scatters_every_tensor)
    }
}

impl<B: Backend, T: Scatter<B>> Scatter<B> for Vec<T> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        self.iter().try_fold(None, |size, item| {
            merge_batch_size(size, item.batch_size(dim)?, dim)
        })
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
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

    fn scatters_every_tensor(&self) -> bool {
        self.iter().all(Scatter::<B>::scatters_every_tensor)
    }
}

impl<B: Backend, T: Scatter<B>, const N: usize> Scatter<B> for [T; N] {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        self.iter().try_fold(None, |size, item| {
            merge_batch_size(size, item.batch_size(dim)?, dim)
        })
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
        Vec::from(self)
            .scatter(shards)
            .into_iter()
            .map(|part| {
                let mut items = part.into_iter();
                core::array::from_fn(|_| items.next().expect("one piece per item"))
            })
            .collect()
    }

    fn scatters_every_tensor(&self) -> bool {
        self.iter().all(Scatter::<B>::scatters_every_tensor)
    }
}

macro_rules! scatter_tuple {
    ($($name:ident : $index:tt),+) => {
        impl<B: Backend, $($name: Scatter<B>),+> Scatter<B> for ($($name,)+) {
            fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
                let size = None;
                $(let size = merge_batch_size(size, self.$index.batch_size(dim)?, dim)?;)+
                Ok(size)
            }

            #[allow(non_snake_case)]
            fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
                $(let mut $name = self.$index.scatter(shards).into_iter();)+
                (0..shards.len())
                    .map(|_| ($($name.next().expect("one piece per shard"),)+))
                    .collect()
            }

            fn loss_weight(&self) -> Option<f64> {
                None$(.or_else(|| self.$index.loss_weight()))+
            }

            fn scatters_every_tensor(&self) -> bool {
                true $(&& self.$index.scatters_every_tensor())+
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

impl<B: Backend, K: Ord + Clone, V: Scatter<B>> Scatter<B> for BTreeMap<K, V> {
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        self.values().try_fold(None, |size, value| {
            merge_batch_size(size, value.batch_size(dim)?, dim)
        })
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
        let mut parts: Vec<Self> = (0..shards.len()).map(|_| BTreeMap::new()).collect();
        for (key, value) in self {
            for (part, piece) in parts.iter_mut().zip(value.scatter(shards)) {
                part.insert(key.clone(), piece);
            }
        }
        parts
    }

    fn scatters_every_tensor(&self) -> bool {
        self.values().all(Scatter::<B>::scatters_every_tensor)
    }
}

impl<B, K, V, S> Scatter<B> for HashMap<K, V, S>
where
    B: Backend,
    K: Eq + Hash + Clone,
    V: Scatter<B>,
    S: BuildHasher + Clone,
{
    fn batch_size(&self, dim: usize) -> Result<Option<usize>, DataParallelError> {
        self.values().try_fold(None, |size, value| {
            merge_batch_size(size, value.batch_size(dim)?, dim)
        })
    }

    fn scatter(self, shards: &Shards<B>) -> Vec<Self> {
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

    fn scatters_every_tensor(&self) -> bool {
        self.values().all(Scatter::<B>::scatters_every_tensor)
    }
}

/// The shares of a mean-reduced loss that `parts` (a forward's scattered input) state through
/// [`Scatter::loss_weight`]: their weights over the weights' sum, or `None` when no part
/// states one (rows, then).
///
/// # Errors
///
/// [`DataParallelError::InvalidLossWeight`] for a weight that is negative, infinite or NaN or
/// that only some parts state; [`DataParallelError::ZeroLossWeights`] when all are zero.
pub(crate) fn stated_shares<B: Backend, I: Scatter<B>>(
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
