//! The transfer of a module's parameters to another device: the float parameters bound
//! there, cut into coalesced buckets, each moved as one buffer ([`comm::move_coalesced`]).

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, DType, Int, Tensor, TensorPrimitive, backend::Backend};

use crate::backend::{ConcatBackend, comm, is_tracked};

/// A float parameter bound for another device.
struct Outgoing<B: Backend> {
    id: ParamId,
    value: FloatTensor<B>,
    dtype: DType,
    tracked: bool,
}

/// A copy of `module` on `device`, float parameters moved in coalesced buckets; the module
/// itself (a clone) when everything is there already. A float parameter found in `leaves`
/// (by id) is moved from the tensor there instead of the module's (the same values: see
/// [`Ties::leaves`](crate::ties::Ties::leaves)).
pub(super) fn move_parameters<B: ConcatBackend, M: Module<B>>(
    module: &M,
    device: &B::Device,
    bucket_size: usize,
    leaves: Option<&HashMap<ParamId, FloatTensor<B>>>,
) -> M {
    let mut collect = Collect {
        device,
        leaves,
        outgoing: Vec::new(),
        others_elsewhere: false,
    };
    module.visit(&mut collect);
    if collect.outgoing.is_empty() && !collect.others_elsewhere {
        return module.clone();
    }
    let outgoing = collect.outgoing;
    let layout: Vec<(DType, bool, usize)> = outgoing
        .iter()
        .map(|p| (p.dtype, p.tracked, comm::bytes_of(&p.value)))
        .collect();
    let mut arrived: HashMap<ParamId, FloatTensor<B>> = HashMap::with_capacity(outgoing.len());
    for bucket in comm::plan_buckets(&layout, bucket_size) {
        let values = bucket.iter().map(|&i| outgoing[i].value.clone()).collect();
        for (&i, piece) in bucket.iter().zip(comm::move_coalesced::<B>(values, device)) {
            arrived.insert(outgoing[i].id, piece);
        }
    }
    module.clone().map(&mut MoveTo {
        device,
        arrived,
        fork: false,
    })
}

/// How a wrapper moves its whole module to another device (`Module::fork` when the flag is
/// true, `Module::to_device` when false), chosen where the backend is known.
pub(crate) type MoveModule<M, D> = fn(M, &D, bool) -> M;

/// `module` forked (`fork`: parameters become fresh leaves there) or moved to `device`:
/// Burn's own `fork` and `to_device` where the backend copies between devices, the crate's
/// transfers through host memory where Burn 0.21 does not
/// ([`TransferOps::host_staged_transfers`](crate::TransferOps::host_staged_transfers)), so
/// that burn-train's Learner can move a wrapper to another wgpu device.
pub(crate) fn move_module<B: ConcatBackend, M: Module<B>>(
    module: M,
    device: &B::Device,
    fork: bool,
) -> M {
    match (B::host_staged_transfers(), fork) {
        (false, true) => module.fork(device),
        (false, false) => module.to_device(device),
        (true, _) => module.map(&mut MoveTo {
            device,
            arrived: HashMap::new(),
            fork,
        }),
    }
}

/// Whether every parameter of `module` is on `device` already (a [`move_parameters`] to it
/// would move nothing).
pub(super) fn is_on<B: Backend, M: Module<B>>(module: &M, device: &B::Device) -> bool {
    let mut on = OnDevice { device, all: true };
    module.visit(&mut on);
    on.all
}

struct OnDevice<'a, B: Backend> {
    device: &'a B::Device,
    all: bool,
}

impl<B: Backend> ModuleVisitor<B> for OnDevice<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.all &= param.val().device() == *self.device;
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.all &= param.val().device() == *self.device;
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.all &= param.val().device() == *self.device;
    }
}

/// Every non-empty float parameter that is not on `device` yet, as it travels.
struct Collect<'a, B: Backend> {
    device: &'a B::Device,
    leaves: Option<&'a HashMap<ParamId, FloatTensor<B>>>,
    outgoing: Vec<Outgoing<B>>,
    /// Whether a parameter that does not travel in a bucket is on another device.
    others_elsewhere: bool,
}

impl<B: ConcatBackend> ModuleVisitor<B> for Collect<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        let elements = tensor.shape().num_elements();
        let local = tensor.device() == *self.device;
        if elements == 0 || local {
            self.others_elsewhere |= !local;
            return;
        }
        let tracked = is_tracked(&tensor);
        let dtype = tensor.dtype();
        let TensorPrimitive::Float(value) = tensor.into_primitive() else {
            // Quantized parameters move on their own.
            self.others_elsewhere |= !local;
            return;
        };
        let value = match self.leaves.and_then(|leaves| leaves.get(&param.id)) {
            Some(leaf) => leaf.clone(),
            None => value,
        };
        self.outgoing.push(Outgoing {
            id: param.id,
            value,
            dtype,
            tracked,
        });
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.others_elsewhere |= param.val().device() != *self.device;
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.others_elsewhere |= param.val().device() != *self.device;
    }
}

/// Puts the moved float parameters in place and moves the rest one by one; with `fork`, the
/// float parameters moved here become fresh leaves there, as Burn's `Module::fork` makes them.
struct MoveTo<'a, B: ConcatBackend> {
    device: &'a B::Device,
    arrived: HashMap<ParamId, FloatTensor<B>>,
    fork: bool,
}

impl<B: ConcatBackend> ModuleMapper<B> for MoveTo<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (device, fork) = (self.device, self.fork);
        match self.arrived.remove(&param.id) {
            Some(moved) => param.map(|_| Tensor::from_primitive(TensorPrimitive::Float(moved))),
            None if fork => param.map(|tensor| {
                let grad = tensor.is_require_grad();
                // Detached after the move too: the move of a tracked backend makes a node.
                let moved = comm::move_to(tensor.detach(), device).detach();
                if grad { moved.require_grad() } else { moved }
            }),
            None => param.map(|tensor| comm::move_to(tensor, device)),
        }
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        param.map(|tensor| comm::move_to(tensor, self.device))
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        param.map(|tensor| comm::move_to(tensor, self.device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend;
    use burn::backend::{Autodiff, Flex};

    type B = Autodiff<Flex>;

    /// Coalesce then move-split round-trips values bit for bit, and the gradients that come back
    /// through one buffer equal those of the same loss on the original tensors (zero for an
    /// unused piece).
    #[test]
    fn coalesced_transfer_round_trips_values_and_gradients() {
        let device = Default::default();
        let shapes: [&[usize]; 4] = [&[3, 5], &[7], &[2, 3, 4], &[1]];
        let params: Vec<Tensor<B, 1>> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let n: usize = shape.iter().product();
                let values: Vec<f32> = (0..n).map(|j| ((i * 31 + j) as f32).sin() * 3.7).collect();
                Tensor::<B, 1>::from_floats(values.as_slice(), &device).require_grad()
            })
            .collect();
        let counts: Vec<usize> = params.iter().map(|p| p.dims()[0]).collect();
        let buffer = backend::coalesce(params.clone());
        let pieces = backend::move_split(buffer, &counts, &device);
        for (piece, param) in pieces.iter().zip(&params) {
            let (a, b) = (piece.to_data(), param.to_data());
            assert_eq!(a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
        }
        // Piece 2 is unused; pieces 0 and 3 are used twice.
        let loss = |ts: &[Tensor<B, 1>]| {
            (ts[0].clone() * ts[0].clone()).sum()
                + ts[1].clone().exp().sum()
                + ts[3].clone() * 5.0
                + ts[0].clone().sum() * ts[3].clone()
        };
        let grads = loss(&pieces).backward();
        let reference = loss(&params).backward();
        for (i, param) in params.iter().enumerate() {
            let got = param.grad(&grads).expect("every parameter gets a gradient");
            let want = match param.grad(&reference) {
                Some(want) => want,
                None => param.clone().inner().zeros_like(),
            };
            let (got, want) = (got.to_data(), want.to_data());
            assert_eq!(
                got.as_slice::<f32>().unwrap(),
                want.as_slice::<f32>().unwrap(),
                "parameter {i}"
            );
        }
    }
}
