//! The extension traits for CubeCL backends: this crate's kernels, and fences around device
//! moves on runtimes with device-to-device communication (CUDA).

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_cubecl::cubecl::server::ServerCommunication;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::{ConcatOps, ReplicaOps, TransferOps};
use crate::kernels;

impl<R, F, I, BT> ConcatOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn float_concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        kernels::concat(tensors, dim)
    }

    fn int_concat(tensors: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self> {
        kernels::concat(tensors, dim)
    }

    fn float_split(
        tensor: FloatTensor<Self>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<FloatTensor<Self>> {
        kernels::split(tensor, sizes, dim)
    }

    fn int_split(tensor: IntTensor<Self>, sizes: &[usize], dim: usize) -> Vec<IntTensor<Self>> {
        kernels::split(tensor, sizes, dim)
    }
}

impl<R, F, I, BT> TransferOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn host_staged_transfers() -> bool {
        !<R::Server as ServerCommunication>::SERVER_COMM_ENABLED
    }

    fn fence_transfers(source: &Self::Device) {
        if <R::Server as ServerCommunication>::SERVER_COMM_ENABLED {
            R::client(source).sync_collective();
        }
    }

    // CUDA: Burn's `to_device` is not ordered after queued work; elsewhere it is not
    // implemented between devices at all (the crate's own moves go through host memory).
    fn orders_receives() -> bool {
        false
    }

    fn fence_receive(destination: &Self::Device) {
        use burn::tensor::backend::Device;
        use burn_cubecl::cubecl::ir::{ElemType, FloatKind};
        use burn_cubecl::cubecl::server::ReduceOperation;
        if <R::Server as ServerCommunication>::SERVER_COMM_ENABLED {
            let mut client = R::client(destination);
            let handle = client.empty(4);
            client.all_reduce(
                handle.clone(),
                handle,
                ElemType::Float(FloatKind::F32),
                vec![destination.to_id()],
                ReduceOperation::Sum,
            );
        }
    }
}

impl<R, F, I, BT> ReplicaOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
}
