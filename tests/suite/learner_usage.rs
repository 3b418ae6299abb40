//! The `Learner` as burn-train users run it, against the bare Learner doing the same:
//! training with validation, and gradient accumulation.

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::optim::SgdConfig;
use burn::tensor::{Device, Tensor};
use burn::train::metric::LossMetric;
use burn::train::metric::{Adaptor, LossInput};
use burn::train::{InferenceStep, Learner, LearnerModel, SupervisedTraining, TrainStep};
use burn_dataparallel::DataParallel;

use super::learner::{Batch, Regressor};
use super::models::Mlp;
use crate::common::{Silent, assert_same_params};

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
