//! Training-step time of three models (an MLP, a ResNet-18 and a small transformer encoder),
//! bare and through `DataParallel` with 1, 2 and 4 replicas on one device, at two batch sizes;
//! samples/s, device memory, and the stage profile of one step.
//!
//! ```sh
//! cargo bench --bench train_step                   # CPU (Flex), small shapes
//! cargo bench --features cuda --bench train_step   # CUDA (Fusion), benchmark shapes
//! cargo bench --features cuda --bench train_step -- cube mlp   # CubeBackend, MLP only
//! ```
//!
//! `cold BACKEND MODEL REPLICAS BATCH` (backend `fusion` or `cube` on CUDA, `wgpu` or `flex`
//! otherwise; `REPLICAS` 0 for the bare model) instead measures one fresh process: time from the start of `main` to the end of each
//! of the first steps (the first through `DataParallel::warm_up` when `REPLICAS` > 0), and
//! when steps reach steady state (within 1.5x of the median of the last ten of 40).
//!
//! `plot OUT.svg CSV...` draws the bar chart of earlier runs' CSV files (this bench's,
//! `benches/strategies.rs`'s and `benches/torch_models.py`'s); `plot-scaling` groups their rows
//! by batch per replica; `plot-speedup` draws speed-up against the replica count per strategy
//! (rows of runs whose batch grows with the replicas), `plot-speedup-global` the same at one
//! global batch (replicas sharing a device). `CHART_TITLE` replaces the title.
//!
//! `resnet18-nobn`, run only when named, is the ResNet-18 without batch norm: a diagnostic for
//! running states on several GPUs (`benches/RESULTS.md`).
//!
//! Repeating a configuration in `TRAIN_STEP_REPLICAS` (e.g. `0,1,0,1`) measures it again in the
//! same process, which shows how much rows vary. `TRAIN_STEP_INTERLEAVE=1` runs a step of the
//! bare model beside every step of the wrapper and compares the two ("bare (interleaved)"
//! rows): the measure for small overheads such as one replica's, which drift between
//! configurations run one after the other would hide.
//!
//! On several GPUs: `TRAIN_STEP_DISTINCT=1` puts replica `i` on device `i` modulo the device
//! count, and `TRAIN_STEP_SCALE_BATCH=1` multiplies the batch by the replica count, so that
//! the per-replica batch stays that of the bare row (a scaling run).
//!
//! Environment: `TRAIN_STEP_STEPS="WARM,TIMED"` sets the steps per configuration (10,30 on
//! CUDA); `TRAIN_STEP_BATCHES` (e.g. `64,256`) keeps only those of the models' batch sizes;
//! `TRAIN_STEP_REPLICAS` (default `0,1,2,4`; 0 is the bare model) picks the configurations;
//! `TRAIN_STEP_SERIAL_BACKWARD=1` runs every replica's backward on the calling thread;
//! `TRAIN_STEP_OVERLAP=1` reduces the gradients beside the replicas' backward
//! (`DataParallelConfig::overlap_reduce`), `0` after it (the default);
//! `TRAIN_STEP_CSV` writes the results as CSV after every configuration; `TRAIN_STEP_SVG` writes
//! a chart of samples/s, adding rows of the same CSV layout from `TORCH_CSV`
//! (`benches/torch_models.py`). The device is synchronised at the end of every timed step.

use burn_dataparallel::DataParallelBackend;

#[path = "common/chart.rs"]
mod chart;
#[path = "common/cold_start.rs"]
mod cold_start;
#[path = "common/measure.rs"]
mod measure;
#[cfg(feature = "cuda")]
use measure::cuda_memory;
use measure::{list_from_env, positional_args};
#[path = "common/models.rs"]
mod models;
#[path = "common/train_step_rows.rs"]
mod rows;
#[path = "common/train_step_run.rs"]
mod run;
use cold_start::cold;
use models::*;
use rows::{Row, print_profile, print_row, write_outputs};
use run::{MemoryProbe, run};

/// Every model, batch size and configuration on one backend.
fn bench_backend<B: DataParallelBackend>(
    backend: &str,
    sizes: Sizes,
    batches: &[(&str, [usize; 2])],
    steps: (usize, usize),
    memory: MemoryProbe,
    rows: &mut Vec<Row>,
) {
    let batch_filter = list_from_env("TRAIN_STEP_BATCHES");
    let replica_counts = list_from_env("TRAIN_STEP_REPLICAS").unwrap_or_else(|| vec![0, 1, 2, 4]);
    let interleave = std::env::var("TRAIN_STEP_INTERLEAVE").as_deref() == Ok("1");
    for (model, batch_sizes) in batches {
        for &batch in batch_sizes {
            if batch_filter
                .as_ref()
                .is_some_and(|list| !list.contains(&batch))
            {
                continue;
            }
            let mut bare = None;
            for &replicas in &replica_counts {
                let (row, interleaved) = run::<B>(
                    backend, model, sizes, batch, replicas, steps, memory, interleave,
                );
                if let Some(interleaved) = interleaved {
                    // The wrapper's row is compared with the bare steps beside it.
                    print_row(&interleaved, None);
                    bare = Some(interleaved.samples_per_s());
                    rows.push(interleaved);
                }
                if replicas == 0 {
                    bare = Some(row.samples_per_s());
                }
                print_row(&row, bare);
                print_profile(&row);
                rows.push(row);
                write_outputs(rows);
            }
        }
    }
}

/// Warm-up and timed steps per configuration: `TRAIN_STEP_STEPS="WARM,TIMED"` or `default`.
fn steps_from_env(default: (usize, usize)) -> (usize, usize) {
    match list_from_env("TRAIN_STEP_STEPS").as_deref() {
        None => default,
        Some(&[warm, timed]) if timed > 0 => (warm, timed),
        Some(other) => panic!("TRAIN_STEP_STEPS is \"WARM,TIMED\" with TIMED > 0, not {other:?}"),
    }
}

fn main() {
    // `cargo bench` adds `--bench`.
    let args: Vec<String> = positional_args();
    if let Some(mode) = args.first().filter(|a| a.starts_with("plot")) {
        chart::plot(mode, &args[1..]);
        return;
    }
    if args.first().map(String::as_str) == Some("cold") {
        let arg = |i: usize| {
            args.get(i)
                .expect("cold BACKEND MODEL REPLICAS BATCH")
                .as_str()
        };
        let replicas: usize = arg(3).parse().expect("replica count");
        let batch: usize = arg(4).parse().expect("batch size");
        #[cfg(feature = "cuda")]
        {
            let sizes = CUDA_SIZES;
            match arg(1) {
                "cube" => cold::<
                    burn::backend::Autodiff<
                        burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
                    >,
                >(arg(2), sizes, replicas, batch),
                _ => cold::<burn::backend::Autodiff<burn::backend::Cuda>>(
                    arg(2),
                    sizes,
                    replicas,
                    batch,
                ),
            }
        }
        #[cfg(not(feature = "cuda"))]
        {
            let sizes = CPU_SIZES;
            match arg(1) {
                // CubeCL's wgpu runtime (Mesa's lavapipe without a GPU): its caches show which
                // operations compile and autotune, as on CUDA.
                "wgpu" => cold::<burn::backend::Autodiff<burn::backend::Wgpu>>(
                    arg(2),
                    sizes,
                    replicas,
                    batch,
                ),
                _ => cold::<burn::backend::Autodiff<burn::backend::Flex>>(
                    arg(2),
                    sizes,
                    replicas,
                    batch,
                ),
            }
        }
        return;
    }
    let only: Vec<String> = positional_args();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let models = |list: &[(&'static str, [usize; 2])]| -> Vec<(&'static str, [usize; 2])> {
        let picked: Vec<_> = list.iter().filter(|(m, _)| wanted(m)).copied().collect();
        if picked.is_empty() {
            // Diagnostic variants run only when named.
            let main = list.iter().filter(|(m, _)| !m.ends_with("-nobn"));
            main.copied().collect()
        } else {
            picked
        }
    };
    println!(
        "| backend | model | batch | configuration | median step | samples/s | vs bare | \
         first step | memory after forward | profile: scatter / replicate / slowest forward / \
         running states / gather (ms) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    #[cfg(feature = "cuda")]
    {
        let sizes = CUDA_SIZES;
        let batches = models(&[
            ("mlp", [256, 1024]),
            ("resnet18", [64, 256]),
            ("resnet18-nobn", [64, 256]),
            ("encoder", [32, 128]),
        ]);
        let steps = steps_from_env((10, 30));
        if wanted("fusion") || !wanted("cube") {
            type B = burn::backend::Autodiff<burn::backend::Cuda>;
            bench_backend::<B>(
                "burn-fusion",
                sizes,
                &batches,
                steps,
                cuda_memory,
                &mut rows,
            );
        }
        if wanted("cube") {
            type B = burn::backend::Autodiff<
                burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
            >;
            bench_backend::<B>("burn-cube", sizes, &batches, steps, cuda_memory, &mut rows);
        }
    }
    if wanted("cpu") || cfg!(not(feature = "cuda")) {
        type B = burn::backend::Autodiff<burn::backend::Flex>;
        let sizes = CPU_SIZES;
        let batches = models(&[
            ("mlp", [64, 256]),
            ("resnet18", [8, 16]),
            ("resnet18-nobn", [8, 16]),
            ("encoder", [8, 16]),
        ]);
        let steps = steps_from_env((2, 5));
        bench_backend::<B>("flex-cpu", sizes, &batches, steps, || None, &mut rows);
    }
}
