//! The stage profile and the warm-up.

use burn::module::Module;
use burn::tensor::Device;
use burn::train::TrainStep;
use burn_dataparallel::{DataParallel, shard_sizes};

use super::learner::{Batch, Regressor};
use super::models::{Mlp, batch};
use crate::common::{assert_same_params, params};

/// With profiling on, a step records its shards and one time per replica; off, nothing.
pub fn steps_record_their_profile(devices: &[Device]) {
    let device = &devices[0];
    let dp = DataParallel::new(Mlp::new(device), devices.to_vec()).unwrap();
    let (x, y) = batch(11, device);
    let _ = dp.forward(x.clone());
    assert!(dp.profile().is_none(), "profiling is off by default");

    dp.set_profiling(true);
    assert!(dp.is_profiling());
    let _ = dp.forward(x.clone());
    // One device: the module itself runs the step, its time the one replica's.
    let profile = dp.profile().expect("a profile");
    assert_eq!(profile.shard_sizes, shard_sizes(11, devices.len(), None));
    assert_eq!(profile.forward.len(), devices.len());
    assert!(profile.total() >= profile.slowest_forward());
    assert!(profile.to_string().contains("forward ["));

    let regressor = DataParallel::new(Regressor::new(Mlp::new(device)), devices.to_vec()).unwrap();
    regressor.set_profiling(true);
    let _ = TrainStep::step(&regressor, Batch::new(x, y));
    let profile = regressor.profile().expect("a profile");
    assert_eq!(profile.forward.len(), devices.len());
}

/// The warm-up runs a forward and a backward and leaves the parameters as they were.
pub fn the_warm_up_changes_no_parameter(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let before = params(dp.module());
    let warm = dp
        .warm_up(batch(9, device), |m, (x, y)| {
            (m.forward(x) - y).powi_scalar(2).mean()
        })
        .unwrap();
    assert_eq!(warm.shard_sizes, shard_sizes(9, devices.len(), None));
    assert!(warm.total() >= warm.forward);
    assert_eq!(params(dp.module()).len(), before.len());
    assert_same_params(dp.module(), &model, 0.0);
    assert_eq!(dp.devices(), model.devices());
}

crate::on_every_device_list!(
    steps_record_their_profile => super::steps_record_their_profile,
    the_warm_up_changes_no_parameter => super::the_warm_up_changes_no_parameter,
);
