//! burn-train's steps through the wrapper: the model's own `TrainStep`, `optimize` and
//! `InferenceStep` on every shard, against the bare model's.

use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Tensor};
use burn::train::{InferenceStep, RegressionOutput, TrainOutput, TrainStep};
use burn_dataparallel::{DataParallel, impl_scatter};

use super::models::{Mlp, batch};
use crate::common::{assert_close, assert_same_params};

#[derive(Debug, Clone)]
pub struct Batch {
    inputs: Tensor<2>,
    targets: Tensor<2>,
}

impl Batch {
    pub fn new(inputs: Tensor<2>, targets: Tensor<2>) -> Self {
        Self { inputs, targets }
    }
}

impl_scatter!(Batch { inputs, targets });

/// The perceptron as a regressor with burn-train's steps.
#[derive(Module, Debug)]
pub struct Regressor {
    mlp: Mlp,
}

impl Regressor {
    pub fn new(mlp: Mlp) -> Self {
        Self { mlp }
    }

    fn output(&self, batch: Batch) -> RegressionOutput {
        let output = self.mlp.forward(batch.inputs);
        let loss = MseLoss::new().forward(output.clone(), batch.targets.clone(), Reduction::Mean);
        RegressionOutput {
            loss,
            output,
            targets: batch.targets,
        }
    }
}

impl TrainStep for Regressor {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> TrainOutput<RegressionOutput> {
        let item = self.output(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl InferenceStep for Regressor {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> RegressionOutput {
        self.output(batch)
    }
}

fn batches(device: &Device) -> Vec<Batch> {
    [7, 9, 4]
        .into_iter()
        .map(|rows| {
            let (inputs, targets) = batch(rows, device);
            Batch { inputs, targets }
        })
        .collect()
}

/// Trains `bare` and a wrapper of it over `devices` side by side, each batch the model's
/// `TrainStep::step` then its own `optimize` (SGD at `lr`), `check`ing each step's wrapped
/// output against the bare one and the parameters after every step; the wrapper.
fn train_beside<M>(
    mut bare: M,
    devices: &[Device],
    lr: f64,
    check: impl Fn(&TrainOutput<RegressionOutput>, &TrainOutput<RegressionOutput>),
) -> DataParallel<M>
where
    M: TrainStep<Input = Batch, Output = RegressionOutput> + Module,
{
    let mut dp = DataParallel::new(bare.clone(), devices.to_vec()).unwrap();
    let mut bare_optim: ModuleOptimizer = SgdConfig::new().init();
    let mut dp_optim: ModuleOptimizer = SgdConfig::new().init();
    for batch in batches(&devices[0]) {
        let expected = TrainStep::step(&bare, batch.clone());
        let found = TrainStep::step(&dp, batch);
        check(&found, &expected);
        bare = bare.optimize(&mut bare_optim, lr.into(), expected.grads);
        dp = dp.optimize(&mut dp_optim, lr.into(), found.grads);
        assert_same_params(dp.module(), &bare, 1e-5);
    }
    dp
}

/// Three training steps, each the model's `TrainStep::step` then its `optimize`, wrapped
/// and bare: the same items and the same parameters.
pub fn train_steps_match_the_bare_model(devices: &[Device]) {
    let device = &devices[0];
    let bare = Regressor {
        mlp: Mlp::new(device),
    };
    let dp = train_beside(bare, devices, 0.1, |found, expected| {
        assert_eq!(found.grads.len(), expected.grads.len(), "gradients");
        let (found, expected) = (&found.item, &expected.item);
        assert_close(found.loss.clone(), expected.loss.clone(), 1e-5, "loss");
        assert_close(
            found.output.clone(),
            expected.output.clone(),
            1e-5,
            "output",
        );
    });
    assert_eq!(dp.devices(), vec![device.clone()]);
}

/// The model's `InferenceStep` on every shard of its `valid()` copy.
pub fn inference_steps_match_the_bare_model(devices: &[Device]) {
    let device = &devices[0];
    let bare = Regressor {
        mlp: Mlp::new(device),
    };
    let dp = DataParallel::new(bare.clone(), devices.to_vec()).unwrap();
    let (bare, dp) = (bare.valid(), dp.valid());
    for batch in batches(device) {
        let expected = InferenceStep::step(&bare, batch.clone());
        let found = InferenceStep::step(&dp, batch);
        assert_close(found.loss, expected.loss, 1e-5, "loss");
        assert_close(found.output, expected.output, 1e-5, "output");
    }
}

/// A model whose own `optimize` does more than the optimizer's step (keeps its weights in
/// [-0.1, 0.1]): the wrapper runs it.
#[derive(Module, Debug)]
pub struct Clamped {
    regressor: Regressor,
}

impl TrainStep for Clamped {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> TrainOutput<RegressionOutput> {
        let item = self.regressor.output(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }

    fn optimize(
        self,
        optim: &mut ModuleOptimizer,
        lr: burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate,
        grads: burn::optim::GradientsParams,
    ) -> Self {
        let stepped: Self = optim.step(lr, self, grads);
        stepped.map(&mut ClampAll)
    }
}

struct ClampAll;

impl burn::module::ModuleMapper for ClampAll {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<D>>,
    ) -> burn::module::Param<Tensor<D>> {
        param.map(|t| t.clamp(-0.1, 0.1).detach().require_grad())
    }
}

pub fn the_model_s_own_optimize_runs(devices: &[Device]) {
    let bare = Clamped {
        regressor: Regressor {
            mlp: Mlp::new(&devices[0]),
        },
    };
    let dp = train_beside(bare, devices, 0.5, |_, _| {});
    let largest = crate::common::params(dp.module())
        .into_iter()
        .flat_map(crate::common::values)
        .fold(0.0f32, |m, v| m.max(v.abs()));
    // 0.1 rounded to a 16-bit float (`DATAPARALLEL_FLOAT`) may lie above 0.1.
    assert!(largest <= 0.1 * 1.001, "largest weight {largest}");
}

crate::on_every_device_list!(
    train_steps_match_the_bare_model => super::train_steps_match_the_bare_model,
    inference_steps_match_the_bare_model => super::inference_steps_match_the_bare_model,
    the_model_s_own_optimize_runs => super::the_model_s_own_optimize_runs,
);
