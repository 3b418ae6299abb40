//! The crate's kernels, as a Burn backend extension: [`concat`] joins any number of tensors
//! in one launch where Burn's `CubeBackend` launches a copy per input (the gather's hot path).
//!
//! [`ConcatOps`] is the extension trait, implemented for each backend the routing reaches:
//!
//! - `concat.rs`: the CubeCL kernel and its launch, for `CubeBackend` (every CubeCL runtime:
//!   CUDA, wgpu, ...);
//! - `fusion.rs`: under Burn's Fusion, Fusion's own `cat`, which Fusion fuses with the
//!   operations around it (a custom operation would end the fused block: it measured slower);
//! - `autodiff.rs`: the backward, which slices the output's gradient back into the inputs'.
//!
//! [`concat`] takes each tensor's primitive with Burn's `Tensor::try_into_primitive` for the
//! backend its device names and wraps the result with `Tensor::from_primitive`. (Burn
//! 0.22.1's `#[backend_extension]` would generate that routing, but its extension traits
//! take no `Vec` of tensors.) The kernels are built with the `cuda` or `wgpu` feature (the
//! `kernels` feature); other backends (Flex, NdArray, remote servers), tensors that are not
//! float, and tensors on several devices use Burn's `Tensor::cat`.

#[cfg(feature = "kernels")]
mod autodiff;
#[cfg(feature = "kernels")]
mod concat;
#[cfg(feature = "kernels")]
mod fusion;

#[cfg(feature = "kernels")]
use burn::tensor::Device;
use burn::tensor::Tensor;
use burn::tensor::kind::Basic;

/// The crate's operations on a backend's tensors.
#[cfg(feature = "kernels")]
pub(crate) trait ConcatOps: burn::backend::Backend {
    /// `tensors` joined along `dim`, as Burn's `float_cat`.
    fn concat(
        tensors: Vec<burn::backend::tensor::FloatTensor<Self>>,
        dim: usize,
    ) -> burn::backend::tensor::FloatTensor<Self>;
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
    #[cfg(feature = "kernels")]
    if let Some(first) = tensors.first()
        && tensors.len() > 1
        && first.dtype().is_float()
    {
        let device = first.device();
        if has_kernels(&device)
            && tensors[1..]
                .iter()
                .all(|t| same_backend(&t.device(), &device))
        {
            let floats = tensors
                .into_iter()
                .map(|t| Tensor::<D>::from_dispatch(t.into_dispatch()))
                .collect();
            let strategy = device.gradient_checkpointing_strategy();
            return Tensor::from_dispatch(cube::concat(floats, strategy, dim).into_dispatch());
        }
    }
    Tensor::cat(tensors, dim)
}

/// Whether the crate's kernels run on `device`: a CubeCL device.
#[cfg(feature = "kernels")]
fn has_kernels(device: &Device) -> bool {
    use burn::backend::DispatchDevice;
    matches!(
        device.clone().inner().as_dispatch(),
        DispatchDevice::Cube(_)
    )
}

/// Whether tensors on `a` and on `b` hold primitives of one backend type: one device, and
/// one checkpointing strategy where autodiff tracks them (Burn keeps it per tensor).
#[cfg(feature = "kernels")]
fn same_backend(a: &Device, b: &Device) -> bool {
    a == b && a.gradient_checkpointing_strategy() == b.gradient_checkpointing_strategy()
}

/// The routing from a tensor's device to the backend type that holds its primitive.
#[cfg(feature = "kernels")]
mod cube {
    use burn::backend::GradientCheckpointingStrategy;
    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
    use burn::backend::{Autodiff, Cube, DispatchKindConversion, DispatchTensor};
    use burn::tensor::Tensor;

    use super::ConcatOps;

    /// `tensors`, all on one CubeCL device, concatenated by [`ConcatOps`] of the backend the
    /// device names: Burn's CubeCL backend (under Fusion when Burn's `fusion` feature is on),
    /// inside autodiff with the tensors' checkpointing `strategy` where autodiff tracks them.
    pub(super) fn concat<const D: usize>(
        tensors: Vec<Tensor<D>>,
        strategy: Option<GradientCheckpointingStrategy>,
        dim: usize,
    ) -> Tensor<D> {
        match strategy {
            None => on::<Cube, D>(tensors, dim),
            Some(GradientCheckpointingStrategy::Disabled) => {
                on::<Autodiff<Cube, NoCheckpointing>, D>(tensors, dim)
            }
            Some(GradientCheckpointingStrategy::Balanced) => {
                on::<Autodiff<Cube, BalancedCheckpointing>, D>(tensors, dim)
            }
        }
    }

    fn on<B: ConcatOps, const D: usize>(tensors: Vec<Tensor<D>>, dim: usize) -> Tensor<D>
    where
        DispatchTensor: DispatchKindConversion<B>,
    {
        let primitives = tensors
            .into_iter()
            .map(|t| {
                t.try_into_primitive::<B>()
                    .expect("a tensor on the device's backend")
            })
            .collect();
        Tensor::from_primitive::<B>(B::concat(primitives, dim))
    }
}
