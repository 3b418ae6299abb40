//! Shards that balance themselves (`DataParallelConfig::adaptive_shards`), on the CPU: two
//! replicas share the CPU, and the model's forward sleeps a given time per row on each lane,
//! which makes one replica's work slower on demand. The split follows, without oscillating,
//! comes back when the asymmetry goes, and every step's gradients are the bare model's
//! whatever the split, in the hand-written loop and through the Learner's `TrainStep`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::train::{RegressionOutput, TrainOutput, TrainStep};
use burn_dataparallel::{
    AdaptiveShardsConfig, DataParallel, DataParallelBackend, DataParallelConfig, Mean,
};

use crate::common::*;

/// An MLP whose forward sleeps `micros[lane]` microseconds per row on lane `lane` (the
/// worker thread of device slot `lane`; `micros[0]` on any other thread).
#[derive(Module, Debug)]
pub struct Slowed<B: Backend> {
    mlp: Mlp<B>,
    #[module(skip)]
    micros: Arc<[AtomicU64; 2]>,
}

impl<B: Backend> Slowed<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let lane = match std::thread::current().name() {
            Some(name) if name.starts_with("dataparallel-1") => 1,
            _ => 0,
        };
        let per_row = self.micros[lane].load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_micros(per_row * x.dims()[0] as u64));
        self.mlp.forward(x)
    }

    fn loss(&self, (x, y): (Tensor<B, 2>, Tensor<B, 2>)) -> Tensor<B, 1> {
        (self.forward(x) - y).powi_scalar(2).mean()
    }
}

impl<B: AutodiffBackend> TrainStep for Slowed<B> {
    type Input = (Tensor<B, 2>, Tensor<B, 2>);
    type Output = RegressionOutput<B>;

    fn step(&self, (x, y): Self::Input) -> TrainOutput<RegressionOutput<B>> {
        let output = self.forward(x);
        let loss = (output.clone() - y.clone()).powi_scalar(2).mean();
        TrainOutput::new(
            self,
            loss.backward(),
            RegressionOutput::new(loss, output, y),
        )
    }
}

/// How the step runs: the hand-written loop, or the wrapper's `TrainStep` (the Learner's).
#[derive(Clone, Copy, Debug)]
enum Loop {
    Own,
    Learner,
}

/// One step through the wrapper on `batch`, its gradients checked against the bare model's
/// on the whole batch; the rows replica 0 got.
fn checked_step<B: DataParallelBackend>(
    dp: &DataParallel<B, Slowed<B>>,
    batch: (Tensor<B, 2>, Tensor<B, 2>),
    how: Loop,
) -> usize {
    let rows = dp.shards(&batch).unwrap().sizes()[0];
    let expected = dp.module().loss(batch.clone()).backward();
    let expected = param_grads(dp.module(), &expected);
    let actual = match how {
        Loop::Own => {
            let Mean(loss) = dp.forward_with(batch, |m, b| Mean(m.loss(b)));
            param_grads(dp.module(), &loss.backward())
        }
        Loop::Learner => {
            let grads = TrainStep::step(dp, batch).grads;
            let mut found = Vec::new();
            for (id, _) in &expected {
                let grad = (grads.get::<B::InnerBackend, 2>(*id).map(values))
                    .or_else(|| grads.get::<B::InnerBackend, 1>(*id).map(values));
                found.push((*id, grad.expect("every parameter's gradient")));
            }
            found
        }
    };
    assert_grads_close(&actual, &expected);
    rows
}

/// With lane 1 three times as slow per row, replica 0's share rises to about three quarters
/// within nine steps (a new split's first step is not measured), one way (a step back of one
/// row at most: sleeps overrun on a loaded machine); when the asymmetry goes, it comes back to
/// about half. "About": a split whose predicted step is within the tolerance of the balanced
/// one is left alone, so the bounds are those splits (with the sleeps alone: 28-34 rows of 40
/// while lane 1 is slow, 17-23 after).
fn the_split_follows_the_replicas<B: DataParallelBackend>(how: Loop) {
    let device: B::Device = Default::default();
    let micros = Arc::new([AtomicU64::new(1000), AtomicU64::new(3000)]);
    let model = Slowed {
        mlp: Mlp::new(8, 16, 4, &device),
        micros: micros.clone(),
    };
    // The tolerance is the step time a move must save (back from 30 : 10 to 20 : 20 saves a
    // third), high enough that the sleeps' overruns on a loaded machine move nothing.
    let adaptive = AdaptiveShardsConfig::new()
        .with_damping(0.5)
        .with_tolerance(0.15);
    let dp = DataParallelConfig::new()
        .with_adaptive_shards(Some(adaptive))
        .init(model, vec![device.clone(); 2])
        .unwrap();
    let batch = || {
        (
            random::<B, 2>([40, 8], &device),
            random::<B, 2>([40, 4], &device),
        )
    };
    let slow: Vec<usize> = (0..12).map(|_| checked_step(&dp, batch(), how)).collect();
    assert_eq!(slow[0], 20, "even before anything is measured: {slow:?}");
    assert!(
        slow.windows(2).all(|w| w[1] + 1 >= w[0]),
        "one way: {slow:?}"
    );
    let about = |n: &usize| (27..=34).contains(n);
    assert!(slow[8..].iter().all(about), "about 30 of 40 rows: {slow:?}");

    micros[1].store(1000, Ordering::Relaxed);
    let even: Vec<usize> = (0..12).map(|_| checked_step(&dp, batch(), how)).collect();
    assert!(
        even.windows(2).all(|w| w[1] <= w[0] + 1),
        "one way back: {even:?}"
    );
    assert!((17..=23).contains(&even[11]), "about half again: {even:?}");
    let weights = dp.adaptive_weights().expect("adaptive");
    assert!(
        (weights.iter().sum::<f64>() - 1.0).abs() < 1e-9,
        "{weights:?}"
    );
}

#[test]
fn adaptive_shards_in_the_own_loop() {
    within("adaptive_shards_in_the_own_loop", || {
        the_split_follows_the_replicas::<FlexAd>(Loop::Own)
    });
}

#[test]
fn adaptive_shards_under_the_learner() {
    within("adaptive_shards_under_the_learner", || {
        the_split_follows_the_replicas::<FlexAd>(Loop::Learner)
    });
}

/// Settings out of range are refused when the wrapper is made.
#[test]
fn adaptive_settings_are_checked() {
    let device = Default::default();
    let bad = AdaptiveShardsConfig::new().with_damping(0.0);
    let result = DataParallelConfig::new()
        .with_adaptive_shards(Some(bad))
        .init(Mlp::<FlexAd>::new(8, 16, 4, &device), vec![device; 2]);
    assert!(matches!(
        result,
        Err(burn_dataparallel::DataParallelError::InvalidAdaptiveShards { .. })
    ));
}

/// Without the setting there is no adaptive split.
#[test]
fn adaptive_weights_only_when_on() {
    let device = Default::default();
    let dp = DataParallel::new(Mlp::<FlexAd>::new(8, 16, 4, &device), vec![device; 2]).unwrap();
    assert_eq!(dp.adaptive_weights(), None);
}
