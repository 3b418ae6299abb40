//! Device moves and the step profile's account of them.
//!
//! The coalesced transfer path itself is tested in the crate's unit tests (forced on one
//! device) and on distinct CUDA devices.

use burn::backend::wgpu::{Wgpu, WgpuDevice};
use burn::backend::{Autodiff, Flex};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_dataparallel::{DataParallel, DataParallelConfig};

mod common;

use common::Mlp;

type B = Autodiff<Wgpu>;

fn input<B: Backend>(device: &B::Device) -> Tensor<B, 2> {
    let values: Vec<f32> = (0..9 * 6).map(|i| (i as f32 * 0.37).sin()).collect();
    Tensor::from_data(TensorData::new(values, [9, 6]), device)
}

fn assert_near<const D: usize>(actual: Tensor<B, D>, expected: Tensor<B, D>, what: &str) {
    let a = actual.into_data().to_vec::<f32>().unwrap();
    let e = expected.into_data().to_vec::<f32>().unwrap();
    assert_eq!(a.len(), e.len(), "{what}: length");
    for (i, (a, e)) in a.iter().zip(&e).enumerate() {
        assert!(
            (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
            "{what}[{i}]: {a} vs {e}"
        );
    }
}

/// Replicas sharing one wgpu device give the bare model's output (replicas on distinct wgpu
/// devices, whose tensors move through host memory: `tests/distinct_devices.rs`).
#[test]
fn same_device_wgpu_replicas_match_the_bare_model() {
    if common::adapter::skip_without_wgpu("same_device_wgpu_replicas_match_the_bare_model") {
        return;
    }
    let home = WgpuDevice::DefaultDevice;
    let model = Mlp::<B>::new(6, 16, 3, &home);
    // Parameters are initialised lazily: initialise before cloning, so clones share them.
    let expected = model.forward(input(&home));
    let dp = DataParallel::new(model.clone(), vec![home.clone(); 2]).unwrap();
    let output = dp.forward_with(input::<B>(&home), |m, x| m.forward(x));
    assert_near(output, expected, "same-device replicas");
}

#[test]
fn replicas_on_the_parameters_device_move_nothing() {
    type F = Autodiff<Flex>;
    let device = Default::default();
    let model = Mlp::<F>::new(6, 16, 3, &device);
    let dp = DataParallelConfig::new()
        .with_profile(true)
        .init(model, vec![device; 4])
        .unwrap();
    let output = dp.forward_with(input(&device), |m, x| m.forward(x));
    output.sum().backward();
    let profile = dp.profile().unwrap();
    assert_eq!(profile.bytes_broadcast + profile.bytes_reduced, 0);
    assert_eq!(profile.broadcast_transfers + profile.reduce_transfers, 0);
    assert_eq!(profile.bytes_scattered + profile.bytes_gathered, 0);
    assert_eq!(profile.forward.len(), 4);
}

#[test]
fn profiling_is_off_by_default_and_can_be_switched() {
    let device = Default::default();
    let model = Mlp::<Autodiff<Flex>>::new(6, 16, 3, &device);
    let dp = DataParallel::new(model, vec![device; 2]).unwrap();
    assert!(!dp.is_profiling());
    let _ = dp.forward_with(input(&device), |m, x| m.forward(x));
    assert!(dp.profile().is_none());
    dp.set_profiling(true);
    let _ = dp.forward_with(input(&device), |m, x| m.forward(x));
    let first = dp.profile().unwrap();
    assert!(first.forward.iter().all(|d| !d.is_zero()));
    dp.set_profiling(false);
    let _ = dp.forward_with(input(&device), |m, x| m.forward(x));
    assert_eq!(dp.profile().unwrap(), first, "the last profiled step stays");
}

#[test]
fn config_sets_buckets_and_profiling() {
    let device = Default::default();
    let model = Mlp::<Autodiff<Flex>>::new(6, 16, 3, &device);
    let config = DataParallelConfig::new()
        .with_bucket_size(4096)
        .with_profile(true);
    let dp = config.init(model, vec![device; 2]).unwrap();
    assert_eq!(dp.bucket_size(), 4096);
    assert!(dp.is_profiling());
    // Clones share the switch.
    let clone = dp.clone();
    clone.set_profiling(false);
    assert!(!dp.is_profiling());

    let defaults = DataParallelConfig::new();
    assert_eq!(defaults.bucket_size, burn_dataparallel::DEFAULT_BUCKET_SIZE);
    assert!(!defaults.profile);
}
