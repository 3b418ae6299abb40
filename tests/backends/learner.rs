//! The wrapper trains through burn-train's `Learner` exactly like the bare model.

use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{ClassificationOutput, InferenceStep, Learner, TrainOutput, TrainStep};
use burn_dataparallel::DataParallelBackend;
use burn_dataparallel::{DataParallel, Forward, impl_scatter};

use crate::common::*;

#[derive(Debug, Clone)]
pub struct ImageBatch<B: Backend> {
    pub images: Tensor<B, 4>,
    pub targets: Tensor<B, 1, Int>,
}
impl_scatter!(ImageBatch<B> { images, targets });

impl<B: Backend> ConvNet<B> {
    /// The classification forward the bare model's `TrainStep` and `InferenceStep` use.
    pub fn classify(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        let output = self.forward(batch.images);
        let loss = burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, output, batch.targets)
    }
}

/// What a user of the bare model already has.
impl<B: DataParallelBackend> TrainStep for ConvNet<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for ConvNet<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

/// The one addition for the wrapper: which forward its replicas run.
impl<B: burn_dataparallel::ConcatBackend> Forward<B> for ConvNet<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn forward(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

#[derive(Debug, Clone)]
pub struct Item {
    pub image: Vec<f32>,
    pub label: i64,
}

/// `count` 3x6x6 images: a bright 2x2 block whose position gives the label, plus noise from a
/// fixed linear congruential sequence.
pub fn items(count: usize, seed: u64) -> Vec<Item> {
    let mut state = seed;
    let mut noise = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    (0..count)
        .map(|i| {
            let label = (i % 3) as i64;
            let image = (0..108)
                .map(|p| {
                    let (y, x) = ((p % 36) / 6, p % 6);
                    let lit = y / 2 == label as usize && x / 2 == label as usize;
                    noise() * 0.5 + if lit { 1.0 } else { 0.0 }
                })
                .collect();
            Item { image, label }
        })
        .collect()
}

#[derive(Clone)]
pub struct ImageBatcher;

impl<B: Backend> Batcher<B, Item, ImageBatch<B>> for ImageBatcher {
    fn batch(&self, items: Vec<Item>, device: &B::Device) -> ImageBatch<B> {
        let n = items.len();
        let images: Vec<f32> = items.iter().flat_map(|i| i.image.clone()).collect();
        let targets: Vec<i64> = items.iter().map(|i| i.label).collect();
        ImageBatch {
            images: Tensor::from_data(TensorData::new(images, [n, 3, 6, 6]), device),
            targets: Tensor::from_data(TensorData::new(targets, [n]), device),
        }
    }
}

pub(crate) use dataparallel_dev::quiet_training;

/// Two epochs of `SupervisedTraining` on the wrapper (three replicas, validation included)
/// leave the parameters where the same training of the bare model leaves them.
fn learner_matches_bare<B: DataParallelBackend>() {
    relax_for_adam();
    let device = B::Device::default();
    let loaders = || super::learner_usage::loaders::<B>(&device);
    let dir = tempfile::tempdir().unwrap();

    let dp = DataParallel::new(ConvNet::<B>::new(&device), devices::<B>(3)).unwrap();
    let bare = ConvNet::<B>::new(&device).load_record(dp.module().clone().into_record());
    let before = param_values(dp.module());

    let (train, valid) = loaders();
    let trained_bare = quiet_training!(dir.path().join("bare"), train, valid, 2)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(AccuracyMetric::new())
        .launch(Learner::new(bare, adam().init(), 1e-2))
        .model;

    let (train, valid) = loaders();
    let trained_dp = quiet_training!(dir.path().join("wrapped"), train, valid, 2)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(AccuracyMetric::new())
        .launch(Learner::new(dp, adam().init(), 1e-2))
        .model;

    assert_eq!(trained_dp.replica_devices().len(), 3);
    let after = param_values(&trained_dp);
    assert_ne!(before, after, "training changed the parameters");
    for (a, e) in after.iter().zip(param_values(&trained_bare).iter()) {
        assert_close(a, e, "parameters after two epochs");
    }

    // Validation through the wrapper gives the bare model's outputs.
    let batch = ImageBatcher.batch(items(9, 3), &device);
    let expected = InferenceStep::step(&trained_bare, batch.clone());
    let actual = InferenceStep::step(&trained_dp, batch);
    assert_close(
        &values(actual.output),
        &values(expected.output),
        "validation logits",
    );
    assert_close(
        &values(actual.loss),
        &values(expected.loss),
        "validation loss",
    );
    assert_eq!(actual.targets.into_data(), expected.targets.into_data());
}

backend_tests! {
    learner_two_epochs => learner_matches_bare();
}
