//! The tensor-level face of [`ConcatBackend`]: [`ConcatKind`] (float, int and bool tensors)
//! and the functions scatter, gather and the transfers call.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{BasicOps, Bool, Float, Int, Tensor, TensorPrimitive};

use super::{ConcatBackend, Part, ReplicaGraphs};

/// A tensor kind that [`concat()`] and [`split()`] accept: float and int tensors go through
/// [`ConcatBackend`], bool tensors through Burn's own operations.
pub trait ConcatKind<B: Backend>: BasicOps<B> + Sized {
    /// Concatenates along `dim`.
    fn concat<const D: usize>(tensors: Vec<Tensor<B, D, Self>>, dim: usize) -> Tensor<B, D, Self>;

    /// Splits along `dim` into pieces of the given sizes.
    fn split<const D: usize>(
        tensor: Tensor<B, D, Self>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<Tensor<B, D, Self>>;

    /// Moves to `device` between a fence on the destination
    /// ([`TransferOps::fence_receive`](crate::TransferOps::fence_receive)) and one on the source
    /// ([`TransferOps::fence_transfers`](crate::TransferOps::fence_transfers)).
    fn move_to<const D: usize>(
        tensor: Tensor<B, D, Self>,
        device: &B::Device,
    ) -> Tensor<B, D, Self>;

    /// The tensor's float primitive when it is part of an autodiff graph; `None` for kinds
    /// without gradients.
    #[doc(hidden)]
    fn tracked_float<const D: usize>(tensor: &Tensor<B, D, Self>) -> Option<FloatTensor<B>> {
        let _ = tensor;
        None
    }

    /// The tensor's values without its autodiff graph (float tensors); the tensor itself for
    /// kinds without gradients.
    #[doc(hidden)]
    fn detach<const D: usize>(tensor: Tensor<B, D, Self>) -> Tensor<B, D, Self> {
        tensor
    }

    /// Replica `replica`'s leaf for a value of this kind ([`ReplicaGraphs::leaf`]): `value`
    /// itself for kinds without gradients.
    #[doc(hidden)]
    fn replica_leaf<const D: usize>(
        value: Tensor<B, D, Self>,
        target: &Tensor<B, D, Self>,
        graphs: &dyn ReplicaGraphs<B>,
        replica: usize,
        part: Part,
    ) -> Tensor<B, D, Self> {
        let _ = (target, graphs, replica, part);
        value
    }

    /// The caller's stand-in for an output of replica `replica`
    /// ([`ReplicaGraphs::output`]); the tensor itself for kinds without gradients.
    #[doc(hidden)]
    fn replica_output<const D: usize>(
        tensor: Tensor<B, D, Self>,
        graphs: &dyn ReplicaGraphs<B>,
        replica: usize,
    ) -> Tensor<B, D, Self> {
        let _ = (graphs, replica);
        tensor
    }
}

/// Burn's `to_device` between fences on the destination and the source, or through host
/// memory on backends with [`TransferOps::host_staged_transfers`].
fn fenced_to_device<B: ConcatBackend, const D: usize, K: BasicOps<B>>(
    tensor: Tensor<B, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K> {
    let source = tensor.device();
    if &source != device {
        super::comm::note_moved(tensor.shape().num_elements() * tensor.dtype().size());
        if B::host_staged_transfers() {
            return super::host_staged(tensor, device);
        }
    }
    B::fence_receive(device);
    let moved = tensor.to_device(device);
    B::fence_transfers(&source);
    moved
}

impl<B: ConcatBackend> ConcatKind<B> for Float {
    fn tracked_float<const D: usize>(tensor: &Tensor<B, D>) -> Option<FloatTensor<B>> {
        match tensor.clone().into_primitive() {
            TensorPrimitive::Float(float) if B::float_is_tracked(&float) => Some(float),
            _ => None,
        }
    }

    fn detach<const D: usize>(tensor: Tensor<B, D>) -> Tensor<B, D> {
        tensor.detach()
    }

    fn replica_leaf<const D: usize>(
        value: Tensor<B, D>,
        target: &Tensor<B, D>,
        graphs: &dyn ReplicaGraphs<B>,
        replica: usize,
        part: Part,
    ) -> Tensor<B, D> {
        match (value.into_primitive(), target.clone().into_primitive()) {
            (TensorPrimitive::Float(value), TensorPrimitive::Float(target)) => {
                Tensor::from_primitive(TensorPrimitive::Float(
                    graphs.leaf(replica, value, &target, part),
                ))
            }
            (value, _) => Tensor::from_primitive(value),
        }
    }

    fn replica_output<const D: usize>(
        tensor: Tensor<B, D>,
        graphs: &dyn ReplicaGraphs<B>,
        replica: usize,
    ) -> Tensor<B, D> {
        match tensor.into_primitive() {
            TensorPrimitive::Float(output) => {
                Tensor::from_primitive(TensorPrimitive::Float(graphs.output(replica, output)))
            }
            quantized => Tensor::from_primitive(quantized),
        }
    }

    fn concat<const D: usize>(tensors: Vec<Tensor<B, D>>, dim: usize) -> Tensor<B, D> {
        let mut floats = Vec::with_capacity(tensors.len());
        for tensor in &tensors {
            match tensor.clone().into_primitive() {
                TensorPrimitive::Float(float) => floats.push(float),
                // Quantized tensors keep Burn's own concatenation.
                TensorPrimitive::QFloat(_) => return Tensor::cat(tensors, dim),
            }
        }
        Tensor::from_primitive(TensorPrimitive::Float(B::float_concat(floats, dim)))
    }

    fn split<const D: usize>(
        tensor: Tensor<B, D>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<Tensor<B, D>> {
        match tensor.clone().into_primitive() {
            TensorPrimitive::Float(float) => B::float_split(float, sizes, dim)
                .into_iter()
                .map(|piece| Tensor::from_primitive(TensorPrimitive::Float(piece)))
                .collect(),
            TensorPrimitive::QFloat(_) => tensor.split_with_sizes(sizes.to_vec(), dim),
        }
    }

    fn move_to<const D: usize>(tensor: Tensor<B, D>, device: &B::Device) -> Tensor<B, D> {
        match tensor.into_primitive() {
            TensorPrimitive::Float(float) => {
                Tensor::from_primitive(TensorPrimitive::Float(B::float_move(float, device)))
            }
            quantized => fenced_to_device(Tensor::from_primitive(quantized), device),
        }
    }
}

impl<B: ConcatBackend> ConcatKind<B> for Int {
    fn concat<const D: usize>(tensors: Vec<Tensor<B, D, Int>>, dim: usize) -> Tensor<B, D, Int> {
        let ints = tensors.into_iter().map(Tensor::into_primitive).collect();
        Tensor::from_primitive(B::int_concat(ints, dim))
    }

    fn split<const D: usize>(
        tensor: Tensor<B, D, Int>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<Tensor<B, D, Int>> {
        B::int_split(tensor.into_primitive(), sizes, dim)
            .into_iter()
            .map(Tensor::from_primitive)
            .collect()
    }

    fn move_to<const D: usize>(tensor: Tensor<B, D, Int>, device: &B::Device) -> Tensor<B, D, Int> {
        fenced_to_device(tensor, device)
    }
}

impl<B: ConcatBackend> ConcatKind<B> for Bool {
    fn concat<const D: usize>(tensors: Vec<Tensor<B, D, Bool>>, dim: usize) -> Tensor<B, D, Bool> {
        Tensor::cat(tensors, dim)
    }

    fn split<const D: usize>(
        tensor: Tensor<B, D, Bool>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<Tensor<B, D, Bool>> {
        tensor.split_with_sizes(sizes.to_vec(), dim)
    }

    fn move_to<const D: usize>(
        tensor: Tensor<B, D, Bool>,
        device: &B::Device,
    ) -> Tensor<B, D, Bool> {
        fenced_to_device(tensor, device)
    }
}

/// Concatenates `tensors` along `dim`, in one kernel launch on CubeCL backends.
///
/// # Shapes
///
/// - tensors: `[d_0, ..., n_i, ..., d_{D-1}]`, `n_i` at `dim`
/// - output: `[d_0, ..., sum(n_i), ..., d_{D-1}]`
///
/// # Panics
///
/// If `tensors` is empty or the tensors differ outside `dim`, in dtype or in device.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use burn_dataparallel::backend::concat;
///
/// let device = Default::default();
/// let parts = vec![Tensor::<Flex, 2>::ones([2, 3], &device), Tensor::zeros([1, 3], &device)];
/// assert_eq!(concat(parts, 0).dims(), [3, 3]);
/// ```
pub fn concat<B: Backend, const D: usize, K: ConcatKind<B>>(
    tensors: Vec<Tensor<B, D, K>>,
    dim: usize,
) -> Tensor<B, D, K> {
    assert!(!tensors.is_empty(), "concat needs at least one tensor");
    assert!(dim < D, "dim {dim} is out of range for rank {D}");
    K::concat(tensors, dim)
}

/// Splits `tensor` along `dim` into pieces of the given sizes: zero-copy views where the layout
/// allows, otherwise one kernel launch on CubeCL backends.
///
/// # Shapes
///
/// - tensor: `[d_0, ..., sum(sizes), ..., d_{D-1}]`
/// - piece `i`: `[d_0, ..., sizes[i], ..., d_{D-1}]`
///
/// # Panics
///
/// If the sizes do not sum to the tensor's size along `dim`.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use burn_dataparallel::backend::split;
///
/// let tensor = Tensor::<Flex, 2>::ones([2, 7], &Default::default());
/// let pieces = split(tensor, &[3, 4], 1);
/// assert_eq!(pieces[1].dims(), [2, 4]);
/// ```
pub fn split<B: Backend, const D: usize, K: ConcatKind<B>>(
    tensor: Tensor<B, D, K>,
    sizes: &[usize],
    dim: usize,
) -> Vec<Tensor<B, D, K>> {
    assert!(dim < D, "dim {dim} is out of range for rank {D}");
    assert_eq!(
        sizes.iter().sum::<usize>(),
        tensor.dims()[dim],
        "split sizes {sizes:?} do not sum to dim {dim} of shape {:?}",
        tensor.dims()
    );
    K::split(tensor, sizes, dim)
}

/// Flattens `tensors` into one buffer, in one kernel launch on CubeCL backends, for a single
/// large transfer; [`uncoalesce()`] gives them back.
///
/// # Shapes
///
/// - tensors: any shapes
/// - output: `[sum of the tensors' element counts]`
///
/// # Panics
///
/// If `tensors` is empty or mixes dtypes or devices.
pub fn coalesce<B: Backend, K: ConcatKind<B>>(tensors: Vec<Tensor<B, 1, K>>) -> Tensor<B, 1, K> {
    concat(tensors, 0)
}

/// Cuts a buffer made by [`coalesce()`] back into flat tensors of the given element counts
/// (zero-copy views where the buffer's alignment allows).
///
/// # Panics
///
/// If the counts do not sum to the buffer's length.
pub fn uncoalesce<B: Backend, K: ConcatKind<B>>(
    buffer: Tensor<B, 1, K>,
    counts: &[usize],
) -> Vec<Tensor<B, 1, K>> {
    split(buffer, counts, 0)
}

/// Moves a flat buffer made by [`coalesce()`] to `device` in one transfer and cuts it there
/// into flat tensors of the given element counts.
///
/// The backward (under an autodiff backend) moves all the pieces' gradients back in one
/// transfer: together with [`coalesce()`], parameters go out and gradients come back as one
/// buffer each instead of one transfer per tensor.
///
/// # Shapes
///
/// - buffer: `[sum(counts)]`
/// - piece `i`: `[counts[i]]`
///
/// # Panics
///
/// If the counts do not sum to the buffer's length.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use burn_dataparallel::backend::{coalesce, move_split};
///
/// let device = Default::default();
/// let weight = Tensor::<Flex, 2>::ones([2, 3], &device);
/// let bias = Tensor::<Flex, 1>::zeros([3], &device);
/// let buffer = coalesce(vec![weight.reshape([6]), bias]);
/// let pieces = move_split(buffer, &[6, 3], &device);
/// assert_eq!(pieces[0].clone().reshape([2, 3]).dims(), [2, 3]);
/// ```
pub fn move_split<B: ConcatBackend>(
    buffer: Tensor<B, 1>,
    counts: &[usize],
    device: &B::Device,
) -> Vec<Tensor<B, 1>> {
    assert_eq!(
        counts.iter().sum::<usize>(),
        buffer.dims()[0],
        "counts {counts:?} do not sum to the buffer's length {}",
        buffer.dims()[0]
    );
    match buffer.into_primitive() {
        TensorPrimitive::Float(float) => B::float_move_split(float, counts, device)
            .into_iter()
            .map(|piece| Tensor::from_primitive(TensorPrimitive::Float(piece)))
            .collect(),
        quantized => fenced_to_device(Tensor::<B, 1>::from_primitive(quantized), device)
            .split_with_sizes(counts.to_vec(), 0),
    }
}

/// Moves `tensor` to `device` the way the wrapper moves shards and outputs: ordered after the
/// work queued on both devices, through host memory where the backend has no copies between
/// the two, and differentiable under `Autodiff` (the gradient goes back to `tensor`'s
/// device). For a tensor that a replica receives as it is (in a [`Shared`](crate::Shared)
/// value) and uses on its own device.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::Tensor;
/// use burn_dataparallel::backend::move_to;
///
/// let device = Default::default();
/// let scale = Tensor::<Flex, 2>::ones([1, 3], &device);
/// assert_eq!(move_to(scale, &device).dims(), [1, 3]);
/// ```
pub fn move_to<B: ConcatBackend, const D: usize, K: ConcatKind<B>>(
    tensor: Tensor<B, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K> {
    super::comm::move_to(tensor, device)
}

/// Whether `tensor` is part of an autodiff graph ([`ReplicaOps::float_is_tracked`]): a
/// trainable leaf, or a tensor computed from one (a parameter that a model's own `optimize`
/// clamped, say).
pub(crate) fn is_tracked<B: ConcatBackend, const D: usize>(tensor: &Tensor<B, D>) -> bool {
    match tensor.clone().into_primitive() {
        TensorPrimitive::Float(float) => B::float_is_tracked(&float),
        TensorPrimitive::QFloat(_) => false,
    }
}
