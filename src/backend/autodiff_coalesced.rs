//! The parameter broadcast of the single backward under `Autodiff`
//! ([`TransferOps::float_move_coalesced`](super::TransferOps::float_move_coalesced)): the
//! parameters travel in one coalesced buffer, and their gradients come back in one, but each
//! copy stays tied to its own parameter, so that a parameter none of whose copies received a
//! gradient gets none (as on one device), not zeros.
//!
//! The graph, for tensors `t_i` moved to another device:
//!
//! ```text
//! t_0 .. t_n  --  join  --  return  --  relay_0 .. relay_n  (the copies, on the device)
//!    \_____________________________________/  (each relay's other parent is its t_i)
//! ```
//!
//! Burn runs a backward's steps from the deepest node up, and a step only where a gradient
//! path reaches it. A relay is one level below the return, so every relay that received a
//! gradient has stored it before the return's step runs; the return moves the stored
//! gradients back as one buffer and registers each for its tensor. The relays register
//! nothing themselves: a leaf `t_i` whose relay got no gradient is left without one. A
//! tracked `t_i` that is not a leaf (Burn's `Requirement::GradInBackward`: the public
//! `is_require_grad` is false for it) is a parent of the join, so its backward step runs
//! whenever the return's does and needs a gradient: the return gives it zeros when its relay
//! got none. The join and the return consume no gradient of their own.

use std::sync::{Arc, Mutex};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{FloatDType, Shape, TensorMetadata};

use super::ConcatBackend;
use super::comm::{self, TransferLog};
use super::join::join_all;

type Tracked<B> = FloatTensor<Autodiff<B>>;

/// What a tensor's gradient needs to find its way back.
struct Input {
    id: NodeId,
    shape: Shape,
    dtype: FloatDType,
    /// Tracked but not a leaf: its own backward step needs a gradient.
    needs_gradient: bool,
}

/// The state the relays and the return share.
struct Broadcast<B: ConcatBackend> {
    inputs: Vec<Option<Input>>,
    /// Each relay's gradient, stored by its step.
    grads: Mutex<Vec<Option<FloatTensor<B>>>>,
    source: B::Device,
    log: Option<Arc<dyn TransferLog>>,
}

impl<B: ConcatBackend> std::fmt::Debug for Broadcast<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Broadcast({:?}, {} tensors)",
            self.source,
            self.inputs.len()
        )
    }
}

/// `tensors` moved to `device` in one coalesced buffer (the inner backend's
/// [`TransferOps::float_move_coalesced`](super::TransferOps::float_move_coalesced)), each copy
/// tied to its tensor as the module docs say.
pub(super) fn move_coalesced<B: ConcatBackend, C: CheckpointStrategy>(
    tensors: Vec<Tracked<B>>,
    device: &B::Device,
) -> Vec<Tracked<B>> {
    let values = tensors.iter().map(|t| t.primitive.clone()).collect();
    let moved = B::float_move_coalesced(values, device);
    let tracked: Vec<Tracked<B>> = tensors.iter().filter(|t| t.is_tracked()).cloned().collect();
    if tracked.is_empty() {
        return moved
            .into_iter()
            .map(<Autodiff<B, C> as AutodiffBackend>::from_inner)
            .collect();
    }
    let source = B::float_device(&tensors[0].primitive);
    let inputs = (tensors.iter())
        .map(|t| {
            t.is_tracked().then(|| Input {
                id: t.node.id,
                shape: t.primitive.shape(),
                dtype: FloatDType::from(t.primitive.dtype()),
                needs_gradient: !<Autodiff<B, C> as FloatTensorOps<_>>::float_is_require_grad(t),
            })
        })
        .collect::<Vec<_>>();
    let state = Arc::new(Broadcast {
        grads: Mutex::new(vec![None; inputs.len()]),
        inputs,
        source,
        log: comm::current_log().and_then(|log| log.for_backward()),
    });
    let join = join_all::<B, C>(tracked);
    let value = join.primitive.clone();
    let ret = match ReturnBackward
        .prepare::<C>([join.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state.clone(), value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    };
    (tensors.into_iter().zip(moved).enumerate())
        .map(|(index, (tensor, piece))| {
            if !tensor.is_tracked() {
                return <Autodiff<B, C> as AutodiffBackend>::from_inner(piece);
            }
            match RelayBackward
                .prepare::<C>([tensor.node, ret.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish((state.clone(), index), piece),
                OpsKind::UnTracked(prep) => prep.finish(piece),
            }
        })
        .collect()
}

/// A copy's backward: stores its gradient for the return.
#[derive(Debug)]
struct RelayBackward;

impl<B: ConcatBackend> Backward<B, 2> for RelayBackward {
    type State = (Arc<Broadcast<B>>, usize);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (state, index) = ops.state;
        let mut stored = state.grads.lock().unwrap_or_else(|e| e.into_inner());
        super::add_to::<B>(&mut stored[index], grad);
    }
}

/// The broadcast's return: every relay that received a gradient has stored it (they are one
/// level deeper); their gradients go back to the tensors' device in one buffer.
#[derive(Debug)]
struct ReturnBackward;

impl<B: ConcatBackend> Backward<B, 1> for ReturnBackward {
    type State = Arc<Broadcast<B>>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let state = ops.state;
        let pieces = std::mem::take(&mut *state.grads.lock().unwrap_or_else(|e| e.into_inner()));
        let back = comm::return_present::<B>(pieces, &state.source, state.log.as_deref());
        for (input, grad) in state.inputs.iter().zip(back) {
            let Some(input) = input else { continue };
            match grad {
                Some(grad) => grads.register::<B>(input.id, grad),
                None if input.needs_gradient => {
                    let zeros = B::float_zeros(input.shape.clone(), &state.source, input.dtype);
                    grads.register::<B>(input.id, zeros);
                }
                None => {}
            }
        }
    }
}
