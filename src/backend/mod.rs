//! Concatenation, splitting and device moves as a Burn backend extension, and the transfers
//! and reductions built on them: the layer every byte the pipeline moves goes through.
//!
//! The extension is three small traits, one per concern, as Burn keeps one extension trait
//! per concern (`DistributedBackend`):
//!
//! - [`ConcatOps`] (`concat_ops.rs`): `concat` (any number of inputs along any dimension, in
//!   one kernel launch) and `split` (one tensor into pieces, zero-copy views where the layout
//!   allows, otherwise one kernel launch);
//! - [`TransferOps`] (`transfer_ops.rs`): moves between devices, fenced where CubeCL 0.10
//!   needs it, through host memory where a backend has no device-to-device copies;
//! - [`ReplicaOps`] (`replica_ops.rs`): what a backend allows of replicas (concurrent
//!   backward passes, half precision under Fusion) and the per-replica graphs of the
//!   parallel backward.
//!
//! [`ConcatBackend`] is all three, and [`DataParallelBackend`] the bound for training. Each
//! backend has its file:
//!
//! - `cubecl.rs`: CubeCL backends run this crate's kernels (`src/kernels/`);
//! - `fusion.rs`: `Fusion` records them as custom operations;
//! - `autodiff.rs`: `Autodiff` gives them custom backward steps (the backward of a
//!   concatenation is a split and the other way round; the backward of a coalesced transfer
//!   brings every piece's gradient back in one transfer); `autodiff_coalesced.rs`, the
//!   coalesced move of the parameters under the single backward, whose backward gives each parameter only
//!   the gradient its copies received;
//! - `cpu.rs`: Flex and NdArray use Burn's own operations;
//! - `join.rs`: one graph node with many parents (the single backward's one graph, the
//!   parallel backward's hub).
//!
//! `comm/` holds every transfer and gradient sum of the pipeline (broadcast of parameters,
//! reduce-add of gradients, move-and-split), used by the forward and by both backwards.
//!
//! [`concat()`], [`split()`], [`coalesce()`], [`uncoalesce()`], [`move_split()`] and
//! [`move_to()`] are the tensor-level entry points.
//!
//! # Adding a backend
//!
//! Every method of the three traits has a default built on Burn's own operations, so another
//! backend needs three empty implementations:
//!
//! ```ignore
//! use burn_dataparallel::backend::{ConcatOps, ReplicaOps, TransferOps};
//!
//! impl ConcatOps for MyBackend {}
//! impl TransferOps for MyBackend {}
//! impl ReplicaOps for MyBackend {}
//! ```
//!
//! It then has `ConcatBackend`, and `Autodiff<MyBackend>` has `DataParallelBackend`. Override
//! [`ConcatOps`]' methods to run kernels of its own; [`TransferOps::host_staged_transfers`]
//! where Burn's `to_device` between two of its devices is not implemented but reading and
//! writing host memory is; [`TransferOps::device_transfers`] (false) where not even that
//! works, so that several devices are refused with a typed error; and
//! [`ReplicaOps::concurrent_backward`] (false) where replicas' backward passes must not
//! run at once.

mod autodiff;
mod autodiff_coalesced;
pub(crate) mod comm;
mod concat_ops;
#[cfg(any(feature = "flex", feature = "ndarray"))]
mod cpu;
#[cfg(feature = "cubecl")]
mod cubecl;
#[cfg(feature = "fusion")]
mod fusion;
mod join;
mod replica_ops;
mod tensor;
mod transfer_ops;

use burn::tensor::Slice;
use burn::tensor::backend::AutodiffBackend;

pub use concat_ops::ConcatOps;
pub(crate) use join::join_all;
pub use replica_ops::ReplicaOps;
#[doc(hidden)]
pub use replica_ops::{Part, ReplicaGraphs, ReplicaRuntime, ReplicaSetup};
pub(crate) use tensor::is_tracked;
pub use tensor::{ConcatKind, coalesce, concat, move_split, move_to, split, uncoalesce};
pub use transfer_ops::TransferOps;
pub(crate) use transfer_ops::host_staged;

/// A backend with this crate's three extension traits: [`ConcatOps`] (concatenation and
/// splitting), [`TransferOps`] (moves between devices) and [`ReplicaOps`] (what it allows of
/// replicas). Implemented for every backend that has the three; the bound generic code over
/// any backend names, where [`DataParallelBackend`] is the one for training.
pub trait ConcatBackend: ConcatOps + TransferOps + ReplicaOps {}

impl<B: ConcatOps + TransferOps + ReplicaOps> ConcatBackend for B {}

/// An autodiff backend that [`DataParallel`](crate::DataParallel) trains on: it and its inner
/// backend (used by `valid()` models) both have the kernels. One bound for generic training
/// code: `fn train<B: DataParallelBackend>(...)`.
pub trait DataParallelBackend:
    AutodiffBackend<InnerBackend: ConcatBackend> + ConcatBackend
{
}

impl<B> DataParallelBackend for B
where
    B: AutodiffBackend + ConcatBackend,
    B::InnerBackend: ConcatBackend,
{
}

/// Largest number of inputs one tracked concatenation (or graph join) takes; more are taken in
/// groups.
pub(crate) const MAX_TRACKED_INPUTS: usize = 16;

/// The slices that cut `shape` along `dim` into pieces of `sizes`.
///
/// # Panics
///
/// If the sizes do not sum to `shape[dim]`.
pub(crate) fn slices<'a>(
    shape: &'a [usize],
    sizes: &'a [usize],
    dim: usize,
) -> impl Iterator<Item = Vec<Slice>> + 'a {
    assert_eq!(
        sizes.iter().sum::<usize>(),
        shape[dim],
        "split sizes {sizes:?} do not sum to dim {dim} of shape {shape:?}"
    );
    sizes.iter().scan(0, move |start, &size| {
        let begin = *start;
        *start += size;
        Some(
            shape
                .iter()
                .enumerate()
                .map(|(d, &len)| match d == dim {
                    true => Slice::new(begin as isize, Some((begin + size) as isize), 1),
                    false => Slice::new(0, Some(len as isize), 1),
                })
                .collect(),
        )
    })
}

/// `grad` added to what `slot` holds.
pub(crate) fn add_to<B: ConcatBackend>(
    slot: &mut Option<burn::tensor::ops::FloatTensor<B>>,
    grad: burn::tensor::ops::FloatTensor<B>,
) {
    *slot = Some(match slot.take() {
        Some(sum) => B::float_add(sum, grad),
        None => grad,
    });
}
