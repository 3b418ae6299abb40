//! Training-step time of an MLP, bare and through `DataParallel` with 1, 2 and 4 replicas on
//! one device, on every backend built in (CPU always; Fusion and CubeBackend CUDA with the
//! `cuda` feature).
//!
//! ```sh
//! cargo bench --bench step_time                    # CPU, small model
//! cargo bench --features cuda --bench step_time    # CUDA, MLP 1024-4096-4096-10, batch 512
//! cargo bench --features cuda --bench step_time -- fusion cube   # only these backends
//! ```
//!
//! Each configuration reports its first step (compilation and autotuning included), then the
//! median of timed steps after a warm-up; the device is synchronised inside every timed step.

use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{DataParallel, DataParallelBackend, Mean};

// The median; the lists from the environment go unused here.
#[allow(dead_code)]
#[path = "common/measure.rs"]
mod measure;
use measure::{median, positional_args};
// The MLP of the train-step bench (the other models there go unused here).
#[allow(dead_code)]
#[path = "common/models.rs"]
mod models;
use models::Mlp;

struct Timing {
    first: Duration,
    median: Duration,
    /// Medians of a second pass that synchronises after each phase: host time to return from
    /// the forward, then forward, backward and optimizer step each up to synchronisation.
    phases: [Duration; 4],
}

/// Runs `steps` training steps of `replicas` replicas (0: the bare model).
fn time_steps<B: DataParallelBackend>(
    widths: &[usize],
    batch: usize,
    replicas: usize,
    warm_up: usize,
    timed: usize,
) -> Timing {
    let device = B::Device::default();
    let classes = *widths.last().unwrap();
    let x = Tensor::<B, 2>::random([batch, widths[0]], Distribution::Default, &device);
    let y =
        Tensor::<B, 1, Int>::random([batch], Distribution::Uniform(0.0, classes as f64), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim_bare = SgdConfig::new().init();
    let mut optim_dp = SgdConfig::new().init();
    let mut bare = Mlp::<B>::new(widths, &device);
    let mut dp = DataParallel::new(
        Mlp::<B>::new(widths, &device),
        vec![device.clone(); replicas.max(1)],
    )
    .expect("settings");

    let sync = || B::sync(&device).expect("sync");
    let mut times = Vec::new();
    let mut phases: [Vec<Duration>; 4] = Default::default();
    for i in 0..2 * (warm_up + timed) + 1 {
        // Second half: synchronise between phases to see where the time goes.
        let split = i > warm_up + timed;
        let mut marks = vec![Instant::now()];
        let mark = |marks: &mut Vec<Instant>, wait: bool| {
            if wait && split {
                sync();
            }
            marks.push(Instant::now());
        };
        if replicas == 0 {
            let loss = loss_fn.forward(bare.forward(x.clone()), y.clone());
            mark(&mut marks, false);
            mark(&mut marks, true);
            let grads = GradientsParams::from_grads(loss.backward(), &bare);
            mark(&mut marks, true);
            bare = optim_bare.step(0.01, bare, grads);
        } else {
            let Mean(loss) = dp.forward_with((x.clone(), y.clone()), |m, (x, y)| {
                Mean(
                    CrossEntropyLossConfig::new()
                        .init(&y.device())
                        .forward(m.forward(x), y),
                )
            });
            mark(&mut marks, false);
            mark(&mut marks, true);
            let grads = GradientsParams::from_grads(loss.backward(), &dp);
            mark(&mut marks, true);
            dp = optim_dp.step(0.01, dp, grads);
        }
        sync();
        marks.push(Instant::now());
        match i {
            _ if split => {
                let base = marks[0];
                let ends = [marks[1], marks[2], marks[3], marks[4]];
                let starts = [base, base, marks[2], marks[3]];
                for (phase, (end, start)) in ends.iter().zip(starts).enumerate() {
                    phases[phase].push(*end - start);
                }
            }
            _ => times.push(marks[4] - marks[0]),
        }
    }
    let first = times[0];
    Timing {
        first,
        median: median(times[1 + warm_up..].to_vec()),
        phases: phases.map(median),
    }
}

fn bench_backend<B: DataParallelBackend>(name: &str, widths: &[usize], batch: usize) {
    let mut bare_median = None;
    for replicas in [0, 1, 2, 4] {
        let timing = time_steps::<B>(widths, batch, replicas, 10, 30);
        let bare = *bare_median.get_or_insert(timing.median);
        let label = match replicas {
            0 => "bare".to_string(),
            n => format!("DataParallel x{n}"),
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {name} | {label} | {:.3} ms | {:.2}x | {:.1} s | {:.3} / {:.3} / {:.3} / {:.3} |",
            ms(timing.median),
            timing.median.as_secs_f64() / bare.as_secs_f64(),
            timing.first.as_secs_f64(),
            ms(timing.phases[0]),
            ms(timing.phases[1]),
            ms(timing.phases[2]),
            ms(timing.phases[3]),
        );
    }
}

fn main() {
    // Backends to run, by name; all that are built in when none is given.
    let only: Vec<String> = positional_args();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    println!(
        "| backend | configuration | median step | vs bare | first step | \
         phases: host forward / forward / backward / optimizer (ms) |"
    );
    println!("|---|---|---|---|---|---|");
    #[cfg(feature = "cuda")]
    {
        let widths = [1024, 4096, 4096, 10];
        if wanted("fusion") {
            type B = burn::backend::Autodiff<burn::backend::Cuda>;
            bench_backend::<B>("Cuda (Fusion)", &widths, 512);
        }
        if wanted("cube") {
            type B = burn::backend::Autodiff<
                burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
            >;
            bench_backend::<B>("CubeBackend<Cuda>", &widths, 512);
        }
    }
    if wanted("cpu") {
        type B = burn::backend::Autodiff<burn::backend::Flex>;
        bench_backend::<B>("Flex (CPU)", &[64, 256, 256, 10], 256);
    }
}
