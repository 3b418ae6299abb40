//! The replicas' copies of the parameters.
//!
//! A replica on the module's own device is the module itself (a clone shares its
//! parameters). A replica on another device is, for a forward, the module moved there as
//! Burn's `Module::to_device` moves it, differentiably: the backward brings each moved
//! parameter's gradient back to the parameter, where Burn's autodiff adds the replicas'
//! gradients. For a replica that runs its own backward (burn-train's `TrainStep`), it is the
//! module forked there as by `Module::fork`: parameters of its own, under the same ids,
//! whose gradients the wrapper then sums (`train/combine.rs`). Either way the parameters
//! travel together, in one move where the devices allow it (`transfer.rs`).

use std::time::{Duration, Instant};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor};

use crate::transfer::{Tie, move_module};

/// How replicas on other devices than the module's are tied to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replicas {
    /// Moved with `to_device`: the caller's backward reaches the module's parameters.
    Tied,
    /// Tied, for a forward that may read tensors of other graphs (a closure's captures):
    /// its replicas record in turn.
    TiedInTurn,
    /// Forked, on every device: parameters of their own (same ids), for a backward inside
    /// the replica.
    #[cfg_attr(not(feature = "train"), allow(dead_code))]
    Own,
}

/// One replica of `module` per entry of `devices`, in order, each tied to `module` by
/// Burn's differentiable `to_device` (a forward's replicas).
///
/// # Example
///
/// ```
/// use burn::module::Module;
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Device;
/// use burn_dataparallel::replicate;
///
/// let device = Device::flex().autodiff();
/// let model: Linear = LinearConfig::new(4, 2).init(&device);
/// let replicas = replicate(&model, &[device.clone(), device]);
/// assert_eq!(replicas.len(), 2);
/// assert_eq!(replicas[1].weight.id, model.weight.id);
/// ```
pub fn replicate<M: Module>(module: &M, devices: &[Device]) -> Vec<M> {
    replicas(module, devices, Replicas::Tied)
}

/// One replica of `module` per entry of `devices`, tied to it as `how` says.
pub(crate) fn replicas<M: Module>(module: &M, devices: &[Device], how: Replicas) -> Vec<M> {
    timed_replicas(module, devices, how)
        .into_iter()
        .map(|(replica, _)| replica)
        .collect()
}

/// [`replicas`], each with the time the calling thread spent making it (a copy through the
/// host holds the thread until the parameters are read; one between GPUs is only queued).
pub(crate) fn timed_replicas<M: Module>(
    module: &M,
    devices: &[Device],
    how: Replicas,
) -> Vec<(M, Duration)> {
    let home = module.devices();
    devices
        .iter()
        .map(|device| {
            let start = Instant::now();
            let replica = match (home.as_slice(), how) {
                ([], _) => module.clone(),
                ([only], Replicas::Own) if only == device => module.clone().fork(device),
                (_, Replicas::Own) => move_module(module.clone(), device, Tie::Forked),
                ([only], _) if only == device => module.clone(),
                (_, Replicas::Tied | Replicas::TiedInTurn) => {
                    move_module(module.clone(), device, Tie::Moved)
                }
            };
            (replica, start.elapsed())
        })
        .collect()
}

/// Records one operation that reads every tracked parameter of `module`, so that their
/// autodiff graphs are one graph before replicas record into it from several threads at
/// once: Burn 0.22.1 loses a step when a thread records into a graph that another thread is
/// merging away (`parallel_apply.rs`), and with every parameter in one graph, and inputs in
/// none, a replica's operations merge nothing. The operation's result is dropped; the
/// backward never reaches it.
pub(crate) fn merge_graphs<M: Module>(module: &M) {
    struct Firsts(Option<Tensor<1>>);

    impl ModuleVisitor for Firsts {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let value = param.val();
            if !value.is_tracked() || value.shape().num_elements() == 0 {
                return;
            }
            let first = value.flatten::<1>(0, D - 1).slice(0..1);
            self.0 = Some(match self.0.take() {
                Some(sum) => {
                    let first = crate::transfer::move_to(first, &sum.device());
                    sum + first
                }
                None => first,
            });
        }
    }

    let mut firsts = Firsts(None);
    module.visit(&mut firsts);
}

/// Folds the replicas' updates of `module`'s running states (batch-norm statistics) and
/// brings the states back to `device`, after replicas on other devices ran.
///
/// Burn's `RunningState` shares its value with its clones, its `to_device` moves that shared
/// value in place, and folding the threads' pending updates leaves the result on the device
/// of whichever update comes first: without this, the statistics would end on any of the
/// replicas' devices. Parameters are untouched (the synced and mapped modules are clones,
/// dropped).
pub(crate) fn bring_home<M: Module>(module: &M, device: &Device) {
    struct Home<'a>(&'a Device);

    impl ModuleMapper for Home<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            match param.is_initialized() && param.lazy_device() != *self.0 {
                true => param.map(|tensor| tensor.to_device(self.0)),
                false => param,
            }
        }
    }

    // `valid()` folds every running state's pending updates (`RunningState::sync`).
    let _ = module.valid();
    let _ = module.clone().map(&mut Home(device));
}
