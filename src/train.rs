//! burn-train integration: a [`DataParallel`] is a model the `Learner` can train.
//!
//! The wrapped model implements [`Forward`] with the output of its training step (for example
//! [`ClassificationOutput`]); the wrapper's [`TrainStep`] runs that forward on every replica,
//! gathers the outputs, and runs the backward pass on the gathered loss, and its
//! [`InferenceStep`] runs the forward alone. burn-train's output types gather their loss as a
//! shard-size-weighted mean and concatenate the rest.

use burn::module::AutodiffModule;
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::train::{
    ClassificationOutput, InferenceStep, ItemLazy, MultiLabelClassificationOutput,
    RegressionOutput, SequenceOutput, TrainOutput, TrainStep,
};

use std::convert::Infallible;

use crate::data_parallel::own_states;
use crate::kernels::ConcatBackend;
use crate::{DataParallel, DataParallelError, Forward, Gather, Mean, Shards};

/// The output of a training forward: it holds the loss to run the backward pass from.
///
/// Implemented for burn-train's output types; implement it for a custom output of a model's
/// [`Forward`] to train that model through [`TrainStep`].
pub trait StepOutput<B: Backend> {
    /// The loss, reduced to one value.
    fn loss(&self) -> Tensor<B, 1>;
}

impl<B, M> TrainStep for DataParallel<B, M>
where
    B: AutodiffBackend + ConcatBackend,
    M: Forward<B> + AutodiffModule<B>,
    M::Input: 'static,
    M::Output: StepOutput<B> + ItemLazy + 'static,
{
    type Input = M::Input;
    type Output = M::Output;

    /// Runs the forward on every replica, gathers the outputs and computes the gradients of
    /// the gathered loss.
    ///
    /// # Panics
    ///
    /// When the forward fails (a [`DataParallelError`]): `TrainStep` has no error channel.
    fn step(&self, item: M::Input) -> TrainOutput<M::Output> {
        let own_states = self.own_states.or(Some(own_states::<B, M>));
        let output = self
            .run(
                item,
                |replica, shard| Ok::<_, Infallible>(Forward::forward(replica, shard)),
                own_states,
            )
            .unwrap_or_else(|error| panic!("{error}"));
        let grads = output.loss().backward();
        TrainOutput::new(self, grads, output)
    }
}

impl<B, M> InferenceStep for DataParallel<B, M>
where
    B: ConcatBackend,
    M: Forward<B> + Module<B>,
    M::Input: 'static,
    M::Output: ItemLazy + 'static,
{
    type Input = M::Input;
    type Output = M::Output;

    /// Runs the forward on every replica and gathers the outputs.
    ///
    /// # Panics
    ///
    /// When the forward fails (a [`DataParallelError`]): `InferenceStep` has no error channel.
    fn step(&self, item: M::Input) -> M::Output {
        self.forward(item)
    }
}

/// Gathers per-replica losses as the whole-batch mean.
fn gather_loss<B: ConcatBackend>(
    losses: Vec<Tensor<B, 1>>,
    shards: &Shards<B>,
) -> Result<Tensor<B, 1>, DataParallelError> {
    let losses = losses.into_iter().map(Mean).collect();
    Ok(Mean::gather(losses, shards)?.0)
}

/// Implements [`Gather`] and [`StepOutput`] for a burn-train output type: `loss` is a mean,
/// the other fields are gathered as they are.
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

        impl<B: Backend> StepOutput<B> for $name<B> {
            fn loss(&self) -> Tensor<B, 1> {
                self.loss.clone()
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
