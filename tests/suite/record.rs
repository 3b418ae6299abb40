//! The wrapper's record is the bare model's: the same file, loading both ways.

use burn::module::Module;
use burn::store::{ModuleSnapshot, SafetensorsStore};
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

/// The same through burn-store's SafeTensors format: the wrapper's file is the bare model's,
/// with its tensors' names, and each loads into the other.
pub fn safetensors_files_are_the_bare_model_s(devices: &[Device]) {
    let device = &devices[0];
    let dir = tempfile::tempdir().unwrap();
    let (bare_path, wrapped_path) = (dir.path().join("bare.st"), dir.path().join("wrapped.st"));
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();

    model
        .save_into(&mut SafetensorsStore::from_file(&bare_path))
        .unwrap();
    dp.save_into(&mut SafetensorsStore::from_file(&wrapped_path))
        .unwrap();
    // The same tensors under the same names, the same bytes; the file's metadata map is
    // written in no fixed order.
    let (bare, wrapped) = (safetensors(&bare_path), safetensors(&wrapped_path));
    assert!(bare.0.contains_key("first.weight"), "{:?}", bare.0.keys());
    assert!(bare == wrapped, "the saved tensors differ");

    let mut loaded = Mlp::new(device);
    let applied = loaded
        .load_from(&mut SafetensorsStore::from_file(&wrapped_path))
        .unwrap();
    assert!(applied.errors.is_empty(), "{applied:?}");
    assert_same_params(&loaded, &model, 0.0);
    let mut fresh = DataParallel::new(Mlp::new(device), devices.to_vec()).unwrap();
    fresh
        .load_from(&mut SafetensorsStore::from_file(&bare_path))
        .unwrap();
    assert_same_params(fresh.module(), &model, 0.0);
}

/// A SafeTensors file's tensor entries (name, dtype, shape, offsets; its metadata left out)
/// and its data bytes.
fn safetensors(path: &std::path::Path) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let length = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + length]).unwrap();
    header.remove("__metadata__");
    (header, bytes[8 + length..].to_vec())
}

crate::on_every_device_list!(
    checkpoints_are_the_bare_model_s => super::checkpoints_are_the_bare_model_s,
    safetensors_files_are_the_bare_model_s => super::safetensors_files_are_the_bare_model_s,
);
