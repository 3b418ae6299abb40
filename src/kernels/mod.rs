//! The crate's kernels, as a Burn backend extension: [`concat`] joins any number of tensors
//! in one launch where Burn's `CubeBackend` launches a copy per input (the gather's hot
//! path), and [`split`] cuts one tensor into pieces in one launch (views where every piece is
//! one block of it) where Burn's slices launch a copy per piece for pieces that are not.
//! Under autodiff each is the other's backward.
//!
//! [`ShardOps`] is the extension trait, implemented for each backend the routing reaches:
//!
//! - `concat.rs`, `split.rs`: the CubeCL kernels and their launches, for `CubeBackend`
//!   (every CubeCL runtime: CUDA, wgpu, ...);
//! - `fusion.rs`: under Burn's Fusion, Fusion's own `cat`, which Fusion fuses with the
//!   operations around it, for a few inputs; for many large ones the kernel as a Fusion
//!   custom operation; Fusion's slices;
//! - `host.rs`: on Flex, Burn's own `cat` and slices;
//! - `autodiff.rs`: the backwards, for every backend above.
//!
//! [`concat`] and [`split`] take each tensor's primitive with Burn's
//! `Tensor::try_into_primitive` for the backend its device names and wrap the results with
//! `Tensor::from_primitive`. (Burn 0.22.1's `#[backend_extension]` would generate that
//! routing, but its extension traits take no `Vec` of tensors.) The kernels are built with
//! the `cuda` or `wgpu` feature (the `kernels` feature); other backends (NdArray, remote
//! servers), tensors that are not float, and tensors on several devices use Burn's
//! `Tensor::cat` and `Tensor::split_with_sizes`.

#[cfg(any(feature = "kernels", feature = "flex"))]
mod autodiff;
#[cfg(feature = "kernels")]
mod concat;
#[cfg(feature = "kernels")]
mod fusion;
#[cfg(feature = "flex")]
mod host;
#[cfg(feature = "kernels")]
mod split;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use burn::tensor::Tensor;
use burn::tensor::kind::Basic;

/// How a concatenation of float tensors runs under Burn's Fusion (`fusion.rs`): by the
/// crate's rule, or one way always. Not part of the API: the crate's benches set it to
/// compare the ways in one process.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusionConcat {
    /// The crate's kernel for many large inputs, Fusion's `cat` otherwise.
    Rule,
    /// The crate's kernel, as a Fusion custom operation.
    Kernel,
    /// Fusion's `cat`.
    Cat,
}

static FUSION_CONCAT: AtomicU8 = AtomicU8::new(FusionConcat::Rule as u8);

/// Sets how concatenations under Burn's Fusion run from now on, in every thread.
#[doc(hidden)]
pub fn set_fusion_concat(way: FusionConcat) {
    FUSION_CONCAT.store(way as u8, Ordering::Relaxed);
}

/// About how many cubes a concatenation launches at most (`concat.rs`, which also keeps a
/// row of the grid within what the device holds); the threads of a cube stride over the rest
/// of its input. Enough that inputs up to hundreds of MiB take one pass (a lower cap
/// measured slower there: `benches/RESULTS.md`).
static CONCAT_CUBES: AtomicUsize = AtomicUsize::new(65536);

/// Sets about how many cubes a concatenation launches at most, from now on, in every thread,
/// and returns the cap before. Not part of the API: the concat bench compares caps in one
/// process.
#[doc(hidden)]
pub fn set_concat_cubes(cubes: usize) -> usize {
    CONCAT_CUBES.swap(cubes.max(1), Ordering::Relaxed)
}

#[cfg(feature = "kernels")]
fn concat_cubes() -> usize {
    CONCAT_CUBES.load(Ordering::Relaxed)
}

/// How many inputs one concatenation launch copies at most (`concat.rs`), below what the
/// device binds; 0: as many as it binds.
static CONCAT_GROUP: AtomicUsize = AtomicUsize::new(0);

/// Sets how many inputs one concatenation launch copies at most (0: as many as the device
/// binds), from now on, in every thread, and returns the setting before. Not part of the API:
/// the concat bench compares groups in one process.
#[doc(hidden)]
pub fn set_concat_group(inputs: usize) -> usize {
    CONCAT_GROUP.swap(inputs, Ordering::Relaxed)
}

#[cfg(feature = "kernels")]
fn concat_group() -> usize {
    match CONCAT_GROUP.load(Ordering::Relaxed) {
        0 => usize::MAX,
        inputs => inputs,
    }
}

#[cfg(feature = "kernels")]
fn fusion_concat() -> FusionConcat {
    match FUSION_CONCAT.load(Ordering::Relaxed) {
        x if x == FusionConcat::Kernel as u8 => FusionConcat::Kernel,
        x if x == FusionConcat::Cat as u8 => FusionConcat::Cat,
        _ => FusionConcat::Rule,
    }
}

/// The crate's operations on a backend's tensors.
#[cfg(any(feature = "kernels", feature = "flex"))]
pub(crate) trait ShardOps: burn::backend::Backend {
    /// `tensors` joined along `dim`, as Burn's `float_cat`.
    fn concat(
        tensors: Vec<burn::backend::tensor::FloatTensor<Self>>,
        dim: usize,
    ) -> burn::backend::tensor::FloatTensor<Self>;

    /// `tensor` cut along `dim` into pieces of `sizes`, as Burn's `float_split_with_sizes`.
    fn split(
        tensor: burn::backend::tensor::FloatTensor<Self>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<burn::backend::tensor::FloatTensor<Self>>;
}

/// `tensors` concatenated along `dim`, with gradients flowing back to each of them: Burn's
/// `Tensor::cat`, in one kernel launch where the crate has a kernel for the device.
///
/// # Shapes
///
/// - tensors: `[d_0, ..., n_i, ..., d_{D-1}]`, `n_i` at `dim`
/// - output: `[d_0, ..., sum(n_i), ..., d_{D-1}]`
///
/// # Panics
///
/// As `Tensor::cat`: if `tensors` is empty, or they differ outside `dim`.
pub(crate) fn concat<const D: usize, K: Basic>(
    tensors: Vec<Tensor<D, K>>,
    dim: usize,
) -> Tensor<D, K> {
    #[cfg(any(feature = "kernels", feature = "flex"))]
    if let Some(first) = tensors.first()
        && tensors.len() > 1
        && first.dtype().is_float()
    {
        let device = first.device();
        if route::has_ops(&device)
            && tensors[1..]
                .iter()
                .all(|t| route::same_backend(&t.device(), &device))
        {
            let tensors = tensors
                .into_iter()
                .map(|t| Tensor::<D>::from_dispatch(t.into_dispatch()))
                .collect();
            let output = route::run(&device, route::Concat { tensors, dim });
            return Tensor::from_dispatch(output.into_dispatch());
        }
    }
    Tensor::cat(tensors, dim)
}

/// `tensor` split along `dim` into pieces of `sizes`, with gradients flowing back from each:
/// Burn's `Tensor::split_with_sizes`, whose pieces are views where each is one aligned block
/// of `tensor` and otherwise come from one kernel launch where the crate has a kernel for the
/// device. A piece the loss does not reach gets a zero gradient.
///
/// # Shapes
///
/// - tensor: `[d_0, ..., sum(sizes), ..., d_{D-1}]`, the sum at `dim`
/// - pieces: `[d_0, ..., sizes[i], ..., d_{D-1}]`
///
/// # Panics
///
/// If `sizes` does not sum to the size of `dim`.
pub(crate) fn split<const D: usize, K: Basic>(
    tensor: Tensor<D, K>,
    sizes: Vec<usize>,
    dim: usize,
) -> Vec<Tensor<D, K>> {
    #[cfg(any(feature = "kernels", feature = "flex"))]
    if sizes.len() > 1 && tensor.dtype().is_float() && route::has_ops(&tensor.device()) {
        let device = tensor.device();
        let tensor = Tensor::<D>::from_dispatch(tensor.into_dispatch());
        let pieces = route::run(&device, route::Split { tensor, sizes, dim });
        return (pieces.into_iter())
            .map(|piece| Tensor::from_dispatch(piece.into_dispatch()))
            .collect();
    }
    tensor.split_with_sizes(sizes, dim)
}

/// Whether tensors on `device` take the crate's [`ShardOps`]: a CubeCL device, or Flex.
pub(crate) fn has_ops(device: &burn::tensor::Device) -> bool {
    #[cfg(any(feature = "kernels", feature = "flex"))]
    return route::has_ops(device);
    #[cfg(not(any(feature = "kernels", feature = "flex")))]
    {
        let _ = device;
        false
    }
}

/// Whether `device` is a CubeCL device (a GPU, or a CubeCL CPU runtime), where the crate's
/// kernels run.
pub(crate) fn is_cube(device: &burn::tensor::Device) -> bool {
    #[cfg(feature = "kernels")]
    return matches!(
        device.clone().inner().as_dispatch(),
        burn::backend::DispatchDevice::Cube(_)
    );
    #[cfg(not(feature = "kernels"))]
    {
        let _ = device;
        false
    }
}

/// Burn's `split_with_sizes` of a backend: a slice per piece.
#[cfg(any(feature = "kernels", feature = "flex"))]
fn by_slices<B: burn::backend::Backend>(
    tensor: burn::backend::tensor::FloatTensor<B>,
    sizes: &[usize],
    dim: usize,
) -> Vec<burn::backend::tensor::FloatTensor<B>> {
    use burn::backend::TensorMetadata;
    use burn::tensor::Slice;

    let shape = tensor.shape();
    let mut start = 0;
    (sizes.iter())
        .map(|&size| {
            let slices: Vec<Slice> = (0..shape.num_dims())
                .map(|d| match d == dim {
                    true => Slice::from(start..start + size),
                    false => Slice::from(0..shape[d]),
                })
                .collect();
            start += size;
            B::float_slice(tensor.clone(), &slices)
        })
        .collect()
}

/// The routing from a tensor's device to the backend type that holds its primitive.
#[cfg(any(feature = "kernels", feature = "flex"))]
mod route {
    use burn::backend::GradientCheckpointingStrategy;
    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
    use burn::backend::{Autodiff, DispatchDevice, DispatchKindConversion, DispatchTensor};
    use burn::tensor::{Device, Tensor};

    use super::ShardOps;

    /// Whether the device's backend has [`ShardOps`]: a CubeCL device, or Flex.
    pub(super) fn has_ops(device: &Device) -> bool {
        match device.clone().inner().as_dispatch() {
            #[cfg(feature = "kernels")]
            DispatchDevice::Cube(_) => true,
            #[cfg(feature = "flex")]
            DispatchDevice::Flex(_) => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Whether tensors on `a` and on `b` hold primitives of one backend type: one device,
    /// and one checkpointing strategy where autodiff tracks them (Burn keeps it per tensor).
    pub(super) fn same_backend(a: &Device, b: &Device) -> bool {
        a == b && a.gradient_checkpointing_strategy() == b.gradient_checkpointing_strategy()
    }

    /// An operation of [`ShardOps`] on the primitives of one backend.
    pub(super) trait Op {
        type Output;

        fn on<B: ShardOps>(self) -> Self::Output
        where
            DispatchTensor: DispatchKindConversion<B>;
    }

    /// `op` on the backend `device` names: Burn's CubeCL backend (under Fusion when Burn's
    /// `fusion` feature is on) or Flex, inside autodiff with the device's checkpointing
    /// strategy where autodiff tracks its tensors.
    ///
    /// # Panics
    ///
    /// If the device's backend has no [`ShardOps`] ([`has_ops`] says).
    pub(super) fn run<O: Op>(device: &Device, op: O) -> O::Output {
        let strategy = device.gradient_checkpointing_strategy();
        match device.clone().inner().as_dispatch() {
            #[cfg(feature = "kernels")]
            DispatchDevice::Cube(_) => with_strategy::<burn::backend::Cube, O>(strategy, op),
            #[cfg(feature = "flex")]
            DispatchDevice::Flex(_) => with_strategy::<burn::backend::Flex, O>(strategy, op),
            #[allow(unreachable_patterns)]
            other => unreachable!("no ShardOps for {other:?}"),
        }
    }

    fn with_strategy<B: ShardOps, O: Op>(
        strategy: Option<GradientCheckpointingStrategy>,
        op: O,
    ) -> O::Output
    where
        DispatchTensor: DispatchKindConversion<B>
            + DispatchKindConversion<Autodiff<B, NoCheckpointing>>
            + DispatchKindConversion<Autodiff<B, BalancedCheckpointing>>,
    {
        match strategy {
            None => op.on::<B>(),
            Some(GradientCheckpointingStrategy::Disabled) => {
                op.on::<Autodiff<B, NoCheckpointing>>()
            }
            Some(GradientCheckpointingStrategy::Balanced) => {
                op.on::<Autodiff<B, BalancedCheckpointing>>()
            }
        }
    }

    fn primitive<B: ShardOps, const D: usize>(
        tensor: Tensor<D>,
    ) -> burn::backend::tensor::FloatTensor<B>
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        tensor
            .try_into_primitive::<B>()
            .expect("a tensor on the device's backend")
    }

    /// [`ShardOps::concat`] of tensors on one device.
    pub(super) struct Concat<const D: usize> {
        pub(super) tensors: Vec<Tensor<D>>,
        pub(super) dim: usize,
    }

    impl<const D: usize> Op for Concat<D> {
        type Output = Tensor<D>;

        fn on<B: ShardOps>(self) -> Tensor<D>
        where
            DispatchTensor: DispatchKindConversion<B>,
        {
            let primitives = self.tensors.into_iter().map(primitive::<B, D>).collect();
            Tensor::from_primitive::<B>(B::concat(primitives, self.dim))
        }
    }

    /// [`ShardOps::split`] of one tensor.
    pub(super) struct Split<const D: usize> {
        pub(super) tensor: Tensor<D>,
        pub(super) sizes: Vec<usize>,
        pub(super) dim: usize,
    }

    impl<const D: usize> Op for Split<D> {
        type Output = Vec<Tensor<D>>;

        fn on<B: ShardOps>(self) -> Vec<Tensor<D>>
        where
            DispatchTensor: DispatchKindConversion<B>,
        {
            let pieces = B::split(primitive::<B, D>(self.tensor), &self.sizes, self.dim);
            (pieces.into_iter())
                .map(Tensor::from_primitive::<B>)
                .collect()
        }
    }
}
