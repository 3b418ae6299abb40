//! What the exact path costs: the same training step through `forward_with` (each replica's
//! backward on its own graph, at the same time) and through `forward_with_captures` (one
//! graph, the caller's backward running every replica's), on one wrapper, interleaved.
//!
//! ```sh
//! cargo bench --bench exact_path                          # CPU (Flex): MLP and ResNet-18
//! cargo bench --features cuda --bench exact_path          # CUDA CubeBackend, benchmark sizes
//! cargo bench --bench exact_path -- resnet18              # one model
//! ```
//!
//! Each round runs `WARM` untimed and `TIMED` timed steps of one path, then of the other (the
//! order alternating between rounds), the device synchronised at the end of every step. A row
//! gives the median over every timed step of all rounds and, in brackets, the range of the
//! rounds' medians: the spread a difference must beat.
//!
//! Environment: `EXACT_PATH_REPLICAS` (default 2, all on the default device),
//! `EXACT_PATH_BATCH` (default: 256 on CUDA, 32 on the CPU), `EXACT_PATH_STEPS="WARM,TIMED"`
//! per round (default `3,20`), `EXACT_PATH_ROUNDS` (default 5).

use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{DataParallel, DataParallelBackend, Mean};

#[path = "common/measure.rs"]
mod measure;
use measure::{list_from_env, median, positional_args};
#[path = "common/models.rs"]
mod models;
use models::*;

/// The step's loss on a replica's shard.
fn loss<B: DataParallelBackend>(
    m: &Model<B>,
    (x, y): (Input<B>, Tensor<B, 1, Int>),
) -> Mean<Tensor<B, 1>> {
    let output = m.forward(x);
    Mean(
        CrossEntropyLossConfig::new()
            .init(&y.device())
            .forward(output, y),
    )
}

/// One training step through the fast path (`exact` false) or the exact one; its time up to
/// the device's end of it.
fn step<B: DataParallelBackend>(
    dp: DataParallel<B, Model<B>>,
    optim: &mut impl Optimizer<DataParallel<B, Model<B>>, B>,
    batch: (Input<B>, Tensor<B, 1, Int>),
    exact: bool,
) -> (DataParallel<B, Model<B>>, Duration) {
    let start = Instant::now();
    let Mean(loss) = match exact {
        false => dp.forward_with(batch, loss),
        true => dp.forward_with_captures(batch, loss),
    };
    let grads = GradientsParams::from_grads(loss.backward(), &dp);
    let dp = optim.step(0.01, dp, grads);
    B::sync(dp.output_device()).expect("sync");
    (dp, start.elapsed())
}

/// Both paths on `model`, round-robin; prints one row per path.
fn compare<B: DataParallelBackend>(backend: &str, model: &str, sizes: Sizes, batch: usize) {
    let replicas = list_from_env("EXACT_PATH_REPLICAS").map_or(2, |r| r[0]);
    let (warm, timed) = match list_from_env("EXACT_PATH_STEPS").as_deref() {
        Some(&[warm, timed]) => (warm, timed),
        _ => (3, 20),
    };
    let rounds = list_from_env("EXACT_PATH_ROUNDS").map_or(5, |r| r[0]);
    let device = B::Device::default();
    let mut dp = DataParallel::new(
        Model::<B>::new(model, sizes, &device),
        vec![device.clone(); replicas],
    )
    .expect("settings");
    let mut optim = SgdConfig::new().init();
    let x = input::<B>(model, sizes, batch, &device);
    let classes = Distribution::Uniform(0.0, CLASSES as f64);
    let y = Tensor::<B, 1, Int>::random([batch], classes, &device);
    // Per path: every timed step, and each round's median.
    let mut times: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    for round in 0..rounds {
        for i in 0..2 {
            let exact = (i + round) % 2 == 1;
            let mut round_times = Vec::new();
            for n in 0..warm + timed {
                let (next, took) = step(dp, &mut optim, (x.clone(), y.clone()), exact);
                dp = next;
                if n >= warm {
                    round_times.push(took);
                }
            }
            let (all, medians) = &mut times[exact as usize];
            medians.push(median(round_times.clone()));
            all.extend(round_times);
            eprintln!("{model} round {round}: exact {exact} {:?}", medians.last());
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let row = |(all, medians): &(Vec<Duration>, Vec<Duration>)| {
        let (low, high) = (medians.iter().min().unwrap(), medians.iter().max().unwrap());
        (ms(median(all.clone())), ms(*low), ms(*high))
    };
    let (fast, exact) = (row(&times[0]), row(&times[1]));
    for (name, (med, low, high)) in [
        ("forward_with (parallel backward)", fast),
        ("forward_with_captures (exact)", exact),
    ] {
        println!(
            "| {backend} | {model} | {batch} | {replicas} | {name} | {med:.2} ms ({low:.2}-{high:.2}) | {:.2}x |",
            med / fast.0
        );
    }
}

fn main() {
    let only = positional_args();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    println!(
        "| backend | model | batch | replicas | path | median step (rounds' medians) | vs parallel |"
    );
    println!("|---|---|---|---|---|---|---|");
    let batch = list_from_env("EXACT_PATH_BATCH").map(|b| b[0]);
    #[cfg(feature = "cuda")]
    {
        type B = burn::backend::Autodiff<
            burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
        >;
        for model in ["mlp", "resnet18"].into_iter().filter(|m| wanted(m)) {
            compare::<B>("burn-cube", model, CUDA_SIZES, batch.unwrap_or(256));
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        type B = burn::backend::Autodiff<burn::backend::Flex>;
        for model in ["mlp", "resnet18"].into_iter().filter(|m| wanted(m)) {
            compare::<B>("flex-cpu", model, CPU_SIZES, batch.unwrap_or(32));
        }
    }
}
