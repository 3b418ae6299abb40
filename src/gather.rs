//! Combining the replicas' outputs on the output device.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};

use burn::tensor::Tensor;
use burn::tensor::kind::Basic;

use crate::error::DataParallelError;
use crate::kernels::concat;
use crate::shards::Shards;
use crate::transfer::move_to;

/// A value that can be combined from one output per replica.
///
/// Tensors are moved to [`Shards::output_device`] and concatenated along [`Shards::dim`];
/// tuples, `Vec`, arrays, `Option` and maps (`BTreeMap`, `HashMap`: every replica must return
/// the same keys) are walked; [`Mean`] and [`Sum`] combine per-replica reductions such as
/// losses. A user struct gets an implementation from `#[derive(Gather)]` (each named field
/// gathered) or [`impl_gather!`](crate::impl_gather).
///
/// # Example
///
/// ```
/// use burn::tensor::{Device, Tensor};
/// use burn_dataparallel::{Gather, Mean, Shards};
///
/// let device = Device::flex();
/// let shards = Shards::new(3, &[device.clone(), device.clone()], None, 0, device.clone());
/// let outputs = vec![
///     (Tensor::<2>::zeros([2, 4], &device), Mean(Tensor::<1>::from_floats([1.0], &device))),
///     (Tensor::<2>::ones([1, 4], &device), Mean(Tensor::<1>::from_floats([4.0], &device))),
/// ];
/// let (logits, Mean(loss)) = Gather::gather(outputs, &shards).unwrap();
/// assert_eq!(logits.dims(), [3, 4]);
/// // (2 * 1.0 + 1 * 4.0) / 3 = 2.0: the mean over all three items.
/// assert_eq!(loss.into_scalar::<f32>(), 2.0);
/// ```
pub trait Gather: Sized {
    /// Combines `outputs`, one per shard in the order of `shards`, on `shards.output_device()`.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::OutputShapeMismatch`] when tensors differ outside the gather
    /// dimension, [`DataParallelError::OutputStructureMismatch`] when structures differ,
    /// [`DataParallelError::OutputKeysMismatch`] when maps have different keys, and
    /// [`DataParallelError::DimOutOfRange`] when a tensor has no dimension `dim`.
    ///
    /// # Panics
    ///
    /// If `outputs` is empty.
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError>;
}

/// A per-replica mean (a loss with mean reduction) to combine as a mean over the whole batch.
///
/// Gathering weights each replica's value by its shard's share of the batch
/// ([`Shards::loss_shares`]), so the result equals the mean over the whole batch even when
/// shards are uneven (PyTorch's `DataParallel` returns a vector of per-replica losses whose
/// plain `.mean()` does not). The share is the shard's rows by default; a loss normalised by
/// something else (class weights, masked tokens) needs the input to state each part's
/// weight ([`Scatter::loss_weight`](crate::Scatter::loss_weight)).
///
/// # Shapes
///
/// Every replica's tensor has the same shape, which is also the result's shape.
#[derive(Debug, Clone)]
pub struct Mean<T>(pub T);

/// A per-replica sum (a loss with sum reduction) to combine as a sum over the whole batch.
///
/// # Shapes
///
/// Every replica's tensor has the same shape, which is also the result's shape.
#[derive(Debug, Clone)]
pub struct Sum<T>(pub T);

fn check_same_shape<const D: usize>(
    shapes: impl Iterator<Item = [usize; D]>,
    dim: Option<usize>,
) -> Result<(), DataParallelError> {
    let mut shapes = shapes.enumerate();
    let (_, first) = shapes.next().expect("at least one output");
    let masked = |mut shape: [usize; D]| {
        if let Some(dim) = dim {
            shape[dim] = first[dim];
        }
        shape
    };
    match shapes.find(|(_, shape)| masked(*shape) != first) {
        Some((replica, found)) => Err(DataParallelError::OutputShapeMismatch {
            replica,
            expected: first.to_vec(),
            found: found.to_vec(),
            dim,
        }),
        None => Ok(()),
    }
}

fn on_output_device<const D: usize, K: Basic>(
    outputs: Vec<Tensor<D, K>>,
    shards: &Shards,
) -> Vec<Tensor<D, K>> {
    outputs
        .into_iter()
        .map(|tensor| move_to(tensor, shards.output_device()))
        .collect()
}

impl<const D: usize, K: Basic> Gather for Tensor<D, K> {
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        let dim = shards.dim();
        if dim >= D {
            return Err(DataParallelError::DimOutOfRange { dim, rank: D });
        }
        check_same_shape(outputs.iter().map(Tensor::dims), Some(dim))?;
        Ok(concat(on_output_device(outputs, shards), dim))
    }
}

impl<const D: usize> Gather for Mean<Tensor<D>> {
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        check_same_shape(outputs.iter().map(|Mean(t)| t.dims()), None)?;
        let outputs = on_output_device(outputs.into_iter().map(|Mean(t)| t).collect(), shards);
        if outputs.len() == 1 {
            return Ok(Mean(outputs.into_iter().next().expect("one output")));
        }
        // A shard of share zero adds nothing (its own mean may be 0 / 0).
        let weighted = outputs
            .into_iter()
            .zip(shards.loss_shares())
            .filter(|&(_, share)| share != 0.0)
            .map(|(tensor, share)| tensor.mul_scalar(share))
            .reduce(|sum, tensor| sum + tensor)
            .expect("a share above zero");
        Ok(Mean(weighted))
    }
}

impl<const D: usize> Gather for Sum<Tensor<D>> {
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        check_same_shape(outputs.iter().map(|Sum(t)| t.dims()), None)?;
        let outputs = on_output_device(outputs.into_iter().map(|Sum(t)| t).collect(), shards);
        let sum = outputs
            .into_iter()
            .reduce(|sum, tensor| sum + tensor)
            .expect("at least one output");
        Ok(Sum(sum))
    }
}

impl<T: Gather> Gather for Option<T> {
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        let describe = |value: &Option<T>| if value.is_some() { "Some" } else { "None" };
        let expected = describe(&outputs[0]);
        if let Some(replica) = outputs.iter().position(|o| describe(o) != expected) {
            return Err(DataParallelError::OutputStructureMismatch {
                replica,
                expected: expected.into(),
                found: describe(&outputs[replica]).into(),
            });
        }
        match outputs[0] {
            None => Ok(None),
            Some(_) => T::gather(outputs.into_iter().flatten().collect(), shards).map(Some),
        }
    }
}

/// Transposes replica-major items into item-major lists, checking every replica has `len` items.
fn transpose<T>(outputs: Vec<Vec<T>>) -> Result<Vec<Vec<T>>, DataParallelError> {
    let len = outputs[0].len();
    if let Some(replica) = outputs.iter().position(|o| o.len() != len) {
        return Err(DataParallelError::OutputStructureMismatch {
            replica,
            expected: format!("{len} items"),
            found: format!("{} items", outputs[replica].len()),
        });
    }
    let mut items: Vec<Vec<T>> = (0..len)
        .map(|_| Vec::with_capacity(outputs.len()))
        .collect();
    for output in outputs {
        for (item, value) in items.iter_mut().zip(output) {
            item.push(value);
        }
    }
    Ok(items)
}

impl<T: Gather> Gather for Vec<T> {
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        transpose(outputs)?
            .into_iter()
            .map(|item| T::gather(item, shards))
            .collect()
    }
}

impl<T: Gather, const N: usize> Gather for [T; N] {
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        let items = Vec::gather(outputs.into_iter().map(Vec::from).collect(), shards)?;
        let mut items = items.into_iter();
        Ok(core::array::from_fn(|_| items.next().expect("N items")))
    }
}

/// The first replica whose keys differ from replica 0's, with the keys missing from it and
/// those it has in addition.
fn key_mismatch<'a, K: std::fmt::Debug + 'a>(
    first: &[&'a K],
    others: impl Iterator<Item = Vec<&'a K>>,
    same: impl Fn(&K, &K) -> bool,
) -> Result<(), DataParallelError> {
    for (index, keys) in others.enumerate() {
        let missing: Vec<String> = (first.iter())
            .filter(|k| !keys.iter().any(|o| same(k, o)))
            .map(|k| format!("{k:?}"))
            .collect();
        let unexpected: Vec<String> = (keys.iter())
            .filter(|k| !first.iter().any(|o| same(k, o)))
            .map(|k| format!("{k:?}"))
            .collect();
        if !missing.is_empty() || !unexpected.is_empty() {
            return Err(DataParallelError::OutputKeysMismatch {
                replica: index + 1,
                missing,
                unexpected,
            });
        }
    }
    Ok(())
}

impl<K: Ord + std::fmt::Debug, V: Gather> Gather for BTreeMap<K, V> {
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        let first: Vec<&K> = outputs[0].keys().collect();
        key_mismatch(
            &first,
            outputs[1..].iter().map(|o| o.keys().collect()),
            |a, b| a == b,
        )?;
        let mut columns: BTreeMap<K, Vec<V>> = BTreeMap::new();
        for output in outputs {
            for (key, value) in output {
                columns.entry(key).or_default().push(value);
            }
        }
        columns
            .into_iter()
            .map(|(key, values)| Ok((key, V::gather(values, shards)?)))
            .collect()
    }
}

impl<K, V, S> Gather for HashMap<K, V, S>
where
    K: Eq + Hash + std::fmt::Debug,
    V: Gather,
    S: BuildHasher + Clone,
{
    fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
        let first: Vec<&K> = outputs[0].keys().collect();
        key_mismatch(
            &first,
            outputs[1..].iter().map(|o| o.keys().collect()),
            |a, b| a == b,
        )?;
        let hasher = outputs[0].hasher().clone();
        let mut columns: HashMap<K, Vec<V>, S> = HashMap::with_hasher(hasher.clone());
        for output in outputs {
            for (key, value) in output {
                columns.entry(key).or_default().push(value);
            }
        }
        let mut gathered = HashMap::with_capacity_and_hasher(columns.len(), hasher);
        for (key, values) in columns {
            gathered.insert(key, V::gather(values, shards)?);
        }
        Ok(gathered)
    }
}

impl Gather for () {
    fn gather(_outputs: Vec<Self>, _shards: &Shards) -> Result<Self, DataParallelError> {
        Ok(())
    }
}

macro_rules! gather_tuple {
    ($($name:ident : $index:tt),+) => {
        impl<$($name: Gather),+> Gather for ($($name,)+) {
            #[allow(non_snake_case)]
            fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
                $(let mut $name = Vec::with_capacity(outputs.len());)+
                for output in outputs {
                    $($name.push(output.$index);)+
                }
                Ok(($(<$name as Gather>::gather($name, shards)?,)+))
            }
        }
    };
}

gather_tuple!(T0: 0);
gather_tuple!(T0: 0, T1: 1);
gather_tuple!(T0: 0, T1: 1, T2: 2);
gather_tuple!(T0: 0, T1: 1, T2: 2, T3: 3);
gather_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4);
gather_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4, T5: 5);
gather_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4, T5: 5, T6: 6);
gather_tuple!(T0: 0, T1: 1, T2: 2, T3: 3, T4: 4, T5: 5, T6: 6, T7: 7);
