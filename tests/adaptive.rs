//! Shards that balance themselves, on the CPU: two replicas share it, and the model's forward
//! sleeps a set time per row on each lane, which sets the replicas' speeds. A process of its
//! own, its timed tests one at a time, so that no other test's load blurs the times.

#[path = "common/mod.rs"]
mod common;
#[path = "suite/models.rs"]
#[allow(dead_code)]
mod models;

use std::sync::Mutex;

use std::time::Duration;

use burn::module::Module;
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Tensor};
use burn_dataparallel::{
    AdaptiveShardsConfig, DataParallel, DataParallelConfig, Mean, StepProfile,
};

use common::{assert_close, assert_same_params, flex};
use models::{Mlp, batch};

/// One timed test at a time.
static TIMED: Mutex<()> = Mutex::new(());

/// The perceptron, its forward sleeping `micros[i]` per row and `fixed[i]` per call on the
/// lane of device entry `i` (entry 0's on any other thread): sleeps far above the model's
/// own time, so that the replicas' speeds are what the test sets.
#[derive(Module, Debug)]
struct Slowed {
    mlp: Mlp,
    #[module(skip)]
    micros: [u64; 2],
    #[module(skip)]
    fixed: [u64; 2],
}

impl Slowed {
    fn loss(&self, (x, y): (Tensor<2>, Tensor<2>)) -> Mean<Tensor<1>> {
        let lane = usize::from(std::thread::current().name() == Some("dataparallel-1"));
        std::thread::sleep(Duration::from_micros(
            self.fixed[lane] + self.micros[lane] * x.dims()[0] as u64,
        ));
        Mean((self.mlp.forward(x) - y).powi_scalar(2).mean())
    }
}

/// Trains `steps` steps of 64 rows with adaptive shards, entry `i` sleeping `micros[i]` per
/// row and `fixed[i]` per call, each step's parameters checked against the bare model's; the
/// last weights, and the last step's profile.
fn adaptive_training(
    micros: [u64; 2],
    fixed: [u64; 2],
    steps: usize,
) -> (Vec<f64>, Option<StepProfile>) {
    let device = Device::flex().autodiff();
    let mut bare = Slowed {
        mlp: Mlp::new(&device),
        micros,
        fixed,
    };
    let mut dp = DataParallelConfig::new()
        .with_adaptive_shards(Some(AdaptiveShardsConfig::new()))
        .init(bare.clone(), flex(2))
        .unwrap();
    dp.set_profiling(true);
    let (mut bare_optim, mut dp_optim) = (SgdConfig::new().init(), SgdConfig::new().init());
    let data = batch(64, &device);
    for _ in 0..steps {
        let Mean(expected) = bare.loss(data.clone());
        let Mean(found) = dp.forward_with(data.clone(), Slowed::loss);
        assert_close(found.clone(), expected.clone(), 1e-5, "loss");
        let expected = GradientsParams::from_grads(expected.backward(), &bare);
        let found = GradientsParams::from_grads(found.backward(), &dp);
        bare = bare_optim.step(0.05, bare, expected);
        dp = dp_optim.step(0.05, dp, found);
        assert_same_params(dp.module(), &bare, 1e-5);
    }
    (dp.adaptive_weights().unwrap(), dp.profile())
}

/// A replica three times slower per row loses rows to the other; the gradients stay the
/// bare model's.
#[test]
fn rows_move_to_the_faster_replica() {
    let _one = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    common::within(|| {
        let (weights, _) = adaptive_training([300, 900], [0, 0], 12);
        assert!(weights[0] > 0.65, "weights {weights:?}");
    });
}

/// Two equal replicas stay near even shards.
#[test]
fn equal_replicas_stay_even() {
    let _one = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    common::within(|| {
        let (weights, _) = adaptive_training([500, 500], [0, 0], 12);
        assert!((weights[0] - 0.5).abs() < 0.1, "weights {weights:?}");
    });
}

/// A replica that costs more a step than the other's whole batch (60 ms a call, where the
/// batch takes 6.4 ms) is left out: the wrapper then runs the module itself, the parameters
/// stay the bare model's throughout, and the profile is of that last step.
#[test]
fn a_replica_that_only_slows_the_step_is_left_out() {
    let _one = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    common::within(|| {
        let (weights, profile) = adaptive_training([100, 100], [0, 60_000], 12);
        assert_eq!(weights, [1.0, 0.0]);
        let profile = profile.expect("profiling is on");
        assert_eq!(profile.shard_sizes, [64], "one shard: the module itself");
        assert_eq!(profile.forward.len(), 1);
    });
}

/// Settings out of range are refused.
#[test]
fn adaptive_settings_are_checked() {
    let device = Device::flex().autodiff();
    let result = DataParallelConfig::new()
        .with_adaptive_shards(Some(AdaptiveShardsConfig::new().with_damping(0.0)))
        .init(Mlp::new(&device), flex(2));
    assert!(matches!(
        result,
        Err(burn_dataparallel::DataParallelError::InvalidAdaptiveShards { .. })
    ));
    let _ = DataParallel::new(Mlp::new(&device), flex(2)).unwrap();
}
