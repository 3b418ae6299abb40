//! The replicas' copies of the parameters.
//!
//! A replica on the module's own device is the module itself (a clone shares its
//! parameters). A replica on another device is, for a forward, the module moved there with
//! Burn's `Module::to_device`, which is differentiable: the backward of each moved parameter
//! brings its gradient back to the parameter, where Burn's autodiff adds the replicas'
//! gradients. For a replica that runs its own backward (burn-train's `TrainStep`), it is the
//! module forked there: parameters of its own, under the same ids, whose gradients the
//! wrapper then sums (`train/combine.rs`).

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, Tensor};

/// How replicas on other devices than the module's are tied to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replicas {
    /// Moved with `to_device`: the caller's backward reaches the module's parameters.
    Tied,
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
    let home = module.devices();
    devices
        .iter()
        .map(|device| match (home.as_slice(), how) {
            ([], _) => module.clone(),
            (_, Replicas::Own) => module.clone().fork(device),
            ([only], _) if only == device => module.clone(),
            (_, Replicas::Tied) => module.clone().to_device(device),
        })
        .collect()
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
