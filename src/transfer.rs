//! Every move of a tensor between devices: Burn's `to_device`, differentiable under autodiff
//! (its backward moves the gradient back), skipped where the tensor is there already.
//!
//! Many tensors that go from one device to another together (a module's parameters, a
//! replica's gradients) move as one where the target is a CubeCL device and the source a
//! CubeCL device or Flex: concatenated into one buffer, moved, and split back into views of
//! it (`kernels/`). A move between devices pays per transfer (a synchronisation through
//! the host, a pair of NCCL calls), so one move of a model's hundred tensors replaces a
//! hundred. Under autodiff the backward moves the gradients back as one too: the split's
//! backward concatenates them, the concatenation's slices them.

use std::collections::VecDeque;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::kind::Basic;
use burn::tensor::{Bool, DType, Device, Int, Tensor};

use crate::kernels;

/// `tensor` on `device`.
pub(crate) fn move_to<const D: usize, K: Basic>(
    tensor: Tensor<D, K>,
    device: &Device,
) -> Tensor<D, K> {
    if tensor.device() == *device {
        tensor
    } else {
        tensor.to_device(device)
    }
}

/// `tensors` on `device`, in order: those of one device, one float dtype and one autodiff
/// state moved as one where [`coalesces`], the others one by one.
pub(crate) fn move_together(tensors: Vec<Tensor<1>>, device: &Device) -> Vec<Tensor<1>> {
    let mut groups: Vec<((Device, DType, bool), Vec<usize>)> = Vec::new();
    for (i, tensor) in tensors.iter().enumerate() {
        let key = (tensor.device(), tensor.dtype(), tensor.is_tracked());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let mut slots: Vec<Option<Tensor<1>>> = tensors.into_iter().map(Some).collect();
    let mut moved: Vec<Option<Tensor<1>>> = vec![None; slots.len()];
    for ((from, dtype, _), members) in groups {
        let mut take = |i: usize| slots[i].take().expect("each tensor once");
        if members.len() > 1 && dtype.is_float() && coalesces(&from, device) {
            let parts: Vec<Tensor<1>> = members.iter().map(|&i| take(i)).collect();
            let sizes = parts.iter().map(|part| part.dims()[0]).collect();
            let joined = move_to(kernels::concat(parts, 0), device);
            for (i, piece) in members.into_iter().zip(kernels::split(joined, sizes, 0)) {
                moved[i] = Some(piece);
            }
        } else {
            for i in members {
                moved[i] = Some(move_to(take(i), device));
            }
        }
    }
    moved
        .into_iter()
        .map(|tensor| tensor.expect("every tensor moved"))
        .collect()
}

/// Whether tensors going from `from` to `to` move as one: two distinct devices, both with
/// the crate's `ShardOps`, the target a CubeCL device. The target is where the backward's
/// concatenation runs (gradients go back the other way), and on Flex a concatenation of a
/// model's gradients cost more than the transfers it saved (`benches/RESULTS.md`); between
/// host backends without them a move is a copy in memory, as the concatenation would be.
fn coalesces(from: &Device, to: &Device) -> bool {
    from != to && kernels::has_ops(from) && kernels::is_cube(to)
}

/// How a module's moved parameters are tied to its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tie {
    /// Burn's `Module::to_device`: the moves are in the autodiff graph.
    Moved,
    /// Burn's `Module::fork`: parameters of their own (same ids), leaves of new graphs.
    Forked,
}

/// `module` on `device`, as Burn's `Module::to_device` or `Module::fork` (`tie`), its float
/// parameters moved together ([`move_together`]) where they [`coalesce`](coalesces).
///
/// Other parameters move by Burn's own calls, as they are: those that would move one by
/// one anyway, and what Burn moves without a mapper (a plain tensor field, by Burn's call
/// after). A parameter not yet initialized is initialized where it is, as Burn's own move of
/// a module's clone would (the clone shares the lazy value, so Burn cannot retarget it).
pub(crate) fn move_module<M: Module>(module: M, device: &Device, tie: Tie) -> M {
    let mut params = Params {
        device,
        tie,
        met: VecDeque::new(),
        flat: Vec::new(),
    };
    module.visit(&mut params);
    let Params { met, flat, .. } = params;
    let mut placed = Placed {
        device,
        tie,
        met,
        tensors: move_together(flat, device).into(),
    };
    let module = module.map(&mut placed);
    match module.devices().as_slice() {
        [only] if only == device => module,
        _ => match tie {
            Tie::Moved => module.to_device(device),
            Tie::Forked => module.fork(device),
        },
    }
}

/// Whether `param` is one [`move_module`] moves with the others: on a device from which
/// moves to `device` [`coalesces`], not empty. The others skip the flattening and reshaping
/// (two more autodiff operations a parameter) that a move together takes.
fn moved_together<const D: usize>(param: &Param<Tensor<D>>, device: &Device) -> bool {
    coalesces(&param.lazy_device(), device) && param.shape().num_elements() > 0
}

/// The float parameters to move ([`moved_together`]), flattened, in the module's order, and
/// every float parameter met: its id and, where it is one of them, its shape and whether it
/// requires a gradient. A parameter that appears twice (a tied weight) is taken twice: Burn's
/// optimizers update only the first of them, so the two may hold different values.
struct Params<'a> {
    device: &'a Device,
    tie: Tie,
    met: VecDeque<(ParamId, Option<Together>)>,
    flat: Vec<Tensor<1>>,
}

/// A parameter moved together: its shape, and whether it requires a gradient.
type Together = (Vec<usize>, bool);

impl ModuleVisitor for Params<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !moved_together(param, self.device) {
            self.met.push_back((param.id, None));
            return;
        }
        let value = param.val();
        let together = (value.dims().to_vec(), value.is_require_grad());
        self.met.push_back((param.id, Some(together)));
        let value = match self.tie {
            Tie::Moved => value,
            Tie::Forked => value.detach(),
        };
        self.flat.push(value.flatten::<1>(0, D - 1));
    }
}

/// The moved parameters put in place, in the order [`Params`] met them (a mapper meets the
/// parameters in a visitor's order); any other parameter is moved by Burn's own call.
struct Placed<'a> {
    device: &'a Device,
    tie: Tie,
    met: VecDeque<(ParamId, Option<Together>)>,
    tensors: VecDeque<Tensor<1>>,
}

impl ModuleMapper for Placed<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        // A parameter the visitor did not meet here (a module whose mapper walks otherwise)
        // keeps the queue as it is and moves by Burn's call.
        let together = match self.met.front() {
            Some((id, _)) if *id == param.id => self.met.pop_front().and_then(|(_, t)| t),
            _ => None,
        };
        let Some((shape, require_grad)) = together else {
            return match self.tie {
                Tie::Moved => param.to_device(self.device),
                Tie::Forked => param.fork(self.device),
            };
        };
        let tensor = self.tensors.pop_front().expect("the next one");
        let shape: [usize; D] = shape.try_into().expect("the parameter's rank");
        param.map(|_| {
            let tensor = tensor.reshape(shape);
            match (self.tie, require_grad) {
                (Tie::Moved, _) => tensor,
                // As Burn's `fork`: a leaf of its own, whatever the move recorded.
                (Tie::Forked, false) => tensor.detach(),
                (Tie::Forked, true) => tensor.detach().require_grad(),
            }
        })
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        param.to_device(self.device)
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<D, Bool>>,
    ) -> Param<Tensor<D, Bool>> {
        param.to_device(self.device)
    }
}
