//! [`ConcatOps`] under Burn's Fusion: the concatenation joins the device's operation queue as
//! a custom operation, and the inner backend's kernel runs when the queue does.

use burn::backend::tensor::FloatTensor;
use burn_fusion::custom::{
    CustomOpIr, HandleContainer, OperationFn, OperationIr, OperationOutput, ScalarIr, StreamId,
    TensorIr,
};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};

use super::ConcatOps;

impl<B: FusionBackend + ConcatOps> ConcatOps for Fusion<B> {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        let first = tensors.first().expect("concat needs at least one tensor");
        let client = first.client.clone();
        let dtype = first.dtype;
        let mut shape = first.shape.clone();
        shape[dim] = tensors.iter().map(|t| t.shape[dim]).sum();

        let inputs: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let output = TensorIr::uninit(client.create_empty_handle(), shape, dtype);
        let description = CustomOpIr {
            id: "burn_dataparallel::concat".into(),
            inputs: inputs.clone(),
            outputs: vec![output.clone()],
            scalars: vec![ScalarIr::UInt(dim as u64)],
        };
        let operation = OperationFn(
            move |handles: &mut HandleContainer<
                <B::FusionRuntime as FusionRuntime>::FusionHandle,
            >| {
                let tensors = inputs
                    .iter()
                    .map(|input| handles.get_float_tensor::<B>(input))
                    .collect();
                handles.register_float_tensor::<B>(&output.id, B::concat(tensors, dim));
                Ok(())
            },
        );
        client
            .register(
                StreamId::current(),
                OperationIr::Custom(description),
                operation,
            )
            .output()
    }
}
