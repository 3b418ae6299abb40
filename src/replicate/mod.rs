//! Differentiable copies of a module, one per replica.
//!
//! A copy on the device that already holds a parameter shares that parameter's data (no
//! copy); copies on other devices receive the parameters in coalesced buckets
//! ([`comm::move_coalesced`]). How a copy's parameters relate to the module's depends on the
//! backward that follows ([`Links`]): the same graph nodes (the single backward), leaves of the
//! replica's own graph whose gradients the per-replica backward sends back (the parallel
//! backward), or fresh leaves whose gradients the replica's own training step returns.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive, backend::Backend};

use crate::backend::{ConcatBackend, Part, ReplicaGraphs, is_tracked};
use crate::running_states::{OwnStates, RunningStates};

mod broadcast;

use broadcast::move_coalesced;

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
    let mut states = RunningStates::plan(module, devices, None);
    copies(module, devices, bucket_size, &mut states, Links::Shared)
}

/// How the replicas' parameters are tied to the module's.
pub(crate) enum Links<'a, B: Backend> {
    /// The module's own graph nodes (moved with a differentiable transfer): Burn's backward
    /// of the caller's graph reaches them.
    Shared,
    /// Leaves of each replica's own graph whose gradients go to the module's parameters.
    Graphs(&'a dyn ReplicaGraphs<B>),
    /// Fresh leaves of each replica's own graph, tied to nothing: the replica's own training
    /// step computes their gradients (burn-train's `TrainStep`, feature `train`).
    #[cfg_attr(not(feature = "train"), allow(dead_code))]
    Independent,
}

impl<B: Backend> Clone for Links<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Backend> Copy for Links<'_, B> {}

/// The replicas of one step on `devices` (shard order), and the plan of their running states
/// (see [`RunningStates::plan`]).
pub(crate) fn replicate_for_step<B: ConcatBackend, M: Module<B>>(
    module: &M,
    devices: &[B::Device],
    bucket_size: usize,
    own_states: Option<OwnStates<M>>,
    links: Links<'_, B>,
    inputs: Vec<FloatTensor<B>>,
) -> (Vec<M>, RunningStates<B, M>) {
    let module = match (links, devices.len()) {
        (Links::Shared, 2..) => anchored(module, inputs),
        _ => module.clone(),
    };
    let mut states = RunningStates::plan(&module, devices, own_states);
    let replicas = copies(&module, devices, bucket_size, &mut states, links);
    (replicas, states)
}

/// One copy of `module` per device, from the module or the replica's own running-state set,
/// tied to the module's parameters by `links`.
fn copies<B: ConcatBackend, M: Module<B>>(
    module: &M,
    devices: &[B::Device],
    bucket_size: usize,
    states: &mut RunningStates<B, M>,
    links: Links<'_, B>,
) -> Vec<M> {
    // The module's graph moves as it is; other copies carry plain values, from which each
    // replica then makes its leaves: a copy that stays on the module's device needs neither
    // detaching nor a transfer, one bound for another device is detached first so that its
    // transfer adds nothing to the caller's graph.
    let copy_to = |source: &M, device: &B::Device| match links {
        Links::Shared => move_coalesced(source, device, bucket_size),
        _ if broadcast::is_on(source, device) => source.clone(),
        _ => move_coalesced(&source.clone().map(&mut Detach), device, bucket_size),
    };
    let targets = match links {
        Links::Shared => HashMap::new(),
        _ => TrackedFloats::of(module),
    };
    let mut made: Vec<(&B::Device, Option<usize>, M)> = Vec::new();
    let replicas = devices
        .iter()
        .enumerate()
        .map(|(replica, device)| {
            let group = states.group(replica);
            let copy = match made.iter().find(|(d, g, _)| *d == device && *g == group) {
                Some((_, _, copy)) => copy.clone(),
                None => {
                    let copy = copy_to(states.source(module, replica), device);
                    made.push((device, group, copy.clone()));
                    copy
                }
            };
            match links {
                Links::Shared => copy,
                Links::Graphs(graphs) => copy.map(&mut Leaves {
                    graphs: Some(graphs),
                    replica,
                    targets: &targets,
                }),
                Links::Independent => copy.map(&mut Leaves {
                    graphs: None,
                    replica,
                    targets: &targets,
                }),
            }
        })
        .collect();
    states.restore(module);
    replicas
}

/// A clone of `module` whose trainable parameters are joined into one autodiff graph, for
/// replicas that add to the caller's graph from several threads (the single backward).
///
/// Every trainable parameter gets a graph node on the calling thread (a free reshape to its
/// own shape), and all these nodes are joined by one graph node that has all of them as
/// parents (no kernel runs), together with `inputs`, the tracked tensors the scatter gave the
/// replicas: the replicas' forwards then only add nodes to that one graph and never merge two
/// graphs, which Burn 0.21's graph locator can get wrong when threads race (a node registered
/// by one thread lost while another merges its graph).
fn anchored<B: ConcatBackend, M: Module<B>>(module: &M, inputs: Vec<FloatTensor<B>>) -> M {
    let mut anchor = Anchor { nodes: Vec::new() };
    let module = module.clone().map(&mut anchor);
    anchor.nodes.extend(inputs);
    if anchor.nodes.len() >= 2 {
        B::float_join_graphs(anchor.nodes);
    }
    module
}

/// Gives trainable parameters a graph node each and keeps those nodes.
struct Anchor<B: Backend> {
    nodes: Vec<FloatTensor<B>>,
}

impl<B: ConcatBackend> ModuleMapper<B> for Anchor<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let tensor = param.val();
        if !is_tracked(&tensor) || tensor.shape().num_elements() == 0 {
            return param;
        }
        param.map(|tensor| {
            let dims = tensor.dims();
            let node = tensor.reshape(dims);
            // Quantized parameters are not trained; only float nodes need joining.
            if let TensorPrimitive::Float(primitive) = node.clone().into_primitive() {
                self.nodes.push(primitive);
            }
            node
        })
    }
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

/// The module's tracked float parameters (trainable leaves, and tensors computed from them),
/// by id.
struct TrackedFloats<B: Backend> {
    found: HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: ConcatBackend> TrackedFloats<B> {
    fn of<M: Module<B>>(module: &M) -> HashMap<ParamId, TensorPrimitive<B>> {
        let mut tracked = Self {
            found: HashMap::new(),
        };
        module.visit(&mut tracked);
        tracked.found
    }
}

impl<B: ConcatBackend> ModuleVisitor<B> for TrackedFloats<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        if is_tracked(&tensor) {
            self.found.insert(param.id, tensor.into_primitive());
        }
    }
}

/// Makes a replica's copy of every trainable parameter a leaf of the replica's own graph:
/// with `graphs`, one whose gradient goes to the module's parameter; without, a fresh one.
struct Leaves<'a, B: Backend> {
    graphs: Option<&'a dyn ReplicaGraphs<B>>,
    replica: usize,
    targets: &'a HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: ConcatBackend> ModuleMapper<B> for Leaves<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(target) = self.targets.get(&param.id) else {
            return param;
        };
        let Some(graphs) = self.graphs else {
            // A new node for each replica: replicas that share a device share the copy's
            // tensors, and a graph shared between threads would be merged by Burn while
            // another replica's backward holds it (a lock-order deadlock in Burn 0.21).
            let trainable = match target {
                TensorPrimitive::Float(target) => B::float_is_require_grad(target),
                TensorPrimitive::QFloat(_) => false,
            };
            return param.map(|value| match trainable {
                true => value.detach().require_grad(),
                // Computed from a trainable leaf (not one itself): the copy too, so that the
                // replica's own step finds no gradient for it, as the bare model's does.
                false => value.detach().require_grad().mul_scalar(1.0),
            });
        };
        param.map(|value| match (value.into_primitive(), target) {
            (TensorPrimitive::Float(value), TensorPrimitive::Float(target)) => {
                Tensor::from_primitive(TensorPrimitive::Float(graphs.leaf(
                    self.replica,
                    value,
                    target,
                    Part::Whole,
                )))
            }
            (value, _) => Tensor::from_primitive(value),
        })
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
        let (replicas, _) = replicate_for_step(
            &model,
            &[device; 3],
            1 << 20,
            None,
            Links::Independent,
            Vec::new(),
        );
        let ids: Vec<_> = replicas
            .iter()
            .map(|r| r.weight.val().into_primitive().tensor().node.id)
            .collect();
        let module_id = model.weight.val().into_primitive().tensor().node.id;
        eprintln!("module {module_id:?} replicas {ids:?}");
        assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
        assert!(ids.iter().all(|id| *id != module_id));
    }
}
