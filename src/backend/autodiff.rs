//! The extension traits for `Autodiff`: the backward of a concatenation splits the gradient, and
//! the backward of each split piece concatenates its gradient with zeros for the others. The
//! backward of a coalesced transfer ([`TransferOps::float_move_split`]) collects all the
//! pieces' gradients into one buffer and moves it back in one transfer.

use std::sync::{Arc, Mutex};

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{FloatDType, TensorMetadata};

use super::comm::{self, TransferLog};
use super::{ConcatBackend, ConcatOps, MAX_TRACKED_INPUTS, TransferOps};

#[derive(Debug)]
struct ConcatBackward;

impl<B: ConcatBackend, const N: usize> Backward<B, N> for ConcatBackward {
    /// Each input's size along `dim`, and `dim`.
    type State = (Vec<usize>, usize);

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (sizes, dim) = ops.state;
        let pieces = B::float_split(grad, &sizes, dim);
        for (node, piece) in ops.parents.into_iter().zip(pieces) {
            if let Some(node) = node {
                grads.register::<B>(node.id, piece);
            }
        }
    }
}

#[derive(Debug)]
struct SplitBackward;

impl<B: ConcatBackend> Backward<B, 1> for SplitBackward {
    /// The input's shape, the piece's start and size along `dim`, and `dim`.
    type State = (Vec<usize>, usize, usize, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        let Some(parent) = parent else { return };
        let (shape, start, size, dim) = ops.state;
        let device = B::float_device(&grad);
        let dtype = FloatDType::from(grad.dtype());
        let zeros = |length: usize| {
            let mut zeros_shape = shape.clone();
            zeros_shape[dim] = length;
            B::float_zeros(zeros_shape.into(), &device, dtype)
        };
        let after = shape[dim] - start - size;
        let mut parts = Vec::with_capacity(3);
        if start > 0 {
            parts.push(zeros(start));
        }
        parts.push(grad);
        if after > 0 {
            parts.push(zeros(after));
        }
        grads.register::<B>(parent.id, B::float_concat(parts, dim));
    }
}

/// The gradients of a coalesced transfer's pieces, collected until the transfer's own
/// backward step moves them back together.
struct Bucket<B: ConcatBackend> {
    grads: Mutex<Vec<Option<FloatTensor<B>>>>,
}

impl<B: ConcatBackend> std::fmt::Debug for Bucket<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bucket")
    }
}

#[derive(Debug)]
struct PieceBackward;

impl<B: ConcatBackend> Backward<B, 1> for PieceBackward {
    /// The transfer's bucket and the piece's position in it.
    type State = (Arc<Bucket<B>>, usize);

    /// Stores the piece's gradient; every piece's step runs before the transfer's step, which
    /// is their parent and one level shallower in the graph.
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (bucket, index) = ops.state;
        let mut stored = bucket.grads.lock().unwrap_or_else(|e| e.into_inner());
        super::add_to::<B>(&mut stored[index], grad);
    }
}

/// What the backward of a coalesced transfer needs.
#[derive(Clone)]
struct MoveState<B: ConcatBackend> {
    source: B::Device,
    counts: Vec<usize>,
    bucket: Arc<Bucket<B>>,
    log: Option<Arc<dyn TransferLog>>,
}

impl<B: ConcatBackend> std::fmt::Debug for MoveState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MoveState({:?}, {} pieces)",
            self.source,
            self.counts.len()
        )
    }
}

#[derive(Debug)]
struct MoveBackward;

impl<B: ConcatBackend> Backward<B, 1> for MoveBackward {
    type State = MoveState<B>;

    /// Every piece's step has run (they are one level deeper): their gradients go back to
    /// the source in one buffer.
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [parent] = ops.parents;
        let state = ops.state;
        let pieces: Vec<_> =
            std::mem::take(&mut *state.bucket.grads.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(parent) = parent else { return };
        if let Some(buffer) =
            comm::return_pieces::<B>(pieces, &state.counts, &state.source, state.log.as_deref())
        {
            grads.register::<B>(parent.id, buffer);
        }
    }
}

#[derive(Debug)]
struct MoveBackBackward;

impl<B: ConcatBackend> Backward<B, 1> for MoveBackBackward {
    /// The device the tensor came from.
    type State = B::Device;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            grads.register::<B>(parent.id, B::float_move(grad, &ops.state));
        }
    }
}

type Tensor<B> = FloatTensor<Autodiff<B>>;

/// A tracked concatenation of exactly `N` inputs.
fn concat_n<B: ConcatBackend, C: CheckpointStrategy, const N: usize>(
    tensors: Vec<Tensor<B>>,
    dim: usize,
) -> Tensor<B> {
    let nodes: [_; N] = core::array::from_fn(|i| tensors[i].node.clone());
    let sizes: Vec<usize> = tensors.iter().map(|t| t.primitive.shape()[dim]).collect();
    let primitives = tensors.into_iter().map(|t| t.primitive).collect();
    match ConcatBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((sizes, dim), B::float_concat(primitives, dim)),
        OpsKind::UnTracked(prep) => prep.finish(B::float_concat(primitives, dim)),
    }
}

macro_rules! concat_by_count {
    ($tensors:ident, $dim:ident, $($n:literal)+) => {
        match $tensors.len() {
            $($n => concat_n::<B, C, $n>($tensors, $dim),)+
            _ => unreachable!("at most {MAX_TRACKED_INPUTS} inputs"),
        }
    };
}

impl<B: ConcatBackend, C: CheckpointStrategy> ConcatOps for Autodiff<B, C> {
    fn float_concat(mut tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        if tensors.len() > MAX_TRACKED_INPUTS {
            let mut groups = Vec::new();
            while !tensors.is_empty() {
                let rest = tensors.split_off(tensors.len().min(MAX_TRACKED_INPUTS));
                groups.push(Self::float_concat(tensors, dim));
                tensors = rest;
            }
            return Self::float_concat(groups, dim);
        }
        concat_by_count!(tensors, dim, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }

    fn int_concat(tensors: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self> {
        B::int_concat(tensors, dim)
    }

    fn float_split(
        tensor: FloatTensor<Self>,
        sizes: &[usize],
        dim: usize,
    ) -> Vec<FloatTensor<Self>> {
        let shape = tensor.primitive.shape().to_vec();
        let pieces = B::float_split(tensor.primitive.clone(), sizes, dim);
        let mut start = 0;
        pieces
            .into_iter()
            .zip(sizes)
            .map(|(piece, &size)| {
                let state = (shape.clone(), start, size, dim);
                start += size;
                match SplitBackward
                    .prepare::<C>([tensor.node.clone()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(state, piece),
                    OpsKind::UnTracked(prep) => prep.finish(piece),
                }
            })
            .collect()
    }

    fn int_split(tensor: IntTensor<Self>, sizes: &[usize], dim: usize) -> Vec<IntTensor<Self>> {
        B::int_split(tensor, sizes, dim)
    }
}

impl<B: ConcatBackend, C: CheckpointStrategy> TransferOps for Autodiff<B, C> {
    fn device_transfers() -> bool {
        B::device_transfers()
    }

    fn host_staged_transfers() -> bool {
        B::host_staged_transfers()
    }

    fn fence_transfers(source: &Self::Device) {
        B::fence_transfers(source)
    }

    fn orders_receives() -> bool {
        B::orders_receives()
    }

    fn fence_receive(destination: &Self::Device) {
        B::fence_receive(destination)
    }

    fn float_move(tensor: FloatTensor<Self>, device: &Self::Device) -> FloatTensor<Self> {
        let source = B::float_device(&tensor.primitive);
        if &source == device {
            return tensor;
        }
        let moved = B::float_move(tensor.primitive, device);
        match MoveBackBackward
            .prepare::<C>([tensor.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(source, moved),
            OpsKind::UnTracked(prep) => prep.finish(moved),
        }
    }

    fn float_move_coalesced(
        tensors: Vec<FloatTensor<Self>>,
        device: &Self::Device,
    ) -> Vec<FloatTensor<Self>> {
        super::autodiff_coalesced::move_coalesced::<B, C>(tensors, device)
    }

    fn float_move_split(
        buffer: FloatTensor<Self>,
        counts: &[usize],
        device: &Self::Device,
    ) -> Vec<FloatTensor<Self>> {
        let source = B::float_device(&buffer.primitive);
        let moved = B::float_move(buffer.primitive, device);
        let pieces = B::float_split(moved.clone(), counts, 0);
        let bucket = Arc::new(Bucket {
            grads: Mutex::new(vec![None; counts.len()]),
        });
        let state = MoveState {
            source,
            counts: counts.to_vec(),
            bucket: bucket.clone(),
            log: comm::current_log().and_then(|log| log.for_backward()),
        };
        let moved = match MoveBackward
            .prepare::<C>([buffer.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, moved),
            OpsKind::UnTracked(prep) => prep.finish(moved),
        };
        pieces
            .into_iter()
            .enumerate()
            .map(|(index, piece)| {
                match PieceBackward
                    .prepare::<C>([moved.node.clone()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish((bucket.clone(), index), piece),
                    OpsKind::UnTracked(prep) => prep.finish(piece),
                }
            })
            .collect()
    }
}
