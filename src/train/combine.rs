//! Where the replicas' gradients are summed on the `Learner` path: one set of gradients for
//! the wrapped module's parameters, on its device.

use std::collections::HashSet;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};

use crate::transfer::move_to;

/// The sum over replicas of `grads[r] * weights[r]` (plain sum without weights) for every
/// float parameter of `module`, on `device`.
///
/// A parameter that no replica has a gradient for has none in the sum; one that appears
/// twice in `module` under one id (a tied weight) is summed once, as Burn's own
/// `GradientsParams` holds one gradient per id.
pub(crate) fn combine<M: Module>(
    module: &M,
    grads: Vec<GradientsParams>,
    weights: Option<&[f64]>,
    device: &Device,
) -> GradientsParams {
    let mut sum = Sum {
        grads,
        weights,
        device,
        seen: HashSet::new(),
        out: GradientsParams::new(),
    };
    module.visit(&mut sum);
    sum.out
}

struct Sum<'a> {
    grads: Vec<GradientsParams>,
    weights: Option<&'a [f64]>,
    device: &'a Device,
    seen: HashSet<ParamId>,
    out: GradientsParams,
}

impl ModuleVisitor for Sum<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !self.seen.insert(param.id) {
            return;
        }
        let weights = self.weights;
        let device = self.device;
        let total = (self.grads.iter_mut().enumerate())
            .filter_map(|(replica, grads)| {
                let grad = move_to(grads.remove::<D>(param.id)?, device);
                Some(match weights {
                    Some(weights) => grad.mul_scalar(weights[replica]),
                    None => grad,
                })
            })
            .reduce(|sum, grad| sum + grad);
        if let Some(total) = total {
            self.out.register(param.id, total);
        }
    }
}
