//! The `Learner` as burn-train users run it, against the bare Learner doing the same:
//! training with validation, and gradient accumulation.

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::optim::SgdConfig;
use burn::tensor::{Device, Tensor};
use burn::train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn::train::metric::{Adaptor, LossInput};
use burn::train::metric::{LossMetric, MetricDefinition};
use burn::train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use burn::train::{InferenceStep, Learner, LearnerModel, SupervisedTraining, TrainStep};
use burn_dataparallel::DataParallel;

use super::learner::{Batch, Regressor};
use super::models::Mlp;
use crate::common::assert_same_params;

/// One item: six inputs, three targets.
#[derive(Debug, Clone)]
struct Item {
    x: [f32; 6],
    y: [f32; 3],
}

/// `n` items of a fixed pattern (`seed` shifts it).
fn items(n: usize, seed: usize) -> Vec<Item> {
    (0..n)
        .map(|i| {
            let v = |j: usize| (((i + seed) * 7 + j * 3) % 11) as f32 / 11.0 - 0.5;
            Item {
                x: core::array::from_fn(v),
                y: core::array::from_fn(|j| v(j + 6) * 2.0),
            }
        })
        .collect()
}

#[derive(Clone)]
struct ItemBatcher;

impl Batcher<Item, Batch> for ItemBatcher {
    fn batch(&self, items: Vec<Item>, device: &Device) -> Batch {
        let rows = items.len();
        let x: Vec<f32> = items.iter().flat_map(|item| item.x).collect();
        let y: Vec<f32> = items.iter().flat_map(|item| item.y).collect();
        Batch::new(
            Tensor::<1>::from_floats(x.as_slice(), device).reshape([rows, 6]),
            Tensor::<1>::from_floats(y.as_slice(), device).reshape([rows, 3]),
        )
    }
}

/// 40 training items in batches of 10 (the last shards uneven over three replicas), 14
/// validation items in batches of 7.
fn loaders(device: &Device) -> (Arc<dyn DataLoader<Batch>>, Arc<dyn DataLoader<Batch>>) {
    let train = DataLoaderBuilder::new(ItemBatcher)
        .batch_size(10)
        .set_device(device.clone())
        .build(InMemDataset::new(items(40, 1)));
    let valid = DataLoaderBuilder::new(ItemBatcher)
        .batch_size(7)
        .set_device(device.clone())
        .build(InMemDataset::new(items(14, 2)));
    (train, valid)
}

/// A renderer that shows nothing.
struct Silent;

impl MetricsRendererTraining for Silent {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
}

impl MetricsRendererEvaluation for Silent {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
}

impl TrainingProgressLogger for Silent {
    fn start(&mut self, _: usize, _: usize, _: Option<usize>, _: Option<&str>) {}
    fn update_epoch(&mut self, _epoch: usize) {}
    fn start_split(&mut self, _split: &str, _total_items: usize) {}
    fn update_split(&mut self, _items_processed: usize) {}
    fn end_split(&mut self) {}
    fn end(&mut self) {}
    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for Silent {
    fn start_global_progress(&mut self, _total_tests: usize) {}
    fn start_test(&mut self, _name: &str, _total_items: usize) {}
    fn update_test_progress(&mut self, _items_processed: usize) {}
    fn end_test(&mut self) {}
    fn end_global_progress(&mut self) {}
    fn log_event_evaluation(&mut self, _event: String) {}
}

impl MetricsRenderer for Silent {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: MetricDefinition) {}
}

/// Two epochs of quiet `SupervisedTraining` in `dir`, with the loss as a metric.
fn training<M>(dir: &std::path::Path, device: &Device, accumulation: usize) -> SupervisedTraining<M>
where
    M: LearnerModel + TrainStep<Input = Batch> + InferenceStep<Input = Batch>,
    <M as TrainStep>::Output: Adaptor<LossInput>,
    <M as InferenceStep>::Output: Adaptor<LossInput>,
{
    let (train, valid) = loaders(device);
    SupervisedTraining::new(dir, train, valid)
        .with_application_logger(None)
        .renderer(Box::new(Silent))
        .num_epochs(2)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .grads_accumulation(accumulation)
}

/// Two epochs of `SupervisedTraining`, wrapped and bare, `accumulation` batches per
/// optimizer step: the same parameters after.
fn trains_as_the_bare_learner(devices: &[Device], accumulation: usize) {
    let device = &devices[0];
    let dir = tempfile::tempdir().unwrap();
    let bare = Regressor::new(Mlp::new(device));
    let dp = DataParallel::new(bare.clone(), devices.to_vec()).unwrap();
    let trained_bare = training(&dir.path().join("bare"), device, accumulation)
        .launch(Learner::new(bare.clone(), SgdConfig::new().init(), 0.05))
        .model;
    let trained_dp = training(&dir.path().join("wrapped"), device, accumulation)
        .launch(Learner::new(dp, SgdConfig::new().init(), 0.05))
        .model;
    assert_eq!(trained_dp.replica_devices(), devices);
    assert_same_params(trained_dp.module(), &trained_bare, 1e-5);
    let moved = crate::common::params(&trained_bare)
        .into_iter()
        .zip(crate::common::params(&bare))
        .any(|(after, before)| crate::common::values(after) != crate::common::values(before));
    assert!(moved, "training changed the parameters");
}

pub fn the_learner_trains_as_the_bare_one(devices: &[Device]) {
    trains_as_the_bare_learner(devices, 1);
}

pub fn gradient_accumulation_sums_as_the_bare_learner_s(devices: &[Device]) {
    trains_as_the_bare_learner(devices, 2);
}

crate::on_every_device_list!(
    the_learner_trains_as_the_bare_one => super::the_learner_trains_as_the_bare_one,
    gradient_accumulation_sums_as_the_bare_learner_s => super::gradient_accumulation_sums_as_the_bare_learner_s,
);
