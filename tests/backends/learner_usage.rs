//! The Learner as burn-train users run it, each against the bare Learner doing the same:
//! gradient accumulation, a training resumed from its checkpoint (parameters, optimizer
//! state, epoch), a Learner whose device is not the wrapper's output device, and the wrapped
//! module changed between two trainings through `module_mut`.

use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::record::{DefaultFileRecorder, FullPrecisionSettings};
use burn::train::metric::LossMetric;
use burn::train::{ExecutionStrategy, Learner};
use burn_dataparallel::{DataParallel, DataParallelBackend};
use std::sync::Arc;

use super::learner::{ImageBatch, ImageBatcher, items, quiet_training};
use crate::common::*;

pub(crate) type Loaders<B> = (
    Arc<dyn DataLoader<B, ImageBatch<B>>>,
    Arc<
        dyn DataLoader<
                <B as burn::tensor::backend::AutodiffBackend>::InnerBackend,
                ImageBatch<<B as burn::tensor::backend::AutodiffBackend>::InnerBackend>,
            >,
    >,
);

/// The training and validation loaders of the Learner tests, on `device`: 40 images in
/// batches of 10, 14 in batches of 7.
pub(crate) fn loaders<B: DataParallelBackend>(device: &B::Device) -> Loaders<B> {
    let train = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(10)
        .set_device(device.clone())
        .build(InMemDataset::new(items(40, 1)));
    let valid = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(7)
        .set_device(device.clone())
        .build(InMemDataset::new(items(14, 2)));
    (train, valid)
}

/// A wrapper over three replicas and the bare model with the same parameters.
fn pair<B: DataParallelBackend>() -> (DataParallel<B, ConvNet<B>>, ConvNet<B>) {
    let device = B::Device::default();
    let dp = DataParallel::new(ConvNet::<B>::new(&device), devices::<B>(3)).unwrap();
    let bare = ConvNet::<B>::new(&device).load_record(dp.module().clone().into_record());
    (dp, bare)
}

fn assert_same_parameters<B: burn::tensor::backend::Backend>(
    wrapped: &ConvNet<B>,
    bare: &ConvNet<B>,
    what: &str,
) {
    for (a, e) in param_values(wrapped).iter().zip(param_values(bare).iter()) {
        assert_close(a, e, what);
    }
}

/// `grads_accumulation(2)`: the wrapper's gradients of two batches are summed before each
/// optimizer step, as the bare model's are.
fn accumulation_case<B: DataParallelBackend>() {
    relax_for_adam();
    let dir = tempfile::tempdir().unwrap();
    let (dp, bare) = pair::<B>();
    let device = B::Device::default();
    let (train, valid) = loaders::<B>(&device);
    let bare = quiet_training!(dir.path().join("bare"), train, valid, 2)
        .metric_train_numeric(LossMetric::new())
        .grads_accumulation(2)
        .launch(Learner::new(bare, adam().init(), 1e-2))
        .model;
    let (train, valid) = loaders::<B>(&device);
    let wrapped = quiet_training!(dir.path().join("wrapped"), train, valid, 2)
        .metric_train_numeric(LossMetric::new())
        .grads_accumulation(2)
        .launch(Learner::new(dp, adam().init(), 1e-2))
        .model;
    assert_same_parameters(
        wrapped.module(),
        &bare,
        "parameters after accumulated steps",
    );
}

/// One epoch with a file checkpointer, then a second training resuming from that epoch's
/// checkpoint (`checkpoint(1)`, two epochs): the wrapper ends where the bare model does, and
/// where an uninterrupted two-epoch training of the wrapper ends. The checkpoint holds the
/// module's own record (no wrapper prefix), so the bare model's checkpoint and the
/// wrapper's are interchangeable.
fn resume_case<B: DataParallelBackend>() {
    relax_for_adam();
    let dir = tempfile::tempdir().unwrap();
    let device = B::Device::default();
    let recorder = || DefaultFileRecorder::<FullPrecisionSettings>::new();
    let (dp, bare) = pair::<B>();
    type Inner<B> = <B as burn::tensor::backend::AutodiffBackend>::InnerBackend;
    let train_in_two = |name: &str, first: ConvNet<B>, second: ConvNet<B>| -> ConvNet<Inner<B>> {
        let path = dir.path().join(name);
        let (train, valid) = loaders::<B>(&device);
        let _ = quiet_training!(path.clone(), train, valid, 1)
            .with_file_checkpointer(recorder())
            .launch(Learner::new(first, adam().init(), 1e-2));
        let (train, valid) = loaders::<B>(&device);
        quiet_training!(path, train, valid, 2)
            .with_file_checkpointer(recorder())
            .checkpoint(1)
            .launch(Learner::new(second, adam().init(), 1e-2))
            .model
    };
    let bare_after = train_in_two("bare", bare.clone(), bare.clone());
    // The second wrapper starts from other parameters: only the checkpoint can make it right.
    let other = DataParallel::new(ConvNet::<B>::new(&device), devices::<B>(3)).unwrap();
    let path = dir.path().join("wrapped");
    let (train, valid) = loaders::<B>(&device);
    let _ = quiet_training!(path.clone(), train, valid, 1)
        .with_file_checkpointer(recorder())
        .launch(Learner::new(dp.clone(), adam().init(), 1e-2));
    let (train, valid) = loaders::<B>(&device);
    let resumed = quiet_training!(path, train, valid, 2)
        .with_file_checkpointer(recorder())
        .checkpoint(1)
        .launch(Learner::new(other, adam().init(), 1e-2))
        .model;
    assert_eq!(resumed.replica_devices().len(), 3);
    assert_same_parameters(
        resumed.module(),
        &bare_after,
        "resumed against the bare model",
    );
    let (train, valid) = loaders::<B>(&device);
    let straight = quiet_training!(dir.path().join("straight"), train, valid, 2)
        .launch(Learner::new(dp, adam().init(), 1e-2))
        .model;
    assert_same_parameters(
        resumed.module(),
        straight.module(),
        "resumed against two epochs at once",
    );
}

/// A Learner told to train on another device than the wrapper's output device (its
/// `SingleDevice` strategy forks the model there and loads the batches there): the
/// parameters end where the bare Learner on the output device leaves them. On one device
/// (the CPU backends) both are the same device; on `wgpu_distinct` they are two.
fn learner_device_case<B: DataParallelBackend>() {
    relax_for_adam();
    let dir = tempfile::tempdir().unwrap();
    let (dp, bare) = pair::<B>();
    let device = B::Device::default();
    let elsewhere = (devices::<B>(3).into_iter())
        .find(|d| *d != device)
        .unwrap_or_else(|| device.clone());
    let (train, valid) = loaders::<B>(&device);
    let bare = quiet_training!(dir.path().join("bare"), train, valid, 1)
        .launch(Learner::new(bare, adam().init(), 1e-2))
        .model;
    let (train, valid) = loaders::<B>(&elsewhere);
    let wrapped = quiet_training!(dir.path().join("wrapped"), train, valid, 1)
        .with_training_strategy(ExecutionStrategy::SingleDevice(elsewhere.clone()).into())
        .launch(Learner::new(dp, adam().init(), 1e-2))
        .model;
    assert_eq!(
        wrapped.module().devices(),
        vec![elsewhere],
        "where the Learner trained"
    );
    assert_same_parameters(
        wrapped.module(),
        &bare,
        "parameters trained on another device",
    );
}

/// `module_mut` between two trainings: a layer frozen in the wrapped module stays as it was
/// through the second, as it does in the bare model.
fn module_mut_case<B: DataParallelBackend>() {
    relax_for_adam();
    let dir = tempfile::tempdir().unwrap();
    let (mut dp, mut bare) = pair::<B>();
    let device = B::Device::default();
    let freeze = |model: &mut ConvNet<B>| {
        let conv = model.conv.clone().no_grad();
        model.conv = conv;
    };
    freeze(dp.module_mut());
    freeze(&mut bare);
    let frozen = param_values(dp.module())[0].clone();
    let (train, valid) = loaders::<B>(&device);
    let bare = quiet_training!(dir.path().join("bare"), train, valid, 1)
        .launch(Learner::new(bare, adam().init(), 1e-2))
        .model;
    let (train, valid) = loaders::<B>(&device);
    let wrapped = quiet_training!(dir.path().join("wrapped"), train, valid, 1)
        .launch(Learner::new(dp, adam().init(), 1e-2))
        .model;
    assert_eq!(
        param_values(wrapped.module())[0],
        frozen,
        "the frozen layer"
    );
    assert_same_parameters(wrapped.module(), &bare, "parameters after a frozen layer");
}

backend_tests! {
    learner_grads_accumulation => accumulation_case();
    learner_resumes_from_checkpoint => resume_case();
    learner_on_another_device => learner_device_case();
    learner_after_module_mut => module_mut_case();
}
