//! One configuration of `benches/train_step.rs`: its timed steps, the interleaved bare steps
//! beside them, the stage profile and the memory in use.

use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{DataParallelBackend, DataParallelConfig, Mean};

use crate::measure::median;
use crate::models::*;
use crate::rows::Row;

/// Devices for `replicas` replicas: the default device for all, or with `TRAIN_STEP_DISTINCT=1`
/// device `i` modulo the backend's device count for replica `i`.
fn replica_devices<B: Backend>(replicas: usize) -> Vec<B::Device> {
    match std::env::var("TRAIN_STEP_DISTINCT").as_deref() {
        Ok("1") => dataparallel_dev::spread::<B>(replicas),
        _ => vec![B::Device::default(); replicas],
    }
}

/// Device memory in use, where the backend can tell.
pub type MemoryProbe = fn() -> Option<u64>;

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
pub fn run<B: DataParallelBackend>(
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
        // TRAIN_STEP_OVERLAP=1: the gradient reduce beside the replicas' backward.
        let overlap = std::env::var("TRAIN_STEP_OVERLAP").as_deref() == Ok("1");
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
                    Mean(
                        CrossEntropyLossConfig::new()
                            .init(&y.device())
                            .forward(m.forward(x), y),
                    )
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
