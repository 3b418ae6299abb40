//! burn-train integration: under the `Learner`, the wrapper runs the model's own
//! [`TrainStep`] and [`InferenceStep`] on every replica.
//!
//! A training step scatters the batch, gives every replica a copy of the parameters as
//! leaves of its own graph, and runs the model's `TrainStep::step` on each replica's worker
//! with its shard: the model's forward, its loss (penalties, auxiliary terms and all) and its
//! backward, on the replica's device. The replicas' gradients are then combined on the
//! output device (weighted by shard size for a mean-reduced loss, see [`LossReduction`]) and
//! their outputs gathered for the metrics. `TrainStep::optimize` is the model's own too.

use std::marker::PhantomData;

use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use burn::train::{
    ClassificationOutput, InferenceStep, MultiLabelClassificationOutput, RegressionOutput,
    SequenceOutput, TrainOutput, TrainStep,
};

use crate::backend::{ConcatBackend, DataParallelBackend};
use crate::backward::ties::Path;
use crate::config::LossReduction;
use crate::config::Settings;
use crate::data_parallel::DataParallel;
use crate::data_parallel::own_states;
use crate::error::DataParallelError;
use crate::gather::{Gather, Mean, Sum};
use crate::profile::Stage;
use crate::replicate::MoveModule;
use crate::running_states::OwnStates;
use crate::scatter::Scatter;
use crate::shards::Shards;
use crate::step::{self, Applied};

mod combine;

impl<B, M> TrainStep for DataParallel<B, M>
where
    B: DataParallelBackend,
    M: TrainStep + AutodiffModule<B>,
    M::Input: Scatter<B>,
    M::Output: Gather<B> + Send,
{
    type Input = M::Input;
    type Output = M::Output;

    /// Runs the model's own training step on every replica with its shard and combines the
    /// replicas' gradients and outputs (see the module docs).
    ///
    /// With [`sync_learner_steps`](crate::DataParallelConfig::sync_learner_steps) (the
    /// default), waits for the output device before returning.
    ///
    /// # Panics
    ///
    /// When a replica's step fails or the outputs do not gather (a [`DataParallelError`]):
    /// `TrainStep` has no error channel.
    fn step(&self, item: M::Input) -> TrainOutput<M::Output> {
        let output = train_step(self, item).unwrap_or_else(|error| panic!("{error}"));
        settle::<B>(&self.settings);
        output
    }

    /// Runs the model's own `optimize` with the Learner's optimizer.
    fn optimize<B2, O>(self, optim: &mut O, lr: f64, grads: GradientsParams) -> Self
    where
        B2: AutodiffBackend,
        O: Optimizer<Self, B2>,
        Self: AutodiffModule<B2>,
    {
        let (module, mut bare) = Bare::new(self, optim);
        let module = module.optimize::<B, _>(&mut bare, lr, grads);
        bare.finish(module, optim)
    }

    /// Runs the model's own `optimize_multi` with the Learner's optimizer.
    fn optimize_multi<B2, O>(self, optim: &mut O, lr: f64, grads: MultiGradientsParams) -> Self
    where
        B2: AutodiffBackend,
        O: Optimizer<Self, B2>,
        Self: AutodiffModule<B2>,
    {
        let (module, mut bare) = Bare::new(self, optim);
        let module = module.optimize_multi::<B, _>(&mut bare, lr, grads);
        bare.finish(module, optim)
    }
}

impl<B, M> InferenceStep for DataParallel<B, M>
where
    B: ConcatBackend,
    M: InferenceStep + Module<B>,
    M::Input: Scatter<B>,
    M::Output: Gather<B> + Send,
{
    type Input = M::Input;
    type Output = M::Output;

    /// Runs the model's own inference step on every replica and gathers the outputs; with
    /// [`sync_learner_steps`](crate::DataParallelConfig::sync_learner_steps) (the default),
    /// waits for the output device before returning.
    ///
    /// # Panics
    ///
    /// When a replica's step fails or the outputs do not gather (a [`DataParallelError`]):
    /// `InferenceStep` has no error channel.
    fn step(&self, item: M::Input) -> M::Output {
        let item = step::forward(
            &self.module,
            &self.settings,
            item,
            |replica, shard| Ok::<_, std::convert::Infallible>(InferenceStep::step(replica, shard)),
            self.own_states,
            false,
        )
        .unwrap_or_else(|error| panic!("{error}"));
        settle::<B>(&self.settings);
        item
    }
}

/// Waits for the output device when the settings ask for it, before a step's item goes to
/// burn-train's metric thread ([`DataParallelConfig::sync_learner_steps`]: CubeCL 0.10 lets
/// another thread's stream read a buffer before a write queued to it has run).
///
/// [`DataParallelConfig::sync_learner_steps`]: crate::DataParallelConfig::sync_learner_steps
fn settle<B: burn::tensor::backend::Backend>(settings: &Settings<B::Device>) {
    if settings.sync_learner_steps {
        // A device that fails here fails the metric thread's read of the item too, with
        // the device's own error.
        let _ = B::sync(&settings.output_device);
    }
}

/// The wrapper's training step: the step's stages ([`step::apply`]) with the model's own
/// training step on every replica, then the replicas' gradients combined and their items
/// gathered.
fn train_step<B, M>(
    dp: &DataParallel<B, M>,
    item: M::Input,
) -> Result<TrainOutput<M::Output>, DataParallelError>
where
    B: DataParallelBackend,
    M: TrainStep + AutodiffModule<B>,
    M::Input: Scatter<B>,
    M::Output: Gather<B> + Send,
{
    let own = dp.own_states.or(Some(own_states::<B, M>));
    let replica_step = |replica: &M, input| {
        let mut output = TrainStep::step(replica, input);
        // On the replica's worker: the gradients laid out contiguously, for the combine on
        // the calling thread.
        combine::make_contiguous::<B, M>(replica, &mut output.grads);
        Ok(output)
    };
    let (step, outputs) = match step::apply(
        &dp.module,
        &dp.settings,
        item,
        Path::OwnStep,
        own,
        replica_step,
    )? {
        Applied::Direct(output) => return Ok(output),
        Applied::Replicas(step, outputs) => (step, outputs),
    };
    let (grads, items): (Vec<_>, Vec<_>) = (outputs.into_iter())
        .map(|output| (output.grads, output.item))
        .unzip();
    let weights = match dp.settings.loss_reduction {
        LossReduction::Mean => Some(step.shards.loss_shares()),
        LossReduction::Sum => None,
    };
    let grads = step.stage(Stage::Combine, || {
        combine::combine::<B, M>(&dp.module, grads, weights.as_deref())
    });
    let item = step.stage(Stage::Gather, || {
        step.tied(|| M::Output::gather(items, &step.shards))
    })?;
    Ok(TrainOutput { grads, item })
}

/// The Learner's optimizer, seen by the model's own `optimize` as an optimizer of the bare
/// model: each step wraps the model again (same parameters, same ids) and steps the wrapper.
struct Bare<B: AutodiffBackend, B2, M, O> {
    optim: O,
    settings: Settings<B::Device>,
    own_states: Option<OwnStates<M>>,
    relocate: Option<MoveModule<M, B::Device>>,
    _backend: PhantomData<B2>,
}

impl<B: AutodiffBackend, B2, M, O: Clone> Clone for Bare<B, B2, M, O> {
    fn clone(&self) -> Self {
        Self {
            optim: self.optim.clone(),
            settings: self.settings.clone(),
            own_states: self.own_states,
            relocate: self.relocate,
            _backend: PhantomData,
        }
    }
}

impl<B: AutodiffBackend, B2, M, O: Clone> Bare<B, B2, M, O> {
    fn new(dp: DataParallel<B, M>, optim: &O) -> (M, Self) {
        let bare = Self {
            optim: optim.clone(),
            settings: dp.settings,
            own_states: dp.own_states,
            relocate: dp.relocate,
            _backend: PhantomData,
        };
        (dp.module, bare)
    }

    fn wrap(&self, module: M) -> DataParallel<B, M> {
        DataParallel {
            module,
            settings: self.settings.clone(),
            own_states: self.own_states,
            relocate: self.relocate,
        }
    }

    /// The wrapper of `module`, with the optimizer's state written back to `optim`.
    fn finish(self, module: M, optim: &mut O) -> DataParallel<B, M> {
        let dp = self.wrap(module);
        *optim = self.optim;
        dp
    }
}

impl<B, B2, M, O> Optimizer<M, B> for Bare<B, B2, M, O>
where
    B: AutodiffBackend,
    B2: AutodiffBackend,
    M: AutodiffModule<B>,
    DataParallel<B, M>: AutodiffModule<B2>,
    O: Optimizer<DataParallel<B, M>, B2>,
{
    /// The Learner saves the optimizer's own record, not this view's.
    type Record = ();

    fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        let dp = self.wrap(module);
        self.optim.step(lr, dp, grads).module
    }

    fn step_multi(&mut self, lr: f64, module: M, grads: MultiGradientsParams) -> M {
        let dp = self.wrap(module);
        self.optim.step_multi(lr, dp, grads).module
    }

    fn to_record(&self) -> Self::Record {}

    fn load_record(self, _record: Self::Record) -> Self {
        self
    }
}

/// Gathers per-replica losses as the shards' [`LossReduction`] says: the whole-batch mean
/// (weighted by shard size) or sum.
fn gather_loss<B: ConcatBackend>(
    losses: Vec<Tensor<B, 1>>,
    shards: &Shards<B>,
) -> Result<Tensor<B, 1>, DataParallelError> {
    match shards.loss_reduction() {
        LossReduction::Mean => Ok(Mean::gather(losses.into_iter().map(Mean).collect(), shards)?.0),
        LossReduction::Sum => Ok(Sum::gather(losses.into_iter().map(Sum).collect(), shards)?.0),
    }
}

/// Implements [`Gather`] for a burn-train output type: `loss` is a mean, the other fields
/// are gathered as they are.
macro_rules! train_output {
    ($name:ident { $($field:ident),+ }) => {
        impl<B: ConcatBackend> Gather<B> for $name<B> {
            fn gather(outputs: Vec<Self>, shards: &Shards<B>) -> Result<Self, DataParallelError> {
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
