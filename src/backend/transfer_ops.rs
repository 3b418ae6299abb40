//! [`TransferOps`]: moving tensors between devices, with the fences CubeCL 0.10 needs and the
//! host-staged path for backends without device-to-device copies.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::ConcatOps;

/// Moves between devices: whether a backend has them, how they are ordered against the
/// kernels around them, and the moves themselves.
///
/// Every method has a default (Burn's `to_device`, no fences), so a backend implements the
/// trait with an empty `impl` unless its transfers need ordering (CubeCL's CUDA runtime) or
/// go through host memory (CubeCL runtimes without device-to-device communication).
pub trait TransferOps: ConcatOps {
    /// Whether tensors can move between two distinct devices of this backend, directly or
    /// through host memory ([`host_staged_transfers`](Self::host_staged_transfers)). True by
    /// default.
    fn device_transfers() -> bool {
        true
    }

    /// Whether this crate moves tensors between distinct devices by reading them on one and
    /// writing them on the other, because Burn 0.21's `to_device` between them is not
    /// implemented: CubeCL runtimes without device-to-device communication (wgpu's Vulkan,
    /// Metal and DX12 devices, HIP, CubeCL's CPU). False by default (Burn's `to_device`).
    ///
    /// Burn's own `to_device` inside a replica's forward (batch norm moving its running
    /// statistics) still fails there, so such backends report
    /// [`orders_receives`](Self::orders_receives) false and need running states per device.
    fn host_staged_transfers() -> bool {
        false
    }

    /// Orders later work on `source` after the transfers already queued from it, so that their
    /// source buffers are not overwritten before they have been read.
    ///
    /// CubeCL 0.10 sends between CUDA devices on a separate communication stream and frees the
    /// source buffer as soon as the send is queued; the next kernel on the source device can
    /// reuse that memory before the send has read it, and the receiver gets corrupted values.
    /// On CubeCL runtimes with device-to-device transfers this makes the source's compute
    /// stream wait for its communication stream; elsewhere it does nothing.
    fn fence_transfers(source: &Self::Device) {
        let _ = source;
    }

    /// Orders a transfer into `destination` after the work the calling thread has queued
    /// there, so that the transfer cannot overwrite memory that work still reads.
    ///
    /// CubeCL 0.10 receives on the destination's communication stream into memory reserved
    /// from the compute stream's pool without waiting for that stream: memory freed by a
    /// kernel still queued can be overwritten before the kernel reads it (seen as
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` when that memory held indices). On CubeCL runtimes with
    /// device-to-device transfers this makes the destination's communication stream wait for
    /// the calling thread's compute stream (a one-device all-reduce of four bytes, the one
    /// operation that orders them that way); elsewhere it does nothing.
    fn fence_receive(destination: &Self::Device) {
        let _ = destination;
    }

    /// Whether a transfer into a device that this crate does not fence (Burn's own
    /// `to_device` inside a replica's forward, such as batch norm moving its running
    /// statistics) is ordered after the work queued on that device. True by default; false on
    /// CubeCL runtimes with device-to-device transfers (CUDA), where such a transfer can
    /// overwrite memory that queued kernels still read ([`fence_receive`](Self::fence_receive)).
    fn orders_receives() -> bool {
        true
    }

    /// Moves a float tensor to `device` (Burn's `to_device`) between a fence on the
    /// destination ([`fence_receive`](Self::fence_receive)) and one on the source
    /// ([`fence_transfers`](Self::fence_transfers)). Under `Autodiff`, the backward moves the
    /// gradient back the same way.
    ///
    /// With [`host_staged_transfers`](Self::host_staged_transfers), the tensor is read on its
    /// device and written on `device` instead (waiting for the read).
    fn float_move(tensor: FloatTensor<Self>, device: &Self::Device) -> FloatTensor<Self> {
        let source = Self::float_device(&tensor);
        if &source == device {
            return tensor;
        }
        super::comm::note_moved(super::comm::bytes_of(&tensor));
        if Self::host_staged_transfers() {
            // As a flat tensor of rank 1 (the Tensor API wants the rank), then reshaped back.
            let shape = burn::tensor::TensorMetadata::shape(&tensor);
            let flat = Self::float_reshape(tensor, [shape.num_elements()].into());
            let flat = burn::tensor::Tensor::<Self, 1>::from_primitive(
                burn::tensor::TensorPrimitive::Float(flat),
            );
            let moved = host_staged_in_pieces(flat, device)
                .into_primitive()
                .tensor();
            return Self::float_reshape(moved, shape);
        }
        Self::fence_receive(device);
        let moved = Self::float_to_device(tensor, device);
        Self::fence_transfers(&source);
        moved
    }

    /// Moves `tensors` (any shapes, all on one device and of one dtype) to `device` as one
    /// coalesced buffer, and gives each back there in its own shape: the parameter broadcast
    /// of the single backward, which keeps the caller's graph.
    ///
    /// Under `Autodiff`, the backward brings back, in one transfer, the gradients of the
    /// pieces that received one, and each goes to its tensor: as with the tensors used where
    /// they are, a leaf whose piece received no gradient gets none from this move (not
    /// zeros); a tracked tensor that is not a leaf gets zeros then, since its own backward
    /// step needs a gradient.
    ///
    /// # Panics
    ///
    /// If `tensors` is empty.
    fn float_move_coalesced(
        tensors: Vec<FloatTensor<Self>>,
        device: &Self::Device,
    ) -> Vec<FloatTensor<Self>> {
        let shapes: Vec<burn::tensor::Shape> = (tensors.iter())
            .map(burn::tensor::TensorMetadata::shape)
            .collect();
        let counts: Vec<usize> = shapes
            .iter()
            .map(burn::tensor::Shape::num_elements)
            .collect();
        let flats = (tensors.into_iter().zip(&counts))
            .map(|(tensor, &count)| Self::float_reshape(tensor, [count].into()))
            .collect();
        let buffer = Self::float_concat(flats, 0);
        (Self::float_move_split(buffer, &counts, device).into_iter())
            .zip(shapes)
            .map(|(piece, shape)| Self::float_reshape(piece, shape))
            .collect()
    }

    /// Moves a flat float buffer to `device` in one transfer and cuts it there into flat pieces
    /// of `counts` elements: the receiving half of a coalesced transfer.
    ///
    /// Under `Autodiff`, the backward collects the pieces' gradients into one buffer (zeros for
    /// pieces without a gradient) and moves it back in one transfer.
    ///
    /// # Panics
    ///
    /// If `buffer` is not of rank 1 or the counts do not sum to its length.
    fn float_move_split(
        buffer: FloatTensor<Self>,
        counts: &[usize],
        device: &Self::Device,
    ) -> Vec<FloatTensor<Self>> {
        Self::float_split(Self::float_move(buffer, device), counts, 0)
    }
}

/// `tensor`, any rank, read on its device and written on `device`: the transfer of backends
/// with [`TransferOps::host_staged_transfers`]. Waits for the read.
pub(crate) fn host_staged<B: Backend, const D: usize, K: burn::tensor::BasicOps<B>>(
    tensor: burn::tensor::Tensor<B, D, K>,
    device: &B::Device,
) -> burn::tensor::Tensor<B, D, K> {
    burn::tensor::Tensor::from_data(tensor.into_data(), device)
}

/// The largest piece [`host_staged_in_pieces`] writes at once. wgpu stages every write in a
/// buffer of its own, and one larger than its host memory blocks (4 to 32 MiB with the
/// memory hints CubeCL's wgpu devices use) is a memory allocation of its own, made and freed
/// per write; pieces of 1 MiB were the fastest measured (`benches/RESULTS.md`, "where a
/// host-staged move's time goes").
pub(crate) const HOST_STAGED_PIECE_BYTES: usize = 1 << 20;

/// A flat float tensor moved as [`host_staged`] does, but written in pieces of at most
/// [`HOST_STAGED_PIECE_BYTES`]: read whole, cut on the host, each piece written on `device`
/// and the pieces joined there. Waits for the read.
pub(crate) fn host_staged_in_pieces<B: Backend>(
    flat: burn::tensor::Tensor<B, 1>,
    device: &B::Device,
) -> burn::tensor::Tensor<B, 1> {
    let dtype = flat.dtype();
    let size = dtype.size();
    if flat.dims()[0] * size <= HOST_STAGED_PIECE_BYTES {
        return host_staged(flat, device);
    }
    let data = flat.into_data();
    let per_piece = (HOST_STAGED_PIECE_BYTES / size).max(1) * size;
    let pieces = (data.as_bytes().chunks(per_piece))
        .map(|piece| {
            let data = burn::tensor::TensorData::from_bytes_vec(
                piece.to_vec(),
                [piece.len() / size],
                dtype,
            );
            burn::tensor::Tensor::from_data(data, device)
        })
        .collect();
    burn::tensor::Tensor::cat(pieces, 0)
}
