//! What replicas on distinct devices of a backend without device-to-device copies cost: an
//! MLP training step on CubeCL's wgpu runtime, bare, with two replicas sharing one device,
//! and with a replica on each listed device (every parameter, shard, output and gradient
//! moved through host memory): with even shards, with static shard weights
//! (`HOST_STAGED_WEIGHTS`, e.g. `3,1`, the output device first) and with adaptive shards
//! (`DataParallelConfig::adaptive_shards`), in interleaved rounds. Then the move itself: the
//! parameters' bytes read from the first device and written to the second, one piece at a
//! time (`bytes_moved` says how many), timed apart (`transfer` alone runs only that).
//!
//! ```sh
//! cargo bench --bench host_staged                      # lavapipe: DefaultDevice and Cpu
//! DATAPARALLEL_WGPU_DEVICES=default,discrete:0 cargo bench --bench host_staged -- large
//! ```
//!
//! `large` trains the MLP 1024-4096-4096-10 at batch 512 (a GPU's size); the default is
//! 256-512-512-10 at batch 64 (lavapipe's). `HOST_STAGED_ROUNDS` (5) rounds of
//! `HOST_STAGED_STEPS` (10) timed steps per configuration, after `HOST_STAGED_WARMUP` (3)
//! untimed ones. Prints, per configuration, the median step and the range of the rounds'
//! medians, the CPU time per step of the calling thread and of the whole process (a step
//! whose calling thread is busy all along is bound by the host's work, not the device's),
//! the bytes moved between devices per step (`bytes_moved`), each round's median, and the
//! stage profile of one profiled step; the last table compares the distinct devices with one
//! device.

use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{
    AdaptiveShardsConfig, DataParallel, DataParallelConfig, Mean, bytes_moved,
};

#[allow(dead_code)]
#[path = "common/measure.rs"]
mod measure;
use measure::{median, positional_args};
#[allow(dead_code)]
#[path = "common/models.rs"]
mod models;
use models::Mlp;
#[path = "common/host_transfers.rs"]
mod host_transfers;
use host_transfers::transfers;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::{process_cpu, thread_cpu};

type B = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;

/// One configuration: the bare model (`None`) or the wrapper over these devices, with these
/// settings.
struct Config {
    label: String,
    devices: Option<Vec<WgpuDevice>>,
    settings: DataParallelConfig,
}

type Inner = CubeBackend<WgpuRuntime, f32, i32, u32>;
type Sgd<M> = OptimizerAdaptor<burn::optim::Sgd<Inner>, M, B>;

/// The bare model or the wrapper, with its optimizer.
enum Model {
    Bare(Mlp<B>, Sgd<Mlp<B>>),
    Wrapped(DataParallel<B, Mlp<B>>, Sgd<DataParallel<B, Mlp<B>>>),
}

/// A model and a batch, ready to step.
struct Run {
    model: Option<Model>,
    x: Tensor<B, 2>,
    y: Tensor<B, 1, Int>,
}

impl Run {
    fn new(config: &Config, widths: &[usize], batch: usize) -> Self {
        let device = WgpuDevice::DefaultDevice;
        let classes = *widths.last().expect("widths");
        let x = Tensor::random([batch, widths[0]], Distribution::Default, &device);
        let y = Tensor::random([batch], Distribution::Uniform(0.0, classes as f64), &device);
        let model = Mlp::<B>::new(widths, &device);
        let model = match &config.devices {
            None => Model::Bare(model, SgdConfig::new().init()),
            Some(devices) => Model::Wrapped(
                (config.settings.init(model, devices.clone())).expect("wrapper"),
                SgdConfig::new().init(),
            ),
        };
        Self {
            model: Some(model),
            x,
            y,
        }
    }

    fn wrapper(&self) -> Option<&DataParallel<B, Mlp<B>>> {
        match &self.model {
            Some(Model::Wrapped(dp, _)) => Some(dp),
            _ => None,
        }
    }

    /// One training step, synchronised on every device at the end.
    fn step(&mut self) {
        let loss_fn = CrossEntropyLossConfig::new().init(&WgpuDevice::DefaultDevice);
        let (x, y) = (self.x.clone(), self.y.clone());
        self.model = Some(match self.model.take().expect("a model") {
            Model::Bare(bare, mut optim) => {
                let loss = loss_fn.forward(bare.forward(x), y);
                let grads = GradientsParams::from_grads(loss.backward(), &bare);
                Model::Bare(optim.step(0.01, bare, grads), optim)
            }
            Model::Wrapped(dp, mut optim) => {
                let Mean(loss) = dp.forward_with((x, y), |m, (x, y)| {
                    Mean(
                        CrossEntropyLossConfig::new()
                            .init(&y.device())
                            .forward(m.forward(x), y),
                    )
                });
                let grads = GradientsParams::from_grads(loss.backward(), &dp);
                let dp = optim.step(0.01, dp, grads);
                for device in dp.replica_devices() {
                    B::sync(device).expect("sync");
                }
                Model::Wrapped(dp, optim)
            }
        });
        B::sync(&WgpuDevice::DefaultDevice).expect("sync");
    }
}

fn main() {
    let args = positional_args();
    let (widths, batch) = match args.iter().any(|a| a == "large") {
        true => (vec![1024, 4096, 4096, 10], 512),
        false => (vec![256, 512, 512, 10], 64),
    };
    if std::env::var_os("CUBECL_AUTOTUNE_LEVEL").is_none() {
        // SAFETY: before any CubeCL use, on the only thread.
        unsafe { std::env::set_var("CUBECL_AUTOTUNE_LEVEL", "minimal") };
    }
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (rounds, steps) = (env("HOST_STAGED_ROUNDS", 5), env("HOST_STAGED_STEPS", 10));
    let warmup = env("HOST_STAGED_WARMUP", 3);
    let distinct = dataparallel_dev::wgpu_devices();
    let first = distinct[0].clone();
    if args.iter().any(|a| a == "transfer") {
        return transfers(&widths, &distinct);
    }
    let n = distinct.len();
    let plain = |label: &str, devices: Option<Vec<WgpuDevice>>| Config {
        label: label.to_string(),
        devices,
        settings: DataParallelConfig::new(),
    };
    let mut configs = vec![
        plain("bare", None),
        // The bare model on one replica's shard: what each replica's share costs alone.
        plain("bare, one replica's share", None),
        plain("2 replicas, one device", Some(vec![first.clone(), first])),
        plain(
            &format!("{n} replicas, distinct devices, even shards"),
            Some(distinct.clone()),
        ),
    ];
    if let Ok(weights) = std::env::var("HOST_STAGED_WEIGHTS") {
        let weights: Vec<f64> = (weights.split(','))
            .map(|w| w.trim().parse().expect("a weight"))
            .collect();
        configs.push(Config {
            label: format!("{n} replicas, distinct devices, weights {weights:?}"),
            devices: Some(distinct.clone()),
            settings: DataParallelConfig::new().with_shard_weights(Some(weights)),
        });
    }
    configs.push(Config {
        label: format!("{n} replicas, distinct devices, adaptive shards"),
        devices: Some(distinct.clone()),
        settings: DataParallelConfig::new().with_adaptive_shards(Some(AdaptiveShardsConfig::new())),
    });
    println!("MLP {widths:?}, batch {batch}, devices {distinct:?}");
    let mut runs: Vec<Run> = (configs.iter().enumerate())
        .map(|(c, config)| Run::new(config, &widths, if c == 1 { batch / n } else { batch }))
        .collect();
    // Warm-up: compilation and autotune for every configuration.
    for run in &mut runs {
        for _ in 0..warmup {
            run.step();
        }
        if let Some(weights) = run.wrapper().and_then(DataParallel::adaptive_weights) {
            println!("adaptive weights after the warm-up: {weights:?}");
        }
    }
    let mut medians: Vec<Vec<Duration>> = vec![Vec::new(); runs.len()];
    let mut moved: Vec<u64> = vec![0; runs.len()];
    let mut cpu = vec![(Duration::ZERO, Duration::ZERO); runs.len()];
    for _ in 0..rounds {
        for (c, run) in runs.iter_mut().enumerate() {
            let before = bytes_moved();
            let cpu_before = (thread_cpu(), process_cpu());
            let mut times = Vec::with_capacity(steps);
            for _ in 0..steps {
                let start = Instant::now();
                run.step();
                times.push(start.elapsed());
            }
            if let ((Some(t0), Some(p0)), Some(t1), Some(p1)) =
                (cpu_before, thread_cpu(), process_cpu())
            {
                cpu[c].0 += t1 - t0;
                cpu[c].1 += p1 - p0;
            }
            moved[c] += bytes_moved() - before;
            medians[c].push(median(times));
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| configuration | step (median of rounds) | rounds' range | CPU per step: calling \
         thread, process | bytes moved per step |"
    );
    println!("|---|---|---|---|---|");
    let per_step = |d: Duration| ms(d) / (rounds * steps) as f64;
    let mut summary = Vec::new();
    for (c, config) in configs.iter().enumerate() {
        let lo = medians[c].iter().min().copied().unwrap_or_default();
        let hi = medians[c].iter().max().copied().unwrap_or_default();
        let mid = median(medians[c].clone());
        summary.push((mid, lo, hi));
        println!(
            "| {} | {:.2} ms | {:.2}-{:.2} ms | {:.2}, {:.2} ms | {} |",
            config.label,
            ms(mid),
            ms(lo),
            ms(hi),
            per_step(cpu[c].0),
            per_step(cpu[c].1),
            moved[c] / (rounds * steps) as u64
        );
    }
    for (c, config) in configs.iter().enumerate() {
        let each: Vec<String> = medians[c]
            .iter()
            .map(|d| format!("{:.2}", ms(*d)))
            .collect();
        println!("rounds' medians, {}: {} ms", config.label, each.join(", "));
    }
    // One profiled step of each wrapper configuration: where the distinct devices' time goes.
    for (c, run) in runs.iter_mut().enumerate() {
        let Some(dp) = run.wrapper() else { continue };
        dp.set_profiling(true);
        run.step();
        let dp = run.wrapper().expect("a wrapper");
        if let Some(profile) = dp.profile() {
            println!("profile, {}: {profile}", configs[c].label);
        }
        if let Some(weights) = dp.adaptive_weights() {
            println!(
                "adaptive weights after the run, {}: {weights:?}",
                configs[c].label
            );
        }
        dp.set_profiling(false);
    }
    let (one, distinct) = (summary[2], summary[3]);
    println!(
        "distinct devices against one device: {:.2}x the step ({:.2} against {:.2} ms; \
         rounds {:.2}-{:.2} against {:.2}-{:.2}); the difference, {:.2} ms, is {:.0} % of the step",
        distinct.0.as_secs_f64() / one.0.as_secs_f64(),
        ms(distinct.0),
        ms(one.0),
        ms(distinct.1),
        ms(distinct.2),
        ms(one.1),
        ms(one.2),
        ms(distinct.0) - ms(one.0),
        100.0 * (ms(distinct.0) - ms(one.0)).max(0.0) / ms(distinct.0)
    );
}
