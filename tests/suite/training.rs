//! Training steps through the wrapper end where the bare model's end.

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, SgdConfig};
use burn::tensor::{DType, Device};
use burn_dataparallel::{DataParallel, Mean};

use super::models::{Mlp, Tied, batch};
use crate::common::{assert_close, assert_same_params};

/// Three SGD steps and three Adam steps on uneven batches, wrapped and bare, from the same
/// parameters.
///
/// Adam's first steps move every parameter by about its learning rate whatever the size of
/// its gradient, so a gradient within rounding of zero moves it one way or the other: in
/// 16-bit floats, where the shards' sums round apart from the whole batch's, each Adam step may
/// put a parameter two learning rates apart. There Adam takes a rate that keeps three such
/// steps within the 16-bit tolerance.
pub fn sgd_and_adam_steps_match_the_bare_model(devices: &[Device]) {
    let device = &devices[0];
    let adam_rate = match burn::tensor::Tensor::<1>::zeros([1], device).dtype() {
        DType::F16 | DType::BF16 => 1e-3,
        _ => 1e-2,
    };
    let batches: Vec<_> = [7, 9, 5]
        .into_iter()
        .map(|rows| batch(rows, device))
        .collect();
    let loss = |m: &Mlp, (x, y): (burn::tensor::Tensor<2>, burn::tensor::Tensor<2>)| {
        Mean((m.forward(x) - y).powi_scalar(2).mean())
    };

    let mut bare = Mlp::new(device);
    let mut dp = DataParallel::new(bare.clone(), devices.to_vec()).unwrap();
    let mut sgd = (SgdConfig::new().init(), SgdConfig::new().init());
    let mut adam = (AdamConfig::new().init(), AdamConfig::new().init());
    for (step, batch) in batches.iter().cycle().take(6).enumerate() {
        let Mean(expected) = loss(&bare, batch.clone());
        let Mean(found) = dp.forward_with(batch.clone(), loss);
        assert_close(found.clone(), expected.clone(), 1e-5, "loss");
        let expected = GradientsParams::from_grads(expected.backward(), &bare);
        let found = GradientsParams::from_grads(found.backward(), &dp);
        if step < 3 {
            bare = sgd.0.step(0.1, bare, expected);
            dp = sgd.1.step(0.1, dp, found);
        } else {
            bare = adam.0.step(adam_rate, bare, expected);
            dp = adam.1.step(adam_rate, dp, found);
        }
    }
    assert_same_params(dp.module(), &bare, 1e-5);
}

/// A model holding two parameters under one id: the bare model's optimizer updates them
/// apart, and the wrapper computes what the bare model does with whatever they hold.
pub fn tied_parameters_train_as_the_bare_model(devices: &[Device]) {
    let device = &devices[0];
    let (x, _) = batch(7, device);
    let loss = |m: &Tied, x: burn::tensor::Tensor<2>| Mean(m.forward(x).powi_scalar(2).mean());

    let mut bare = Tied::new(device);
    let mut dp = DataParallel::new(bare.clone(), devices.to_vec()).unwrap();
    let (mut bare_optim, mut dp_optim) = (SgdConfig::new().init(), SgdConfig::new().init());
    for _ in 0..4 {
        let Mean(expected) = loss(&bare, x.clone());
        let Mean(found) = dp.forward_with(x.clone(), loss);
        assert_close(found.clone(), expected.clone(), 1e-5, "loss");
        let expected = GradientsParams::from_grads(expected.backward(), &bare);
        let found = GradientsParams::from_grads(found.backward(), &dp);
        bare = bare_optim.step(0.5, bare, expected);
        dp = dp_optim.step(0.5, dp, found);
    }
    assert_same_params(dp.module(), &bare, 1e-5);
}

/// The wrapper's parameters stay on the output device, and its devices are the module's.
pub fn the_module_stays_on_the_output_device(devices: &[Device]) {
    let device = &devices[0];
    let dp = DataParallel::new(Mlp::new(device), devices.to_vec()).unwrap();
    let (x, y) = batch(6, device);
    let Mean(loss) = dp.forward_with((x, y), |m, (x, y)| {
        Mean((m.forward(x) - y).powi_scalar(2).mean())
    });
    let grads = GradientsParams::from_grads(loss.backward(), &dp);
    let dp = SgdConfig::new().init().step(0.1, dp, grads);
    assert_eq!(dp.devices(), vec![device.clone()]);
}

crate::on_every_device_list!(
    sgd_and_adam_steps_match_the_bare_model => super::sgd_and_adam_steps_match_the_bare_model,
    tied_parameters_train_as_the_bare_model => super::tied_parameters_train_as_the_bare_model,
    the_module_stays_on_the_output_device => super::the_module_stays_on_the_output_device,
);
