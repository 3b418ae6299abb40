//! Under burn-train's `Learner`, the wrapper runs the model's own `TrainStep` (and
//! `optimize`) on every replica: custom steps (a weight penalty, a scaled loss, an auxiliary
//! loss from a second head, a gradient zeroed before returning) train exactly like the bare
//! Learner, on uneven batches (7 items over 3 replicas, a last batch of 1), with Adam and SGD;
//! parameters and every logged metric agree.

use std::path::Path;

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::{CrossEntropyLossConfig, MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, RegressionOutput, TrainOutput, TrainStep,
};
use burn_dataparallel::{DataParallel, DataParallelBackend, DataParallelConfig, LossReduction};

use crate::common::*;
use crate::learner::{ImageBatch, ImageBatcher, items, quiet_training};

/// What the model's own training step adds to a plain classification step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Custom {
    /// The loss plus `0.05 * |body.weight|^2`.
    Penalty,
    /// The loss times 3.
    Scaled,
    /// The loss plus half the mean squared error of a second head predicting the label.
    Auxiliary,
    /// The body's bias gradient set to zeros before returning.
    ZeroedBias,
    /// A sum-reduced loss (for `LossReduction::Sum`).
    SumReduced,
}

#[derive(Module, Debug)]
pub struct Heads<B: Backend> {
    pub body: Linear<B>,
    pub head: Linear<B>,
    pub aux: Linear<B>,
    #[module(skip)]
    pub custom: Custom,
    /// Waits for the device after each step, so that the item is written before burn-train's
    /// metric thread reads it (see [`Heads::synced`]).
    #[module(skip)]
    pub synced: bool,
    /// Where each validation step notes what it computed ([`Checked`]), read on the host
    /// after the step: the third reference for the logged accuracy.
    #[module(skip)]
    pub checked: Option<u64>,
}

/// What one validation step (or, under the wrapper, one replica's shard of it) computed, read
/// on the host: its items, how many it got right and the smallest gap between an item's two
/// largest logits, relative to the largest logit's magnitude.
#[derive(Debug, Clone, Copy)]
struct Checked {
    items: usize,
    correct: usize,
    closest: f32,
}

/// Every validation step's [`Checked`], by the token of the model that ran it.
static CHECKED: std::sync::Mutex<Vec<(u64, Checked)>> = std::sync::Mutex::new(Vec::new());

impl Checked {
    /// What `item` holds.
    fn of<B: Backend>(item: &ClassificationOutput<B>) -> Self {
        let [items, classes] = item.output.dims();
        let logits = values(item.output.clone());
        let targets: Vec<i64> = (item.targets.clone().into_data().convert::<i64>())
            .to_vec()
            .expect("targets");
        let mut correct = 0;
        let mut closest = f32::INFINITY;
        for (row, target) in logits.chunks(classes).zip(targets) {
            let mut order: Vec<usize> = (0..classes).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            correct += usize::from(order[0] as i64 == target);
            let scale = row.iter().fold(0f32, |m, x| m.max(x.abs())) + 0.1;
            closest = closest.min((row[order[0]] - row[order[1]]) / scale);
        }
        Self {
            items,
            correct,
            closest,
        }
    }

    /// The steps `token`'s model checked, grouped into the validation batches of `sizes` (a
    /// wrapper's replicas note one shard each; batches run one after the other).
    fn batches(token: u64, sizes: &[usize]) -> Vec<Checked> {
        let noted: Vec<Checked> = (CHECKED.lock().unwrap().iter())
            .filter(|(t, _)| *t == token)
            .map(|(_, c)| *c)
            .collect();
        let mut parts = noted.into_iter();
        let batches = sizes.iter().map(|&size| {
            let mut batch = Checked {
                items: 0,
                correct: 0,
                closest: f32::INFINITY,
            };
            while batch.items < size {
                let part = parts.next().expect("every batch noted");
                batch.items += part.items;
                batch.correct += part.correct;
                batch.closest = batch.closest.min(part.closest);
            }
            assert_eq!(batch.items, size, "shards add up to the batch");
            batch
        });
        batches.collect()
    }

    /// The batch's accuracy, in percent, as burn-train logs it.
    fn accuracy(&self) -> f32 {
        100.0 * self.correct as f32 / self.items as f32
    }
}

impl<B: Backend> Heads<B> {
    pub fn new(custom: Custom, device: &B::Device) -> Self {
        Self {
            body: LinearConfig::new(108, 12).init(device),
            head: LinearConfig::new(12, 3).init(device),
            aux: LinearConfig::new(12, 1).init(device),
            custom,
            synced: false,
            checked: None,
        }
    }

    /// The model noting every validation step's results under `token` ([`Checked`]).
    pub fn checked(mut self, token: u64) -> Self {
        self.checked = Some(token);
        self
    }

    /// The model waiting for its device at the end of every step, as the wrapper does by
    /// default (`sync_learner_steps`). The bare Learner's reference needs it on CUDA with
    /// `CubeBackend`: burn-train 0.21 reads every item on a thread of its own, hence on
    /// another CubeCL stream, which waits only for buffers allocated after its last wait
    /// (`upstream/cross_stream/`, `late`); in 14 of 88 runs of this file (one H200,
    /// 2026-12-02) a logged value of an epoch's last batch differed while the parameters were
    /// right, in 7 of them the bare Learner's loss negative, which it cannot be; with CubeCL on
    /// one stream per device, 0 of 104 runs; with both sides synced, 0 of 48 (2026-12-03).
    pub fn synced(mut self) -> Self {
        self.synced = true;
        self
    }

    /// Waits for `device` when [`Heads::synced`].
    fn sync_if_asked(&self, device: &B::Device) {
        if self.synced {
            B::sync(device).expect("the device finishes the step");
        }
    }

    /// The loss this model's step takes the backward of, and its classification output.
    fn classify(&self, batch: ImageBatch<B>) -> (Tensor<B, 1>, ClassificationOutput<B>) {
        let [n, ..] = batch.images.dims();
        let features = self.body.forward(batch.images.reshape([n, 108])).tanh();
        let logits = self.head.forward(features.clone());
        let targets = batch.targets;
        let mean = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), targets.clone());
        let loss = match self.custom {
            Custom::Penalty => mean + self.body.weight.val().powi_scalar(2).sum().mul_scalar(0.05),
            Custom::Scaled => mean.mul_scalar(3.0),
            Custom::Auxiliary => {
                let label = targets.clone().float().reshape([n, 1]);
                let aux =
                    MseLoss::new().forward(self.aux.forward(features), label, Reduction::Mean);
                mean + aux.mul_scalar(0.5)
            }
            Custom::ZeroedBias => mean,
            // Summed over the batch: n times the mean.
            Custom::SumReduced => mean.mul_scalar(n as f64),
        };
        (
            loss.clone(),
            ClassificationOutput::new(loss, logits, targets),
        )
    }
}

impl<B: AutodiffBackend> TrainStep for Heads<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let (loss, item) = self.classify(batch);
        let device = loss.device();
        let mut grads = GradientsParams::from_grads(loss.backward(), self);
        if self.custom == Custom::ZeroedBias {
            let bias = self.body.bias.as_ref().expect("a bias");
            let zeros = bias.val().inner().zeros_like();
            grads.remove::<B::InnerBackend, 1>(bias.id);
            grads.register::<B::InnerBackend, 1>(bias.id, zeros);
        }
        self.sync_if_asked(&device);
        TrainOutput { grads, item }
    }

    /// The optimizer's step, then every weight of the head clamped to `[-0.2, 0.2]`.
    fn optimize<B2, O>(self, optim: &mut O, lr: f64, grads: GradientsParams) -> Self
    where
        B2: AutodiffBackend,
        O: Optimizer<Self, B2>,
        Self: AutodiffModule<B2>,
    {
        let mut model = optim.step(lr, self, grads);
        model.head.weight = model.head.weight.map(|w| w.clamp(-0.2, 0.2));
        model
    }
}

impl<B: Backend> InferenceStep for Heads<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        let item = self.classify(batch).1;
        self.sync_if_asked(&item.loss.device());
        if let Some(token) = self.checked {
            CHECKED.lock().unwrap().push((token, Checked::of(&item)));
        }
        item
    }
}

#[derive(Debug, Clone, Copy)]
enum Optim {
    Adam,
    Sgd,
}

/// Trains `$model` for three epochs with `$optim` at `$lr` (22 training items in batches of
/// 7, the last of 1; 10 validation items), the losses and the accuracy logged into `$dir`.
macro_rules! train {
    ($model:expr, $optim:expr, $lr:expr, $dir:expr, $device:expr) => {{
        let train = DataLoaderBuilder::new(ImageBatcher)
            .batch_size(7)
            .set_device($device.clone())
            .build(InMemDataset::new(items(22, 4)));
        let valid = DataLoaderBuilder::new(ImageBatcher)
            .batch_size(7)
            .set_device($device.clone())
            .build(InMemDataset::new(items(10, 5)));
        quiet_training!($dir, train, valid, 3)
            .metric_train_numeric(LossMetric::new())
            .metric_valid_numeric(LossMetric::new())
            .metric_valid_numeric(AccuracyMetric::new())
            .launch(Learner::new($model, $optim, $lr))
            .model
    }};
}

/// Every number of every metric log under `dir`, file by file (sorted paths).
fn logged(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).expect("a directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a log");
            let numbers = text
                .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
                .filter_map(|word| word.parse::<f32>().ok())
                .collect();
            let name = path
                .strip_prefix(dir)
                .expect("inside")
                .display()
                .to_string();
            (name, numbers)
        })
        .collect()
}

fn custom_steps_match_the_bare_learner<B: DataParallelBackend>(custom: Custom, optim: Optim) {
    steps_match_the_bare_learner::<B>(custom, optim, true)
}

/// With `sync_learner_steps(false)` the wrapper's steps hand their items back without waiting
/// for the device: the parameters are the bare Learner's all the same (the logs are not
/// compared: on CUDA, burn-train's metric thread may read such an item early).
fn unsynced_items_train_as_the_bare_learner<B: DataParallelBackend>() {
    steps_match_the_bare_learner::<B>(Custom::Penalty, Optim::Sgd, false)
}

fn steps_match_the_bare_learner<B: DataParallelBackend>(
    custom: Custom,
    optim: Optim,
    sync_items: bool,
) {
    if let Optim::Adam = optim {
        relax_for_adam();
    }
    let device = B::Device::default();
    let reduction = match custom {
        Custom::SumReduced => LossReduction::Sum,
        _ => LossReduction::Mean,
    };
    let (dp_token, bare_token) = (thread_token(), thread_token());
    let dp = DataParallelConfig::new()
        .with_loss_reduction(reduction)
        .with_sync_learner_steps(sync_items)
        .init(
            Heads::<B>::new(custom, &device).checked(dp_token),
            devices::<B>(3),
        )
        .unwrap();
    assert_eq!(dp.sync_learner_steps(), sync_items);
    let bare = Heads::<B>::new(custom, &device)
        .synced()
        .checked(bare_token)
        .load_record(dp.module().clone().into_record());
    let dir = tempfile::tempdir().unwrap();
    let (bare_dir, dp_dir) = (dir.path().join("bare"), dir.path().join("wrapped"));
    let (trained_bare, trained_dp) = match optim {
        Optim::Adam => (
            train!(bare, adam().init(), 2e-2, &bare_dir, device),
            train!(dp, adam().init(), 2e-2, &dp_dir, device),
        ),
        Optim::Sgd => (
            train!(bare, SgdConfig::new().init(), 5e-2, &bare_dir, device),
            train!(dp, SgdConfig::new().init(), 5e-2, &dp_dir, device),
        ),
    };
    for (a, e) in param_values(&trained_dp)
        .iter()
        .zip(&param_values(&trained_bare))
    {
        assert_close(
            a,
            e,
            &format!("{custom:?} with {optim:?}: parameters after 3 epochs"),
        );
    }
    if !sync_items {
        return;
    }
    let (bare_logs, dp_logs) = (logged(&bare_dir), logged(&dp_dir));
    assert!(!bare_logs.is_empty(), "the bare Learner logged its metrics");
    assert_eq!(
        dp_logs
            .iter()
            .map(|(n, v)| (n, v.len()))
            .collect::<Vec<_>>(),
        bare_logs
            .iter()
            .map(|(n, v)| (n, v.len()))
            .collect::<Vec<_>>(),
        "the same metric logs"
    );
    // Every log compared before failing, each difference printed, so that a failure shows
    // which side is off (on CUDA, burn-train's metric thread has logged wrong values: see
    // `Heads::synced`).
    let differing: Vec<&String> = (dp_logs.iter().zip(&bare_logs))
        .filter_map(|((name, actual), (_, expected))| {
            let what =
                format!("{custom:?} with {optim:?}: {name} (actual: wrapped, expected: bare)");
            std::panic::catch_unwind(|| assert_close(actual, expected, &what))
                .err()
                .map(|_| name)
        })
        .collect();
    let checked = |token| Checked::batches(token, &VALID_BATCHES.repeat(EPOCHS));
    let (dp_checked, bare_checked) = (checked(dp_token), checked(bare_token));
    let unexplained: Vec<&&String> = (differing.iter())
        .filter(|name| !accuracy_tie(name, &dp_logs, &bare_logs, &dp_checked, &bare_checked))
        .collect();
    assert!(
        unexplained.is_empty(),
        "metric logs that differ, each printed above: {unexplained:?}"
    );
}

/// The validation batches of an epoch of `train!`, and its epochs.
const VALID_BATCHES: [usize; 2] = [7, 3];
const EPOCHS: usize = 3;

/// Whether the accuracy log `name` differs between the wrapped and the bare Learner only
/// because one of its batches holds an item whose two largest logits are within the test's
/// tolerance of each other on both sides, so that rounding decides its class, while each side
/// logged what its own steps computed (the third reference: [`Checked`], read on the host
/// after each step). Prints what it finds.
fn accuracy_tie(
    name: &str,
    dp_logs: &[(String, Vec<f32>)],
    bare_logs: &[(String, Vec<f32>)],
    dp_checked: &[Checked],
    bare_checked: &[Checked],
) -> bool {
    let Some(epoch) = (name.strip_prefix("valid/epoch-"))
        .and_then(|rest| rest.strip_suffix("/Accuracy.log"))
        .and_then(|epoch| epoch.parse::<usize>().ok())
    else {
        return false;
    };
    let logs = |logs: &[(String, Vec<f32>)]| {
        let (_, values) = logs.iter().find(|(n, _)| n == name).expect("logged");
        values.clone()
    };
    let batches = (epoch - 1) * VALID_BATCHES.len()..epoch * VALID_BATCHES.len();
    let mut explained = true;
    for (i, batch) in batches.enumerate() {
        let (dp, bare) = (dp_checked[batch], bare_checked[batch]);
        // Each line is `value,items` (burn-train's aggregated entry).
        let logged = (logs(dp_logs)[2 * i], logs(bare_logs)[2 * i]);
        eprintln!(
            "{name}, batch {i}: logged {:.2} (wrapped) / {:.2} (bare); the steps computed \
             {:.2} / {:.2}; closest top-two logits {:.1e} / {:.1e}",
            logged.0,
            logged.1,
            dp.accuracy(),
            bare.accuracy(),
            dp.closest,
            bare.closest
        );
        let as_computed =
            |logged: f32, checked: Checked| (logged - checked.accuracy()).abs() < 0.01;
        explained &= as_computed(logged.0, dp) && as_computed(logged.1, bare);
        let tie = dp.closest <= tolerance() && bare.closest <= tolerance();
        explained &= dp.correct == bare.correct || tie;
    }
    explained
}

/// A batch-norm model's own training step: its running statistics after the step are the
/// average over replicas of what each shard alone gives, as for the hand-written loop.
fn batch_norm_statistics_under_the_train_step<B: DataParallelBackend>() {
    let device = B::Device::default();
    let dp = DataParallel::new(BnNet::<B>::new(0.0, &device), devices::<B>(3)).unwrap();
    let reference = dp.module().clone();
    let x = random::<B, 2>([7, 8], &device);
    let shards = burn_dataparallel::backend::split(x.clone(), &[3, 2, 2], 0);
    let count = shards.len() as f32;
    let mut expected = vec![0f32; 16];
    for shard in shards {
        let copy = BnNet::<B>::new(0.0, &device).load_record(reference.clone().into_record());
        let _ = copy.forward(shard);
        for (e, v) in expected
            .iter_mut()
            .zip(values(copy.norm.running_mean.value_sync()))
        {
            *e += v / count;
        }
    }
    let output = TrainStep::step(&dp, x);
    assert_eq!(output.item.output.dims(), [7, 4]);
    assert_close(
        &values(dp.module().norm.running_mean.value()),
        &expected,
        "running mean",
    );
}

impl<B: AutodiffBackend> TrainStep for BnNet<B> {
    type Input = Tensor<B, 2>;
    type Output = RegressionOutput<B>;

    fn step(&self, x: Tensor<B, 2>) -> TrainOutput<RegressionOutput<B>> {
        let output = self.forward(x);
        let loss = output.clone().powi_scalar(2).mean();
        let targets = output.zeros_like();
        let grads = loss.backward();
        TrainOutput::new(self, grads, RegressionOutput::new(loss, output, targets))
    }
}

backend_tests! {
    penalty_adam => custom_steps_match_the_bare_learner(Custom::Penalty, Optim::Adam);
    penalty_sgd => custom_steps_match_the_bare_learner(Custom::Penalty, Optim::Sgd);
    scaled_adam => custom_steps_match_the_bare_learner(Custom::Scaled, Optim::Adam);
    scaled_sgd => custom_steps_match_the_bare_learner(Custom::Scaled, Optim::Sgd);
    auxiliary_adam => custom_steps_match_the_bare_learner(Custom::Auxiliary, Optim::Adam);
    auxiliary_sgd => custom_steps_match_the_bare_learner(Custom::Auxiliary, Optim::Sgd);
    zeroed_bias_adam => custom_steps_match_the_bare_learner(Custom::ZeroedBias, Optim::Adam);
    zeroed_bias_sgd => custom_steps_match_the_bare_learner(Custom::ZeroedBias, Optim::Sgd);
    sum_reduced_sgd => custom_steps_match_the_bare_learner(Custom::SumReduced, Optim::Sgd);
    unsynced_items => unsynced_items_train_as_the_bare_learner();
    batch_norm_train_step => batch_norm_statistics_under_the_train_step();
}
