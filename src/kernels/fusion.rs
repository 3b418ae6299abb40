//! [`ShardOps`] under Burn's Fusion: Fusion's own `cat` for a few inputs, the crate's kernel
//! as a Fusion custom operation for many large ones; Fusion's slices.
//!
//! Burn 0.22's CubeCL Fusion fuses `cat` with the element-wise operations around it (the loss
//! after a gather): one generated kernel, where a custom operation, which Fusion cannot see
//! into, ends the fused block before it and starts one after it. But each element of the fused
//! `cat` picks its input among all of them, so it slows with every input it joins, and the
//! crate's kernel wins once the inputs are many and large (a gather of 8 replicas, a coalesced
//! move of a model's parameters). [`ShardOps::concat`] chooses by [`takes_kernel`]; the
//! figures behind its thresholds are in `benches/RESULTS.md`. Slices are views or fused
//! reads. The autodiff backward around both is the crate's.

use std::marker::PhantomData;

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn_fusion::custom::{
    CustomOpIr, HandleContainer, Operation, OperationIr, OperationOutput, ScalarIr, StreamId,
    TensorIr,
};
use burn_fusion::{ExecutionError, Fusion, FusionBackend};

use super::{FusionConcat, ShardOps};

/// From this many inputs, and [`KERNEL_FROM_BYTES`] of output, the crate's kernel joins them.
const KERNEL_FROM_INPUTS: usize = 8;
/// From this many bytes of output, and [`KERNEL_FROM_INPUTS`] inputs, the crate's kernel
/// joins them: below it a call costs its launches, and a custom operation costs more of them.
const KERNEL_FROM_BYTES: usize = 1 << 20;
/// From this many inputs the crate's kernel joins them at any size: Fusion's `cat` costs more
/// than the custom operation's launches.
const KERNEL_FROM_INPUTS_AT_ANY_SIZE: usize = 32;

/// Whether `inputs` tensors making `bytes` of output are joined by the crate's kernel (as a
/// custom operation) rather than Fusion's `cat`. With 2 to 4 inputs Fusion's `cat` is kept at
/// every size: the kernel is a little faster alone at large sizes, but Fusion's `cat` fuses
/// with the operations after it, which saves them a read of the output.
fn takes_kernel(inputs: usize, bytes: usize) -> bool {
    match super::fusion_concat() {
        FusionConcat::Rule => {
            inputs >= KERNEL_FROM_INPUTS_AT_ANY_SIZE
                || (inputs >= KERNEL_FROM_INPUTS && bytes >= KERNEL_FROM_BYTES)
        }
        FusionConcat::Kernel => true,
        FusionConcat::Cat => false,
    }
}

impl<B: FusionBackend + ShardOps> ShardOps for Fusion<B> {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        let first = tensors.first().expect("concat needs at least one tensor");
        let mut shape = first.shape.clone();
        shape[dim] = tensors.iter().map(|t| t.shape[dim]).sum();
        if !takes_kernel(tensors.len(), shape.num_elements() * first.dtype.size()) {
            return <Self as FloatTensorOps<Self>>::float_cat(tensors, dim);
        }
        let client = first.client.clone();
        let dtype = first.dtype;
        let inputs: Vec<TensorIr> = tensors.into_iter().map(|t| t.into_ir()).collect();
        let output = TensorIr::uninit(client.create_empty_handle(), shape, dtype);
        let description = CustomOpIr {
            id: "burn_dataparallel::concat".into(),
            inputs: inputs.clone(),
            outputs: vec![output.clone()],
            scalars: vec![ScalarIr::UInt(dim as u64)],
        };
        let operation = Concat::<B> {
            inputs,
            output,
            dim,
            backend: PhantomData,
        };
        client
            .register(
                StreamId::current(),
                OperationIr::Custom(description),
                operation,
            )
            .output()
    }

    fn split(tensor: FloatTensor<Self>, sizes: &[usize], dim: usize) -> Vec<FloatTensor<Self>> {
        super::by_slices::<Self>(tensor, sizes, dim)
    }
}

/// The crate's concatenation on the inner backend, run when Fusion's queue reaches it.
struct Concat<B> {
    inputs: Vec<TensorIr>,
    output: TensorIr,
    dim: usize,
    backend: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for Concat<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Concat")
            .field("inputs", &self.inputs.len())
            .field("dim", &self.dim)
            .finish()
    }
}

impl<B: FusionBackend + ShardOps> Operation<B::FusionRuntime> for Concat<B> {
    fn execute(&self, handles: &mut HandleContainer<B::Handle>) -> Result<(), ExecutionError> {
        let tensors = (self.inputs.iter())
            .map(|input| handles.get_float_tensor::<B>(input))
            .collect();
        handles.register_float_tensor::<B>(&self.output.id, B::concat(tensors, self.dim));
        Ok(())
    }
}
