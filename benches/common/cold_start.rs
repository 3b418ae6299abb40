//! `benches/train_step.rs cold ...`: one fresh process's time to its first steps and to steady
//! state, through `DataParallel::warm_up` when it has replicas.

use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{DataParallel, DataParallelBackend, Mean};

use crate::measure::median;
use crate::models::{CLASSES, Model, Sizes, input};

/// One fresh process's time to first step and to steady state.
pub fn cold<B: DataParallelBackend>(model: &str, sizes: Sizes, replicas: usize, batch: usize) {
    let start = Instant::now();
    let device = B::Device::default();
    let x = input::<B>(model, sizes, batch, &device);
    let y =
        Tensor::<B, 1, Int>::random([batch], Distribution::Uniform(0.0, CLASSES as f64), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = SgdConfig::new().init();
    let mut dp = DataParallel::new(
        Model::<B>::new(model, sizes, &device),
        vec![device.clone(); replicas.max(1)],
    )
    .expect("settings");
    let mut ends = Vec::new();
    let mut warm_up = None;
    if replicas > 0 {
        let report = dp
            .warm_up((x.clone(), y.clone()), |m, (x, y)| {
                CrossEntropyLossConfig::new()
                    .init(&y.device())
                    .forward(m.forward(x), y)
            })
            .expect("warm-up");
        warm_up = Some(report.total());
    }
    for _ in 0..40 {
        let step_start = Instant::now();
        let loss = if replicas == 0 {
            loss_fn.forward(dp.module().forward(x.clone()), y.clone())
        } else {
            let Mean(loss) = dp.forward_with((x.clone(), y.clone()), |m, (x, y)| {
                Mean(
                    CrossEntropyLossConfig::new()
                        .init(&y.device())
                        .forward(m.forward(x), y),
                )
            });
            loss
        };
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = optim.step(0.01, dp, grads);
        B::sync(&device).expect("sync");
        ends.push((start.elapsed(), step_start.elapsed()));
    }
    let tail = median(ends[30..].iter().map(|e| e.1).collect());
    let steady = ends
        .iter()
        .position(|e| e.1.as_secs_f64() <= 1.5 * tail.as_secs_f64())
        .unwrap_or(ends.len() - 1);
    let secs = |d: Duration| d.as_secs_f64();
    println!(
        "cold | {model} | {} | {batch} | {} | {:.2} s | {:.3} / {:.3} / {:.3} s | {:.2} s (step {}) | {:.3} ms |",
        match replicas {
            0 => "bare".to_string(),
            n => format!("DataParallel x{n}"),
        },
        warm_up
            .map(|w| format!("{:.2} s", secs(w)))
            .unwrap_or_else(|| "-".into()),
        secs(ends[0].0),
        secs(ends[1].1),
        secs(ends[2].1),
        secs(ends[3].1),
        secs(ends[steady].0),
        steady + 1,
        secs(tail) * 1e3,
    );
}
