//! What a [`DataParallel`] holds and was built with, and its step profile: the accessors,
//! apart from the construction (`mod.rs`) and the forwards (`forwards.rs`).

use burn::module::Module;
use burn::tensor::backend::Backend;

use super::DataParallel;
use crate::config::LossReduction;
use crate::profile::StepProfile;

impl<B: Backend, M: Module<B>> DataParallel<B, M> {
    /// The wrapped module, which holds the parameters.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, to change between steps or trainings: freeze a layer, load other
    /// parameters, swap a submodule. The next step replicates it as it then is; keep its
    /// parameters on the output device ([`output_device`](Self::output_device)).
    ///
    /// # Example
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::module::Module;
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn_dataparallel::DataParallel;
    ///
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let model: Linear<B> = LinearConfig::new(4, 2).init(&device);
    /// let mut dp = DataParallel::new(model, vec![device; 2]).unwrap();
    /// // Freeze the layer between two trainings.
    /// let frozen = dp.module().clone().no_grad();
    /// *dp.module_mut() = frozen;
    /// assert!(!dp.module().weight.val().is_require_grad());
    /// ```
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// Unwraps the module, for saving, inference or further training without the wrapper.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The devices the replicas run on, one entry per replica. (Burn's
    /// [`Module::devices`] gives where the parameters are: the output device.)
    pub fn replica_devices(&self) -> &[B::Device] {
        &self.settings.devices
    }

    /// The device where outputs are gathered and the parameters live.
    pub fn output_device(&self) -> &B::Device {
        &self.settings.output_device
    }

    /// The dimension inputs are split along and outputs concatenated along.
    pub fn dim(&self) -> usize {
        self.settings.dim
    }

    /// The relative share of the batch given to each device, if set.
    pub fn shard_weights(&self) -> Option<&[f64]> {
        self.settings.shard_weights.as_deref()
    }

    /// With [`adaptive_shards`](crate::DataParallelConfig::adaptive_shards), the shares of the
    /// batch the next step gives each device (summing to one), the steps measured so far
    /// folded in; `None` without.
    pub fn adaptive_weights(&self) -> Option<Vec<f64>> {
        let balancer = self.settings.balancer.as_ref()?;
        Some(crate::balance::lock(balancer).weights())
    }

    /// Whether each replica's backward is to run on its own worker thread under autodiff
    /// ([`DataParallelConfig::parallel_backward`](crate::DataParallelConfig::parallel_backward);
    /// backends without
    /// [`ReplicaOps::concurrent_backward`](crate::ReplicaOps::concurrent_backward) run it
    /// on the calling thread regardless).
    pub fn parallel_backward(&self) -> bool {
        self.settings.parallel_backward
    }

    /// How the model's own training step reduces its loss
    /// ([`DataParallelConfig::loss_reduction`](crate::DataParallelConfig::loss_reduction)).
    pub fn loss_reduction(&self) -> LossReduction {
        self.settings.loss_reduction
    }

    /// Whether the steps run under burn-train's `Learner` wait for the output device before
    /// handing back their item
    /// ([`DataParallelConfig::sync_learner_steps`](crate::DataParallelConfig::sync_learner_steps)).
    pub fn sync_learner_steps(&self) -> bool {
        self.settings.sync_learner_steps
    }

    /// The largest coalesced parameter transfer to a replica on another device, in bytes.
    pub fn bucket_size(&self) -> usize {
        self.settings.bucket_size
    }

    /// Turns the per-step [`StepProfile`] on or off (off by default; shared with clones of the
    /// wrapper and with its `valid()` copy).
    ///
    /// While on, each stage ends by synchronising the devices it used, so that its time is
    /// the device's: steps run slower and the stages no longer overlap. While off, a forward
    /// pays one atomic load.
    pub fn set_profiling(&self, enabled: bool) {
        self.settings.profiler.set_enabled(enabled);
    }

    /// Whether steps are being profiled.
    pub fn is_profiling(&self) -> bool {
        self.settings.profiler.is_enabled()
    }

    /// The profile of the last forward taken while profiling was on, including the gradient
    /// transfers of its backward once that has run; `None` before the first such forward.
    pub fn profile(&self) -> Option<StepProfile> {
        self.settings.profiler.last()
    }
}
