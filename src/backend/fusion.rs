//! The extension traits for `Fusion`: concatenations and splits are recorded as custom
//! operations and run the inner backend's kernels when the stream executes them.

use burn::tensor::Element;
use burn::tensor::ops::{FloatElem, FloatTensor, IntTensor};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{ConcatBackend, ConcatOps, ReplicaOps, TransferOps};

/// Float or int tensors: which handle accessors a custom operation uses.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Float,
    Int,
}

/// A concatenation or a split recorded in the fusion stream.
#[derive(Clone, Debug)]
struct Recorded<B> {
    desc: CustomOpIr,
    kind: Kind,
    dim: usize,
    /// Piece sizes of a split; empty for a concatenation.
    sizes: Vec<usize>,
    _backend: core::marker::PhantomData<B>,
}

impl<B: FusionBackend + ConcatBackend> Operation<B::FusionRuntime> for Recorded<B> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let (inputs, outputs) = (&self.desc.inputs, &self.desc.outputs);
        match (self.kind, self.sizes.is_empty()) {
            (Kind::Float, true) => {
                let tensors = inputs
                    .iter()
                    .map(|t| handles.get_float_tensor::<B>(t))
                    .collect();
                let output = B::float_concat(tensors, self.dim);
                handles.register_float_tensor::<B>(&outputs[0].id, output);
            }
            (Kind::Int, true) => {
                let tensors = inputs
                    .iter()
                    .map(|t| handles.get_int_tensor::<B>(t))
                    .collect();
                let output = B::int_concat(tensors, self.dim);
                handles.register_int_tensor::<B>(&outputs[0].id, output);
            }
            (Kind::Float, false) => {
                let tensor = handles.get_float_tensor::<B>(&inputs[0]);
                for (out, piece) in
                    outputs
                        .iter()
                        .zip(B::float_split(tensor, &self.sizes, self.dim))
                {
                    handles.register_float_tensor::<B>(&out.id, piece);
                }
            }
            (Kind::Int, false) => {
                let tensor = handles.get_int_tensor::<B>(&inputs[0]);
                for (out, piece) in outputs
                    .iter()
                    .zip(B::int_split(tensor, &self.sizes, self.dim))
                {
                    handles.register_int_tensor::<B>(&out.id, piece);
                }
            }
        }
    }
}

fn record_concat<B: FusionBackend + ConcatBackend>(
    tensors: Vec<FusionTensor<B::FusionRuntime>>,
    dim: usize,
    kind: Kind,
) -> FusionTensor<B::FusionRuntime> {
    let first = tensors.first().expect("concat needs at least one tensor");
    let client = first.client.clone();
    let dtype = first.dtype;
    let mut shape = first.shape.clone();
    shape[dim] = tensors.iter().map(|t| t.shape[dim]).sum();
    let streams = OperationStreams::with_inputs(&tensors);
    let output = TensorIr::uninit(client.create_empty_handle(), shape, dtype);
    let inputs: Vec<TensorIr> = tensors.into_iter().map(FusionTensor::into_ir).collect();
    let desc = CustomOpIr::new("dataparallel_concat", &inputs, &[output]);
    let operation = Recorded::<B> {
        desc: desc.clone(),
        kind,
        dim,
        sizes: Vec::new(),
        _backend: core::marker::PhantomData,
    };
    client
        .register(streams, OperationIr::Custom(desc), operation)
        .pop()
        .expect("one output")
}

fn record_split<B: FusionBackend + ConcatBackend>(
    tensor: FusionTensor<B::FusionRuntime>,
    sizes: &[usize],
    dim: usize,
    kind: Kind,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let client = tensor.client.clone();
    let outputs: Vec<TensorIr> = sizes
        .iter()
        .map(|&size| {
            let mut shape = tensor.shape.clone();
            shape[dim] = size;
            TensorIr::uninit(client.create_empty_handle(), shape, tensor.dtype)
        })
        .collect();
    let streams = OperationStreams::with_inputs([&tensor]);
    let desc = CustomOpIr::new("dataparallel_split", &[tensor.into_ir()], &outputs);
    let operation = Recorded::<B> {
        desc: desc.clone(),
        kind,
        dim,
        sizes: sizes.to_vec(),
        _backend: core::marker::PhantomData,
    };
    client.register(streams, OperationIr::Custom(desc), operation)
}

impl<B: FusionBackend + ConcatBackend> ConcatOps for Fusion<B> {
    fn float_concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        record_concat::<B>(tensors, dim, Kind::Float)
    }

    fn int_concat(tensors: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self> {
        record_concat::<B>(tensors, dim, Kind::Int)
    }

    fn float_split(
        tensor: FloatTensor<Self>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<FloatTensor<Self>> {
        record_split::<B>(tensor, sizes, dim, Kind::Float)
    }

    fn int_split(tensor: IntTensor<Self>, sizes: &[usize], dim: usize) -> Vec<IntTensor<Self>> {
        record_split::<B>(tensor, sizes, dim, Kind::Int)
    }
}

impl<B: FusionBackend + ConcatBackend> ReplicaOps for Fusion<B> {
    fn concurrent_backward() -> bool {
        false
    }

    fn fusion_half_precision() -> bool {
        FloatElem::<Self>::dtype() == burn::tensor::DType::F16
    }
}

impl<B: FusionBackend + ConcatBackend> TransferOps for Fusion<B> {
    fn device_transfers() -> bool {
        B::device_transfers()
    }

    fn host_staged_transfers() -> bool {
        B::host_staged_transfers()
    }

    // `Fusion`'s `to_device` runs the inner backend's transfer at once, on the calling thread.
    fn fence_transfers(source: &Self::Device) {
        B::fence_transfers(source)
    }

    fn orders_receives() -> bool {
        B::orders_receives()
    }

    fn fence_receive(destination: &Self::Device) {
        B::fence_receive(destination)
    }
}
