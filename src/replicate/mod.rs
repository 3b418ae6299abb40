//! Differentiable copies of a module, one per replica.
//!
//! A copy on the device that already holds a parameter shares that parameter's data (no
//! copy); copies on other devices receive the parameters in coalesced buckets
//! ([`comm::move_coalesced`]). How a copy's parameters relate to the module's depends on the
//! backward that follows, and is decided in `backward/ties.rs` ([`Ties`]): the same graph nodes (the
//! single backward), leaves of the replica's own graph whose gradients the per-replica
//! backward sends back (the parallel backward), or fresh leaves whose gradients the replica's
//! own training step returns.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Bool, Int, Tensor, backend::Backend};

use crate::backend::{ConcatBackend, is_tracked};
use crate::backward::ties::Ties;
use crate::running_states::{OwnStates, RunningStates};

mod transfer;

use transfer::move_parameters;
pub(crate) use transfer::{MoveModule, move_module};

/// Default size of one coalesced parameter transfer: 25 MiB.
pub const DEFAULT_BUCKET_SIZE: usize = 25 * 1024 * 1024;

/// One copy of `module` per device, each with its parameters on that device.
///
/// A copy on the device that already holds a parameter shares that parameter's data (no
/// copy). Copies on another device receive the parameters in coalesced transfers of about
/// [`DEFAULT_BUCKET_SIZE`] bytes (see [`replicate_with_buckets`]); replicas that share a device
/// share one transfer. Under an autodiff backend every replica's gradient sums into the
/// original parameters, and the gradients of a transfer come back as one buffer.
///
/// Running states (Burn's `RunningState`, e.g. batch-norm statistics) are shared by a module
/// and all its clones, so every copy reads the one value, which stays where the module holds
/// it.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::nn::{Linear, LinearConfig};
/// use burn_dataparallel::replicate;
///
/// let device = Default::default();
/// let model: Linear<Flex> = LinearConfig::new(4, 2).init(&device);
/// let replicas = replicate(&model, &[device, device]);
/// assert_eq!(replicas.len(), 2);
/// ```
pub fn replicate<B: ConcatBackend, M: Module<B>>(module: &M, devices: &[B::Device]) -> Vec<M> {
    replicate_with_buckets(module, devices, DEFAULT_BUCKET_SIZE)
}

/// [`replicate`] with coalesced transfers of at most `bucket_size` bytes.
///
/// The float parameters bound for another device are grouped, in module order, by dtype and
/// by whether they require a gradient; each group is cut into buckets of at most
/// `bucket_size` bytes (a larger parameter gets a bucket of its own), and each bucket moves
/// as one flat buffer. A `bucket_size` of zero moves every parameter on its own. Int and
/// bool parameters move one by one.
pub fn replicate_with_buckets<B: ConcatBackend, M: Module<B>>(
    module: &M,
    devices: &[B::Device],
    bucket_size: usize,
) -> Vec<M> {
    // The copies start from clones: lazy parameters must be initialised first, in the module.
    initialize(module);
    replicate_for_step(module, devices, bucket_size, None, &Ties::Caller).0
}

/// The replicas of one step on `devices` (shard order), tied to the module as `ties` say,
/// and the plan of their running states (see [`RunningStates::plan`]). `module` has no lazy
/// parameter left ([`initialize`]): the copies start from clones of it.
///
/// Each copy comes from the module or the replica's own running-state set
/// ([`RunningStates::source`]); replicas that share a device and a set share one copy.
pub(crate) fn replicate_for_step<B: ConcatBackend, M: Module<B>>(
    module: &M,
    devices: &[B::Device],
    bucket_size: usize,
    own_states: Option<OwnStates<M>>,
    ties: &Ties<B>,
) -> (Vec<M>, RunningStates<B, M>) {
    let tied = ties.prepare(module);
    let mut states = RunningStates::plan(&tied.module, devices, own_states);
    // The module's graph moves as it is; other copies carry plain values, from which each
    // replica then makes its leaves: a copy that stays on the module's device needs neither
    // detaching nor a transfer, one bound for another device is detached first so that its
    // transfer adds nothing to the caller's graph. Each copy comes with whether it moved.
    let copy_to = |source: &M, device: &B::Device| {
        let here = transfer::is_on(&tied.module, device);
        let copy = match tied.shares_nodes() {
            true => move_parameters(source, device, bucket_size, tied.leaves.as_ref()),
            false if transfer::is_on(source, device) => source.clone(),
            false => move_parameters(&source.clone().map(&mut Detach), device, bucket_size, None),
        };
        (copy, !here)
    };
    let mut made: Vec<(&B::Device, Option<usize>, M, bool)> = Vec::new();
    let replicas = devices
        .iter()
        .enumerate()
        .map(|(replica, device)| {
            let group = states.group(replica);
            let copy = match made.iter().find(|(d, g, _, _)| *d == device && *g == group) {
                Some((_, _, copy, _)) => copy.clone(),
                None => {
                    let (copy, moved) = copy_to(states.source(replica), device);
                    made.push((device, group, copy.clone(), moved));
                    copy
                }
            };
            tied.parameters(copy, replica)
        })
        .collect();
    // Copies on the module's device hold the module's own nodes, which the join has already.
    tied.join(
        made.iter()
            .filter(|made| made.3)
            .map(|(_, _, copy, _)| copy),
    );
    states.restore();
    (replicas, states)
}

/// Detaches every tracked float tensor: the values without their graph (Burn's `detach`
/// keeps a leaf trainable, as a new leaf of a graph of its own).
struct Detach;

impl<B: ConcatBackend> ModuleMapper<B> for Detach {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !is_tracked(&param.val()) {
            return param;
        }
        param.map(|tensor| tensor.detach())
    }
}

/// Initialises every lazy parameter of `module` in place.
///
/// A lazy parameter that is cloned before initialisation initialises separately in each clone
/// (different weights, no gradient to the original), so replicas must only be made from an
/// initialised module.
pub(crate) fn initialize<B: Backend, M: Module<B>>(module: &M) {
    module.visit(&mut Initialize);
}

struct Initialize;

impl<B: Backend> ModuleVisitor<B> for Initialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let _ = param.val();
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        let _ = param.val();
    }
}

#[cfg(test)]
mod independent_tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{Linear, LinearConfig};

    type B = Autodiff<Flex>;

    /// Independent replicas sharing a device get leaves of their own: distinct autodiff nodes,
    /// each the start of its own graph.
    #[test]
    fn independent_replicas_have_leaves_of_their_own() {
        let device = Default::default();
        let model: Linear<B> = LinearConfig::new(4, 3).init(&device);
        let (replicas, _) =
            replicate_for_step(&model, &[device; 3], 1 << 20, None, &Ties::Independent);
        let ids: Vec<_> = replicas
            .iter()
            .map(|r| r.weight.val().into_primitive().tensor().node.id)
            .collect();
        let module_id = model.weight.val().into_primitive().tensor().node.id;
        assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
        assert!(ids.iter().all(|id| *id != module_id));
    }
}
