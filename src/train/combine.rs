//! Where the replicas' gradients are summed on the `Learner` path: one set of gradients for
//! the wrapped module's parameters, on its device.

use std::collections::{HashMap, HashSet};

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};

use crate::transfer::{move_to, move_together};

/// The sum over replicas of `grads[r] * weights[r]` (plain sum without weights) for every
/// float parameter of `module`, on `device`.
///
/// A parameter that no replica has a gradient for has none in the sum; one that appears
/// twice in `module` under one id (a tied weight) is summed once, as Burn's own
/// `GradientsParams` holds one gradient per id. Each replica's gradients come to `device`
/// together (`transfer::move_together`).
pub(crate) fn combine<M: Module>(
    module: &M,
    grads: Vec<GradientsParams>,
    weights: Option<&[f64]>,
    device: &Device,
) -> GradientsParams {
    let mut taken = Taken {
        grads,
        seen: HashSet::new(),
        flat: Vec::new(),
    };
    module.visit(&mut taken);
    let Taken { grads, flat, .. } = taken;

    let mut sums: HashMap<ParamId, Tensor<1>> = HashMap::new();
    for (replica, (ids, grads)) in flat.into_iter().enumerate() {
        for (id, grad) in ids.into_iter().zip(move_together(grads, device)) {
            let grad = weighted(grad, weights, replica);
            let sum = match sums.remove(&id) {
                Some(sum) => sum + grad,
                None => grad,
            };
            sums.insert(id, sum);
        }
    }
    let mut placed = Placed {
        grads,
        weights,
        device,
        sums,
        seen: HashSet::new(),
        out: GradientsParams::new(),
    };
    module.visit(&mut placed);
    placed.out
}

/// Each replica's gradients of `module`'s parameters taken out flat, in the order of the
/// module's parameters. Empty gradients stay in `grads` (Burn 0.22.1 cannot reshape them).
struct Taken {
    grads: Vec<GradientsParams>,
    seen: HashSet<ParamId>,
    flat: Vec<(Vec<ParamId>, Vec<Tensor<1>>)>,
}

impl ModuleVisitor for Taken {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !self.seen.insert(param.id) {
            return;
        }
        self.flat.resize_with(self.grads.len(), Default::default);
        for (grads, (ids, flat)) in self.grads.iter_mut().zip(&mut self.flat) {
            let empty = |grad: &Tensor<D>| grad.shape().num_elements() == 0;
            if grads.get::<D>(param.id).is_some_and(|grad| !empty(&grad))
                && let Some(grad) = grads.remove::<D>(param.id)
            {
                ids.push(param.id);
                flat.push(grad.flatten::<1>(0, D - 1));
            }
        }
    }
}

/// The sums put back in each parameter's shape; empty gradients summed one by one.
struct Placed<'a> {
    grads: Vec<GradientsParams>,
    weights: Option<&'a [f64]>,
    device: &'a Device,
    sums: HashMap<ParamId, Tensor<1>>,
    seen: HashSet<ParamId>,
    out: GradientsParams,
}

impl ModuleVisitor for Placed<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !self.seen.insert(param.id) {
            return;
        }
        if let Some(sum) = self.sums.remove(&param.id) {
            let shape: [usize; D] = param.shape().dims();
            self.out.register(param.id, sum.reshape(shape));
            return;
        }
        let (weights, device) = (self.weights, self.device);
        let total = (self.grads.iter_mut().enumerate())
            .filter_map(|(replica, grads)| {
                let grad = move_to(grads.remove::<D>(param.id)?, device);
                Some(weighted(grad, weights, replica))
            })
            .reduce(|sum, grad| sum + grad);
        if let Some(total) = total {
            self.out.register(param.id, total);
        }
    }
}

/// `grad` times replica `replica`'s weight, or `grad` without weights.
fn weighted<const D: usize>(grad: Tensor<D>, weights: Option<&[f64]>, replica: usize) -> Tensor<D> {
    match weights {
        Some(weights) => grad.mul_scalar(weights[replica]),
        None => grad,
    }
}
