//! burn-train's `Learner` path: the wrapper as a [`TrainStep`] and an [`InferenceStep`].
//!
//! Every replica runs the model's own training step on its shard (its forward, loss and
//! backward, on parameters of its own: `Replicas::Own`); the wrapper sums the replicas'
//! gradients into one set for the wrapped module's parameters (`combine.rs`), weighted by
//! the shards' shares of the loss, and gathers their items. The optimizer step is the
//! model's own `optimize`.

use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::optim::{GradientsParams, ModuleOptimizer, MultiGradientsParams};
use burn::tensor::Tensor;
use burn::train::{
    ClassificationOutput, InferenceStep, MultiLabelClassificationOutput, RegressionOutput,
    SequenceOutput, TrainOutput, TrainStep,
};

use crate::config::LossReduction;
use crate::data_parallel::DataParallel;
use crate::error::DataParallelError;
use crate::gather::{Gather, Mean, Sum};
use crate::profile;
use crate::replicate::Replicas;
use crate::scatter::Scatter;
use crate::shards::Shards;
use crate::step::{self, Applied, Replicated};

mod combine;

impl<M> TrainStep for DataParallel<M>
where
    M: TrainStep + Module,
    M::Input: Scatter,
    M::Output: Gather + Send,
{
    type Input = M::Input;
    type Output = M::Output;

    /// The model's own training step on every shard, the gradients summed and the items
    /// gathered; with [`sync_learner_steps`](crate::DataParallelConfig::sync_learner_steps)
    /// (the default), the output device waited for before the item is handed back.
    ///
    /// # Panics
    ///
    /// With the [`DataParallelError`]'s message where a forward would return it
    /// (burn-train's steps have no error channel).
    fn step(&self, item: M::Input) -> TrainOutput<M::Output> {
        let output = train_step(self, item).unwrap_or_else(|error| panic!("{error}"));
        settle(self);
        output
    }

    fn optimize(
        self,
        optim: &mut ModuleOptimizer,
        lr_module: ModuleLearningRate,
        grads: GradientsParams,
    ) -> Self {
        let DataParallel { module, settings } = self;
        let module = module.optimize(optim, lr_module, grads);
        DataParallel { module, settings }
    }

    fn optimize_multi(
        self,
        optim: &mut ModuleOptimizer,
        lr_module: ModuleLearningRate,
        grads: MultiGradientsParams,
    ) -> Self {
        let DataParallel { module, settings } = self;
        let module = module.optimize_multi(optim, lr_module, grads);
        DataParallel { module, settings }
    }
}

impl<M> InferenceStep for DataParallel<M>
where
    M: InferenceStep + Module,
    M::Input: Scatter,
    M::Output: Gather + Send,
{
    type Input = M::Input;
    type Output = M::Output;

    /// The model's own inference step on every shard, the items gathered; with
    /// [`sync_learner_steps`](crate::DataParallelConfig::sync_learner_steps) (the default),
    /// the output device waited for before the item is handed back.
    ///
    /// # Panics
    ///
    /// With the [`DataParallelError`]'s message where a forward would return it.
    fn step(&self, item: M::Input) -> M::Output {
        let step = |replica: &M, shard| Ok(InferenceStep::step(replica, shard));
        let output = step::forward(&self.module, &self.settings, item, step, false)
            .unwrap_or_else(|error| panic!("{error}"));
        settle(self);
        output
    }
}

/// Waits for the output device before a step's item goes to burn-train's metric thread,
/// where the settings ask for it
/// ([`sync_learner_steps`](crate::DataParallelConfig::sync_learner_steps)).
fn settle<M>(dp: &DataParallel<M>) {
    if dp.settings.sync_learner_steps {
        // A device that fails here fails the metric thread's read of the item too, with the
        // device's own error.
        let _ = dp.settings.output_device.sync();
    }
}

/// The wrapper's training step: the model's own on every shard, combined.
fn train_step<M>(
    dp: &DataParallel<M>,
    item: M::Input,
) -> Result<TrainOutput<M::Output>, DataParallelError>
where
    M: TrainStep + Module,
    M::Input: Scatter,
    M::Output: Gather + Send,
{
    step::on_devices(&dp.settings, || combined_step(dp, item))
}

/// [`train_step`]'s work: the replicas' steps, their gradients summed, their items gathered.
fn combined_step<M>(
    dp: &DataParallel<M>,
    item: M::Input,
) -> Result<TrainOutput<M::Output>, DataParallelError>
where
    M: TrainStep + Module,
    M::Input: Scatter,
    M::Output: Gather + Send,
{
    let replica_step = |replica: &M, shard| Ok(TrainStep::step(replica, shard));
    let Replicated {
        shards,
        outputs,
        mut recording,
    } = match step::apply(&dp.module, &dp.settings, item, Replicas::Own, replica_step)? {
        Applied::Direct(output) => return Ok(output),
        Applied::Replicas(replicated) => *replicated,
    };
    let (grads, items): (Vec<_>, Vec<_>) = (outputs.into_iter())
        .map(|output| (output.grads, output.item))
        .unzip();
    let weights = match dp.settings.loss_reduction {
        LossReduction::Mean => Some(shards.loss_shares()),
        LossReduction::Sum => None,
    };
    let device = shards.output_device();
    let grads = combine::combine(&dp.module, grads, weights.as_deref(), device);
    profile::stage(recording.as_mut(), |p| &mut p.combine);
    let item = M::Output::gather(items, &shards)?;
    profile::stage(recording.as_mut(), |p| &mut p.gather);
    dp.settings.profiler.keep(recording);
    Ok(TrainOutput { grads, item })
}

/// The replicas' losses combined as the wrapper's loss reduction says.
fn gather_loss(losses: Vec<Tensor<1>>, shards: &Shards) -> Result<Tensor<1>, DataParallelError> {
    match shards.loss_reduction() {
        LossReduction::Mean => Ok(Mean::gather(losses.into_iter().map(Mean).collect(), shards)?.0),
        LossReduction::Sum => Ok(Sum::gather(losses.into_iter().map(Sum).collect(), shards)?.0),
    }
}

/// [`Gather`] for a burn-train output: its loss by the loss reduction, its other fields
/// concatenated.
macro_rules! train_output {
    ($name:ident { $($field:ident),+ }) => {
        impl Gather for $name {
            fn gather(outputs: Vec<Self>, shards: &Shards) -> Result<Self, DataParallelError> {
                let mut loss = Vec::with_capacity(outputs.len());
                $(let mut $field = Vec::with_capacity(outputs.len());)+
                for output in outputs {
                    loss.push(output.loss);
                    $($field.push(output.$field);)+
                }
                Ok(Self {
                    loss: gather_loss(loss, shards)?,
                    $($field: Gather::gather($field, shards)?,)+
                })
            }
        }
    };
}

train_output!(ClassificationOutput { output, targets });
train_output!(MultiLabelClassificationOutput { output, targets });
train_output!(RegressionOutput { output, targets });
train_output!(SequenceOutput {
    logits,
    predictions,
    targets
});
