//! The wrapper's record is the bare model's: the same file, loading both ways.

use burn::module::Module;
use burn::tensor::Device;
use burn_dataparallel::DataParallel;

use super::models::{Mlp, batch};
use crate::common::{assert_close, assert_same_params};

pub fn checkpoints_are_the_bare_model_s(devices: &[Device]) {
    let device = &devices[0];
    let dir = tempfile::tempdir().unwrap();
    let (bare_path, wrapped_path) = (dir.path().join("bare.bpk"), dir.path().join("wrapped.bpk"));
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();

    model.clone().save_file(&bare_path).unwrap();
    dp.clone().save_file(&wrapped_path).unwrap();
    let bare_bytes = std::fs::read(&bare_path).unwrap();
    assert!(!bare_bytes.is_empty());
    assert_eq!(
        bare_bytes,
        std::fs::read(&wrapped_path).unwrap(),
        "the saved files"
    );

    // Loading both ways, into models of other values.
    let loaded = Mlp::new(device).load_file(&wrapped_path);
    assert_same_params(&loaded, &model, 0.0);
    let fresh = DataParallel::new(Mlp::new(device), devices.to_vec()).unwrap();
    let loaded = fresh.load_file(&bare_path);
    assert_same_params(loaded.module(), &model, 0.0);
    let (x, _) = batch(5, device);
    assert_close(
        loaded.forward(x.clone()),
        model.forward(x),
        1e-6,
        "loaded output",
    );
}

crate::on_every_device_list!(
    checkpoints_are_the_bare_model_s => super::checkpoints_are_the_bare_model_s,
);
