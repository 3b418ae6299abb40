//! One graph node with many parents and no backward of its own: the hub's parent when several
//! targets need it after them, and `float_join_graphs` (the single backward's anchor).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};

use burn::backend::autodiff::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::{ConcatBackend, MAX_TRACKED_INPUTS};

type Tracked<B, C> = FloatTensor<Autodiff<B, C>>;

#[derive(Debug)]
struct JoinBackward;

impl<B: ConcatBackend, const N: usize> Backward<B, N> for JoinBackward {
    type State = ();

    /// Nothing flows back: the join's output is never used.
    fn backward(self, _: Ops<Self::State, N>, _: &mut Gradients, _: &mut Checkpointer) {}
}

/// One graph node with exactly `N` of `tensors` as parents; its value is the first tensor's.
fn join_n<B: ConcatBackend, C: CheckpointStrategy, const N: usize>(
    tensors: Vec<Tracked<B, C>>,
) -> Tracked<B, C> {
    let nodes: [_; N] = core::array::from_fn(|i| tensors[i].node.clone());
    let value = tensors[0].primitive.clone();
    match JoinBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish((), value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    }
}

/// `tensors` (at least one) joined into one graph: in groups of at most 16 parents, then the
/// groups' nodes, until one node is left, which is returned (a single tensor is returned as
/// it is).
///
/// # Panics
///
/// If `tensors` is empty.
pub(crate) fn join_all<B: ConcatBackend, C: CheckpointStrategy>(
    mut tensors: Vec<Tracked<B, C>>,
) -> Tracked<B, C> {
    while tensors.len() > 1 {
        tensors = (tensors.chunks(MAX_TRACKED_INPUTS))
            .map(|group| join_group::<B, C>(group.to_vec()))
            .collect();
    }
    tensors.pop().expect("at least one tensor to join")
}

/// One graph node with the 1 to 16 `tensors` as parents.
fn join_group<B: ConcatBackend, C: CheckpointStrategy>(
    tensors: Vec<Tracked<B, C>>,
) -> Tracked<B, C> {
    macro_rules! by_count {
        ($($n:literal)+) => {
            match tensors.len() {
                $($n => join_n::<B, C, $n>(tensors),)+
                _ => unreachable!("at most {MAX_TRACKED_INPUTS} inputs"),
            }
        };
    }
    by_count!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}
