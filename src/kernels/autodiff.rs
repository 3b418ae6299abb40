//! [`ShardOps`] under Burn's autodiff: the forwards run the inner backend's, and each one's
//! backward is the other. A concatenation's backward slices the output's gradient back into
//! each input's part; a split's concatenates the pieces' gradients into the input's (zeros
//! for a piece the loss does not reach), in one launch where Burn's own slices would add a
//! zero-filled gradient of the whole input per piece.
//!
//! Burn's public `Backward` takes its inputs as an array of a size known when compiling, so
//! the concatenation's backward is written for 2 to 16 inputs, chosen by the inputs' count.
//! More inputs (a model's parameters moved as one) are still joined by one launch, and
//! recorded as a tree: groups of at most 16, each group a view of the output, the output the
//! concatenation of the groups. Their backwards slice the gradient twice, into views.
//!
//! A split has several outputs where Burn's `Backward` has one: it is recorded as an identity
//! operation (`Collect`) whose output each piece (`Piece`) is taken from. A piece's backward
//! leaves its gradient in a slot shared with `Collect`, whose backward runs after every
//! piece's (Burn runs a graph's steps deepest first, and the pieces are one deeper) and
//! concatenates them. This leans on that order, which `tests/suite/scatter.rs` checks.

use burn::backend::Backend;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, TensorMetadata};
use burn::tensor::Slice;

use std::sync::{Arc, Mutex};

use burn::tensor::Shape;

use super::ShardOps;

impl<B: Backend + ShardOps, C: CheckpointStrategy> ShardOps for Autodiff<B, C> {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        if tensors.len() < 2 {
            return <Self as FloatTensorOps<Self>>::float_cat(tensors, dim);
        }
        let sizes = tensors.iter().map(|t| t.primitive().shape()[dim]).collect();
        let (primitives, nodes) = tensors.into_iter().map(|t| t.into_parts()).unzip();
        let output = B::concat(primitives, dim);
        record::<B, C>(nodes, sizes, output, dim)
    }

    fn split(tensor: FloatTensor<Self>, sizes: &[usize], dim: usize) -> Vec<FloatTensor<Self>> {
        let shapes = (sizes.iter())
            .map(|&size| {
                let mut shape = tensor.primitive().shape();
                shape[dim] = size;
                shape
            })
            .collect();
        let state = Collected {
            slots: Arc::new(Mutex::new(vec![None; sizes.len()])),
            shapes,
            dim,
        };
        let slots = state.slots.clone();
        let node = tensor.node();
        let primitive = tensor.into_primitive();
        let collected = match <Collect as Backward<B, 1>>::prepare::<C>(Collect, [node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, primitive),
            OpsKind::UnTracked(prep) => prep.finish(primitive),
        };
        let pieces = B::split(collected.primitive().clone(), sizes, dim);
        (pieces.into_iter().enumerate())
            .map(|(index, piece)| {
                match <Piece as Backward<B, 1>>::prepare::<C>(Piece, [collected.node()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => {
                        let slot = Slot {
                            slots: slots.clone(),
                            index,
                        };
                        prep.finish(slot, piece)
                    }
                    OpsKind::UnTracked(prep) => prep.finish(piece),
                }
            })
            .collect()
    }
}

/// The gradients of a split's pieces, each left by its piece's backward.
type Slots<B> = Arc<Mutex<Vec<Option<FloatTensor<B>>>>>;

/// The identity operation a split's pieces are taken from; its backward concatenates their
/// gradients.
#[derive(Debug)]
struct Collect;

/// What [`Collect`]'s backward needs: the pieces' gradients, their shapes and the dimension.
#[derive(Debug)]
struct Collected<B: Backend> {
    slots: Slots<B>,
    shapes: Vec<Shape>,
    dim: usize,
}

impl<B: Backend> Clone for Collected<B> {
    fn clone(&self) -> Self {
        Self {
            slots: self.slots.clone(),
            shapes: self.shapes.clone(),
            dim: self.dim,
        }
    }
}

impl<B: Backend + ShardOps> Backward<B, 1> for Collect {
    type State = Collected<B>;

    fn backward(self, ops: Ops<Collected<B>, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let Collected { slots, shapes, dim } = ops.state;
        let pieces = std::mem::take(&mut *slots.lock().expect("a split's gradient slots"));
        let [Some(parent)] = ops.parents else {
            return;
        };
        let Some(first) = pieces.iter().flatten().next() else {
            return;
        };
        let (device, dtype) = (first.device(), first.dtype());
        let pieces = (pieces.into_iter().zip(shapes))
            .map(|(grad, shape)| {
                grad.unwrap_or_else(|| B::float_zeros(shape, &device, dtype.into()))
            })
            .collect();
        grads.register::<B>(parent.id, B::concat(pieces, dim));
    }
}

/// One piece of a split: its backward leaves its gradient in its slot for [`Collect`].
#[derive(Debug)]
struct Piece;

/// Where a piece's gradient goes.
#[derive(Debug)]
struct Slot<B: Backend> {
    slots: Slots<B>,
    index: usize,
}

impl<B: Backend> Clone for Slot<B> {
    fn clone(&self) -> Self {
        Self {
            slots: self.slots.clone(),
            index: self.index,
        }
    }
}

impl<B: Backend> Backward<B, 1> for Piece {
    type State = Slot<B>;

    fn backward(self, ops: Ops<Slot<B>, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let Slot { slots, index } = ops.state;
        slots.lock().expect("a split's gradient slots")[index] = Some(grad);
    }
}

/// The backward of a concatenation: each input's rows of the output's gradient.
#[derive(Debug)]
struct ConcatBackward;

/// What the backward needs: the dimension and each input's size along it.
#[derive(Clone, Debug)]
struct Parts {
    dim: usize,
    sizes: Vec<usize>,
}

impl<B: Backend, const N: usize> Backward<B, N> for ConcatBackward {
    type State = Parts;

    fn backward(self, ops: Ops<Parts, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let shape = grad.shape();
        let Parts { dim, sizes } = ops.state;
        let mut start = 0;
        for (parent, size) in ops.parents.into_iter().zip(sizes) {
            let end = start + size;
            if let Some(node) = parent {
                let slices: Vec<Slice> = (0..shape.num_dims())
                    .map(|d| match d == dim {
                        true => Slice::from(start..end),
                        false => Slice::from(0..shape[d]),
                    })
                    .collect();
                grads.register::<B>(node.id, B::float_slice(grad.clone(), &slices));
            }
            start = end;
        }
    }
}

/// The most inputs one recorded concatenation has.
const MOST_PARENTS: usize = 16;

/// `output`, recorded as the concatenation along `dim` of the tensors of `nodes`, whose sizes
/// along it are `sizes`. More than [`MOST_PARENTS`] are recorded in groups, each a view of
/// `output`.
fn record<B: Backend + ShardOps, C: CheckpointStrategy>(
    nodes: Vec<NodeGuard>,
    sizes: Vec<usize>,
    output: FloatTensor<B>,
    dim: usize,
) -> FloatTensor<Autodiff<B, C>> {
    macro_rules! by_count {
        ($($n:literal)*) => {
            match nodes.len() {
                $($n => record_n::<B, C, $n>(nodes, sizes, output, dim),)*
                _ => unreachable!("at most {MOST_PARENTS} inputs"),
            }
        };
    }
    if nodes.len() <= MOST_PARENTS {
        return by_count!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
    }
    let per_group = nodes.len().div_ceil(MOST_PARENTS);
    let members_sizes: Vec<Vec<usize>> = sizes.chunks(per_group).map(<[usize]>::to_vec).collect();
    let group_sizes: Vec<usize> = members_sizes.iter().map(|s| s.iter().sum()).collect();
    let views = super::by_slices::<B>(output.clone(), &group_sizes, dim);
    let mut nodes = nodes.into_iter();
    // Each group is kept until the output is recorded: its node must live until then.
    let groups: Vec<_> = (members_sizes.into_iter().zip(views))
        .map(|(sizes, view)| {
            let members = nodes.by_ref().take(sizes.len()).collect();
            record::<B, C>(members, sizes, view, dim)
        })
        .collect();
    let group_nodes = groups.iter().map(|group| group.node()).collect();
    record::<B, C>(group_nodes, group_sizes, output, dim)
}

/// [`record`] for `N` inputs.
fn record_n<B: Backend + ShardOps, C: CheckpointStrategy, const N: usize>(
    nodes: Vec<NodeGuard>,
    sizes: Vec<usize>,
    output: FloatTensor<B>,
    dim: usize,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes: [NodeGuard; N] = nodes
        .try_into()
        .unwrap_or_else(|_| unreachable!("called with N nodes"));
    match <ConcatBackward as Backward<B, N>>::prepare::<C>(ConcatBackward, nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(Parts { dim, sizes }, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}
