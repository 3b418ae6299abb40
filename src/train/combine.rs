//! The combine of the Learner path: every replica's gradients of the module's parameters,
//! weighted by shard and summed on the parameters' devices ([`comm::reduce_add_coalesced`]).

use std::marker::PhantomData;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::backend::ConcatBackend;
use crate::backend::comm::{self, Combine, Target};

/// Lays every gradient of `replica`'s parameters in `grads` out contiguously, on the
/// replica's worker, so that the combine on the calling thread flattens them for free
/// ([`comm::contiguous`]).
pub(super) fn make_contiguous<B: AutodiffBackend, M: Module<B>>(
    replica: &M,
    grads: &mut GradientsParams,
) where
    B::InnerBackend: ConcatBackend,
{
    replica.visit(&mut Contiguous::<B> {
        grads,
        _backend: PhantomData,
    });
}

/// The replicas' gradients of `module`'s parameters, combined on the parameters' devices:
/// replica `r`'s scaled by `weights[r]` when given, then summed. A replica of weight zero
/// adds nothing (its own mean loss may be 0 / 0, its gradients NaN).
pub(super) fn combine<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    mut replicas: Vec<GradientsParams>,
    weights: Option<&[f64]>,
) -> GradientsParams
where
    B::InnerBackend: ConcatBackend,
{
    if let Some(weights) = weights {
        for (replica, &weight) in replicas.iter_mut().zip(weights) {
            if weight == 0.0 {
                *replica = GradientsParams::new();
            }
        }
    }
    let mut take = Take::<B> {
        replicas: &mut replicas,
        grads: Vec::new(),
        targets: Vec::new(),
    };
    module.visit(&mut take);
    let Take { grads, targets, .. } = take;
    let per_replica = (0..replicas.len())
        .map(|r| grads.iter().map(|param| param[r].clone()).collect())
        .collect();
    let log = comm::current_log();
    let totals = comm::reduce_add_coalesced::<B::InnerBackend>(
        per_replica,
        &targets,
        weights,
        log.as_deref(),
    );
    let mut put = Put::<B, _> {
        totals: totals.into_iter(),
        grads: GradientsParams::new(),
        _backend: PhantomData,
    };
    module.visit(&mut put);
    put.grads
}

/// Takes every replica's gradient of each trainable parameter, in visiting order.
struct Take<'a, B: AutodiffBackend> {
    replicas: &'a mut [GradientsParams],
    /// Per parameter, each replica's gradient.
    grads: Vec<Vec<Option<FloatTensor<B::InnerBackend>>>>,
    targets: Vec<Target<B::Device>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Take<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        if !tensor.is_require_grad() {
            return;
        }
        let grads = self
            .replicas
            .iter_mut()
            .map(|replica| {
                replica
                    .remove::<B::InnerBackend, D>(param.id)
                    .and_then(|grad| match grad.into_primitive() {
                        TensorPrimitive::Float(grad) => Some(grad),
                        TensorPrimitive::QFloat(_) => None,
                    })
            })
            .collect();
        self.grads.push(grads);
        self.targets.push(Target {
            device: tensor.device(),
            combine: Combine::Sum,
        });
    }
}

/// Lays every gradient of a replica's parameters out contiguously for the combine, on the
/// replica's worker ([`comm::contiguous`]).
struct Contiguous<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    _backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Contiguous<'_, B>
where
    B::InnerBackend: ConcatBackend,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let grad = match grad.into_primitive() {
            TensorPrimitive::Float(grad) => {
                TensorPrimitive::Float(comm::contiguous::<B::InnerBackend>(grad))
            }
            quantized => quantized,
        };
        (self.grads).register::<B::InnerBackend, D>(param.id, Tensor::from_primitive(grad));
    }
}

/// Registers the combined gradients, in the visiting order of [`Take`].
struct Put<B: AutodiffBackend, I> {
    totals: I,
    grads: GradientsParams,
    _backend: PhantomData<B>,
}

impl<B: AutodiffBackend, I> ModuleVisitor<B> for Put<B, I>
where
    I: Iterator<Item = Option<FloatTensor<B::InnerBackend>>>,
{
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !param.val().is_require_grad() {
            return;
        }
        if let Some(Some(total)) = self.totals.next() {
            let total = Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(total));
            self.grads.register::<B::InnerBackend, D>(param.id, total);
        }
    }
}
