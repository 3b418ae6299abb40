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
//! `plot OUT.svg CSV...` draws the chart of earlier runs' CSV files; `plot-scaling` groups
//! their rows by batch per replica.
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
//! `TRAIN_STEP_OVERLAP=0` reduces the gradients after the replicas' backward, not beside it;
//! `TRAIN_STEP_CSV` writes the results as CSV after every configuration; `TRAIN_STEP_SVG` writes
//! a chart of samples/s, adding rows of the same CSV layout from `TORCH_CSV`
//! (`benches/torch_models.py`). The device is synchronised at the end of every timed step.

use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{DataParallelBackend, DataParallelConfig, Mean};

#[path = "../tests/common/spread.rs"]
mod spread;

#[path = "common/chart.rs"]
mod chart;
#[path = "common/cold_start.rs"]
mod cold_start;
#[path = "common/measure.rs"]
mod measure;
use measure::{list_from_env, median};
#[path = "common/models.rs"]
mod models;
#[path = "common/train_step_rows.rs"]
mod rows;
use chart::{parse_csv, svg};
use cold_start::cold;
use models::*;
use rows::{Row, print_profile, print_row, write_outputs};

/// Devices for `replicas` replicas: the default device for all, or with `TRAIN_STEP_DISTINCT=1`
/// device `i` modulo the backend's device count for replica `i`.
fn replica_devices<B: Backend>(replicas: usize) -> Vec<B::Device> {
    match std::env::var("TRAIN_STEP_DISTINCT").as_deref() {
        Ok("1") => spread::spread::<B>(replicas),
        _ => vec![B::Device::default(); replicas],
    }
}

/// Device memory in use, where the backend can tell.
type MemoryProbe = fn() -> Option<u64>;

/// Memory in use once the queued work (the forward, under Fusion's lazy execution) has run.
fn in_use_after<B: Backend>(device: &B::Device, memory: MemoryProbe) -> Option<u64> {
    B::sync(device).expect("sync");
    memory()
}

/// Times `timed` training steps after `warm_up` of `replicas` replicas (0: the bare model), then
/// two untimed steps that record the stage profile (the second's is kept) and the device
/// memory in use after the forward (activations and parameters; the peak of the step is at
/// that point or in the backward).
///
/// With `interleave` (and replicas), a step of the bare model runs beside every step of the
/// wrapper, before it on even steps and after it on odd ones, and its times come back as a
/// second row: both rows then see the same machine state, so their ratio does not move with
/// the drift between configurations run one after the other.
#[allow(clippy::too_many_arguments)]
fn run<B: DataParallelBackend>(
    backend: &str,
    model: &str,
    sizes: Sizes,
    batch: usize,
    replicas: usize,
    steps: (usize, usize),
    memory: MemoryProbe,
    interleave: bool,
) -> (Row, Option<Row>) {
    let device = B::Device::default();
    let devices = replica_devices::<B>(replicas.max(1));
    let batch = match std::env::var("TRAIN_STEP_SCALE_BATCH").as_deref() {
        Ok("1") if replicas > 0 => batch * replicas,
        _ => batch,
    };
    let x = input::<B>(model, sizes, batch, &device);
    let y =
        Tensor::<B, 1, Int>::random([batch], Distribution::Uniform(0.0, CLASSES as f64), &device);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut optim = SgdConfig::new().init();
    let mut optim_dp = SgdConfig::new().init();
    let mut bare = Model::<B>::new(model, sizes, &device);
    let mut dp = (replicas > 0).then(|| {
        // TRAIN_STEP_SERIAL_BACKWARD=1: every replica's backward on the calling thread.
        let serial = std::env::var("TRAIN_STEP_SERIAL_BACKWARD").as_deref() == Ok("1");
        // TRAIN_STEP_OVERLAP=0: the gradient reduce after the replicas' backward, not beside it.
        let overlap = std::env::var("TRAIN_STEP_OVERLAP").as_deref() != Ok("0");
        DataParallelConfig::new()
            .with_parallel_backward(!serial)
            .with_overlap_reduce(overlap)
            .init(Model::<B>::new(model, sizes, &device), devices.clone())
            .expect("settings")
            .with_running_states_per_device()
    });
    let sync = || B::sync(&device).expect("sync");
    // Marks the end of a phase of the profiled step: waits for every device.
    let mut marks: Vec<Instant> = Vec::new();
    let mark = |profiled: bool, marks: &mut Vec<Instant>| {
        if profiled {
            for device in &devices {
                B::sync(device).expect("sync");
            }
            marks.push(Instant::now());
        }
    };
    let (warm_up, timed) = steps;
    let mut times = Vec::new();
    let mut bare_times = Vec::new();
    let interleave = interleave && dp.is_some();
    let mut peak = None::<u64>;
    let mut profile = None;
    // One step of the bare model beside the wrapper's, timed on its own.
    let bare_step = |bare: Model<B>, optim: &mut _, times: &mut Vec<Duration>| {
        let start = Instant::now();
        let loss = loss_fn.forward(bare.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &bare);
        let bare = Optimizer::step(optim, 0.01, bare, grads);
        sync();
        times.push(start.elapsed());
        bare
    };
    // Two profiled steps at the end, the second reported: under Fusion the stages'
    // synchronisations cut the queued operations at new points, and the first profiled step
    // compiles the fused kernels that makes.
    for i in 0..warm_up + timed + 3 {
        let profiled = i > warm_up + timed;
        if interleave && !profiled && i % 2 == 0 {
            bare = bare_step(bare, &mut optim, &mut bare_times);
        }
        if let (true, Some(dp)) = (profiled, &dp) {
            dp.set_profiling(true);
        }
        let start = Instant::now();
        if profiled {
            marks.clear();
            marks.push(start);
        }
        match dp.take() {
            None => {
                let loss = loss_fn.forward(bare.forward(x.clone()), y.clone());
                let used = profiled
                    .then(|| in_use_after::<B>(&device, memory))
                    .flatten();
                mark(profiled, &mut marks);
                let backward = loss.backward();
                mark(profiled, &mut marks);
                let grads = GradientsParams::from_grads(backward, &bare);
                bare = optim.step(0.01, bare, grads);
                mark(profiled, &mut marks);
                peak = peak.max(used);
            }
            Some(wrapped) => {
                let Mean(loss) = wrapped.forward_with((x.clone(), y.clone()), |m, (x, y)| {
                    Mean(loss_fn.forward(m.forward(x), y))
                });
                let used = profiled
                    .then(|| in_use_after::<B>(&device, memory))
                    .flatten();
                mark(profiled, &mut marks);
                let backward = loss.backward();
                mark(profiled, &mut marks);
                let grads = GradientsParams::from_grads(backward, &wrapped);
                if profiled {
                    profile = wrapped.profile();
                }
                dp = Some(optim_dp.step(0.01, wrapped, grads));
                mark(profiled, &mut marks);
                peak = peak.max(used);
            }
        }
        sync();
        if !profiled {
            times.push(start.elapsed());
        }
        if interleave && !profiled && i % 2 == 1 {
            bare = bare_step(bare, &mut optim, &mut bare_times);
        }
    }
    // The forward phase ends after the memory probe (a synchronisation and a query).
    let phases = (marks.len() == 4).then(|| {
        [
            marks[1] - marks[0],
            marks[2] - marks[1],
            marks[3] - marks[2],
        ]
    });
    let interleaved = interleave.then(|| Row {
        backend: backend.to_string(),
        model: model.to_string(),
        batch,
        config: "bare (interleaved)".to_string(),
        first: bare_times[0],
        median: median(bare_times[1 + warm_up..].to_vec()),
        memory: None,
        profile: None,
        phases: None,
    });
    let row = Row {
        backend: backend.to_string(),
        model: model.to_string(),
        batch,
        config: match replicas {
            0 => "bare".to_string(),
            n => {
                let mut distinct: Vec<&B::Device> = Vec::new();
                for device in &devices {
                    if !distinct.contains(&device) {
                        distinct.push(device);
                    }
                }
                match distinct.len() {
                    1 => format!("DataParallel x{n}"),
                    k => format!("DataParallel x{n} on {k} devices"),
                }
            }
        },
        first: times[0],
        median: median(times[1 + warm_up..].to_vec()),
        memory: peak,
        profile,
        phases,
    };
    (row, interleaved)
}

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

#[cfg(feature = "cuda")]
fn cuda_memory() -> Option<u64> {
    use cubecl::Runtime;
    let client = cubecl::cuda::CudaRuntime::client(&Default::default());
    client.memory_usage().ok().map(|m| m.bytes_in_use)
}

fn main() {
    // `cargo bench` adds `--bench`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if let Some(mode @ ("plot" | "plot-scaling")) = args.first().map(String::as_str) {
        // plot OUT.svg CSV...: the chart of earlier runs' CSV files; plot-scaling groups rows
        // by batch per replica.
        let out = args.get(1).expect("plot OUT.svg CSV...");
        let mut records = Vec::new();
        for path in &args[2..] {
            let text = std::fs::read_to_string(path).expect("read a CSV");
            records.extend(parse_csv(&text));
        }
        std::fs::write(out, svg(&records, mode == "plot-scaling")).expect("write the chart");
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
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
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
