//! `learner`: burn-train's `SupervisedTraining` with the bare model, the wrapper and
//! `MultiDevice` (both optimizer modes), and the wrapper in its own loop, each configuration a
//! process of its own; with as many distinct CUDA devices as replicas, burn-train's `ddp` too
//! (NCCL: one GPU cannot hold two of its ranks).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::optim::{ModuleOptimizer, SgdConfig};
use burn::tensor::Device;
use burn::tensor::distributed::{DistributedConfig, ReduceOperation};
use burn::train::ClassificationOutput;
use burn::train::metric::LossMetric;
use burn::train::{ExecutionStrategy, Learner, LearnerModel, MultiDeviceOptim, SupervisedTraining};
use burn::train::{InferenceStep, TrainStep};
use burn_dataparallel::DataParallel;

use crate::clock::Clock;
use crate::models::{Batch, Net, wrapped_step};
use crate::silent::Silent;
use crate::{Args, median};

/// Epochs per run; the first is the warm-up.
pub const EPOCHS: usize = 3;
/// How long one configuration may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(600);

/// The configurations of one replica count: name, `--config`.
fn configs(replicas: usize) -> Vec<(String, &'static str, usize)> {
    let mut list = vec![("bare Learner".to_string(), "bare", 1)];
    list.push((
        format!("DataParallel x{replicas} under the Learner"),
        "dp",
        replicas,
    ));
    list.push((
        format!("DataParallel x{replicas} in its own loop"),
        "loop",
        replicas,
    ));
    if replicas > 1 {
        list.push((
            format!("MultiDevice x{replicas}, OptimMainDevice"),
            "main",
            replicas,
        ));
        list.push((
            format!("MultiDevice x{replicas}, OptimSharded"),
            "sharded",
            replicas,
        ));
        list.push((format!("ddp x{replicas}"), "ddp", replicas));
    }
    list
}

/// Whether burn-train's `ddp` can run on the first `replicas` devices: distinct CUDA GPUs.
fn ddp_runs(args: &Args, replicas: usize) -> bool {
    let devices = args.replica_devices(replicas);
    let distinct = (1..devices.len()).all(|i| !devices[..i].contains(&devices[i]));
    distinct && devices.iter().all(is_cuda)
}

#[cfg(feature = "cuda")]
fn is_cuda(device: &Device) -> bool {
    use burn::backend::{CubeDevice, DispatchDevice};
    matches!(
        device.clone().inner().as_dispatch(),
        DispatchDevice::Cube(CubeDevice::Cuda(_))
    )
}

#[cfg(not(feature = "cuda"))]
fn is_cuda(_: &Device) -> bool {
    false
}

pub fn run(args: &Args) {
    println!(
        "devices {:?}, {} rounds, {EPOCHS} epochs of {} steps a run (the first epoch not timed), sizes {:?}",
        args.devices.iter().collect::<Vec<_>>(),
        args.rounds,
        args.steps,
        args.sizes()
    );
    println!(
        "| model | rows a step | configuration | samples/s: median (range) | vs bare: median (range) | runs that failed |"
    );
    println!("|---|---|---|---|---|---|");
    // Each wrapper process's profiled step (`stages`), printed after the tables.
    let mut notes = Vec::new();
    for model in &args.models {
        for &replicas in &args.replicas {
            let configs: Vec<_> = configs(replicas)
                .into_iter()
                .filter(|(_, key, _)| {
                    args.configs.is_empty() || args.configs.iter().any(|c| c == key)
                })
                .filter(|(name, key, _)| {
                    let runs = *key != "ddp" || ddp_runs(args, replicas);
                    if !runs {
                        println!("{model}: {name} left out (needs {replicas} distinct CUDA GPUs)");
                    }
                    runs
                })
                .collect();
            let mut results: Vec<Vec<Option<f64>>> = vec![Vec::new(); configs.len()];
            for round in 0..args.rounds {
                for k in 0..configs.len() {
                    let i = (k + round) % configs.len();
                    let (name, config, count) = &configs[i];
                    let result = spawn(args, model, config, *count, replicas, &mut notes);
                    if result.is_none() {
                        eprintln!("{model} {name}, round {round}: failed (its output above)");
                    }
                    results[i].push(result);
                }
            }
            report(model, args.rows(model, replicas), &configs, &results);
        }
    }
    for note in notes {
        println!("{note}");
    }
}

fn report(
    model: &str,
    rows: usize,
    configs: &[(String, &str, usize)],
    results: &[Vec<Option<f64>>],
) {
    // The ratios are to the first configuration: the bare Learner where it ran.
    let bare = &results[0];
    for ((name, _, _), runs) in configs.iter().zip(results) {
        let done: Vec<f64> = runs.iter().flatten().copied().collect();
        let failed = runs.len() - done.len();
        if done.is_empty() {
            println!(
                "| {model} | {rows} | {name} | failed | | {failed} of {} |",
                runs.len()
            );
            continue;
        }
        let ratios: Vec<f64> = runs
            .iter()
            .zip(bare)
            .filter_map(|(r, b)| Some(r.as_ref()? / b.as_ref()?))
            .collect();
        let (lo, hi) = spread(&done);
        let vs = match ratios.is_empty() {
            true => "—".to_string(),
            false => {
                let (rlo, rhi) = spread(&ratios);
                format!("{:.3} ({rlo:.3}–{rhi:.3})", median(ratios.clone()))
            }
        };
        println!(
            "| {model} | {rows} | {name} | {:.0} ({lo:.0}–{hi:.0}) | {vs} | {failed} of {} |",
            median(done.clone()),
            runs.len()
        );
    }
}

fn spread(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(*v), h.max(*v)))
}

/// One configuration in a child process: its samples per second, `None` if it failed or
/// ran past [`LIMIT`].
fn spawn(
    args: &Args,
    model: &str,
    config: &str,
    count: usize,
    replicas: usize,
    notes: &mut Vec<String>,
) -> Option<f64> {
    let mut command = Command::new(std::env::current_exe().ok()?);
    command
        .args(["learner-child", "--models", model, "--config", config])
        .args(["--count", &count.to_string()])
        .args(["--steps", &args.steps.to_string()])
        .args(["--batch", &args.rows(model, replicas).to_string()])
        .args(["--devices", &args.devices.text])
        .stdout(Stdio::piped());
    if let Some(sizes) = args.sizes {
        command.args(["--sizes", &format!("{sizes:?}").to_lowercase()]);
    }
    let mut child = command.spawn().ok()?;
    let deadline = Instant::now() + LIMIT;
    loop {
        match child.try_wait().ok()? {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!("{model} {config} x{count}: killed after {LIMIT:?}");
                return None;
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let output = child.wait_with_output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // The wrapper's stage profile and gradient sum (`stages`), printed after the table.
    for line in text.lines() {
        if line.starts_with("profile ") || line.starts_with("reduce ") {
            notes.push(format!("{model} {config} x{count}: {line}"));
        }
    }
    text.lines()
        .find_map(|line| line.strip_prefix("samples/s ")?.trim().parse().ok())
        .filter(|_| output.status.success())
}

/// `learner-child`: one run, printing `samples/s N`.
pub fn child(args: &Args) {
    let model = &args.models[0];
    let sizes = args.sizes();
    let devices = args.replica_devices(args.count);
    let main = devices[0].clone();
    let rows = args.batch(model);
    let net = Net::new(model, sizes, &main);
    let features = Net::features(model, sizes);
    let clock = Clock::default();
    let dir = tempfile::tempdir().expect("a temporary folder");
    // MultiDevice and ddp take one batch per device a step: the same rows a step as the others.
    let (strategy, rows, batches) = match args.config.as_str() {
        "bare" | "dp" | "loop" => (ExecutionStrategy::SingleDevice(main), rows, args.steps),
        other => {
            let strategy = match other {
                "main" => ExecutionStrategy::MultiDevice(
                    devices.clone(),
                    MultiDeviceOptim::OptimMainDevice,
                ),
                "sharded" => {
                    ExecutionStrategy::MultiDevice(devices.clone(), MultiDeviceOptim::OptimSharded)
                }
                // The gradients' mean: each rank's loss is of its own rows.
                _ => ExecutionStrategy::ddp(
                    devices.clone(),
                    DistributedConfig {
                        all_reduce_op: ReduceOperation::Mean,
                    },
                ),
            };
            (strategy, rows / args.count, args.steps * args.count)
        }
    };
    let samples_per_s = match args.config.as_str() {
        "dp" => {
            let dp = DataParallel::new(net, devices.clone()).expect("the devices exist");
            let samples_per_s = train(
                dp.clone(),
                strategy,
                rows,
                features,
                batches,
                dir.path(),
                &clock,
            );
            crate::stages::print(&dp, rows, features, &devices);
            samples_per_s
        }
        "loop" => {
            let dp = DataParallel::new(net, devices.clone()).expect("the devices exist");
            own_loop(dp, rows, features, batches, &devices)
        }
        _ => train(net, strategy, rows, features, batches, dir.path(), &clock),
    };
    println!("samples/s {samples_per_s}");
}

/// Trains `model` for [`EPOCHS`] epochs of `batches` batches of `rows` rows; samples per
/// second over the epochs after the first.
fn train<M>(
    model: M,
    strategy: ExecutionStrategy,
    rows: usize,
    features: usize,
    batches: usize,
    dir: &std::path::Path,
    clock: &Clock,
) -> f64
where
    M: LearnerModel
        + TrainStep<Input = Batch, Output = ClassificationOutput>
        + InferenceStep<Input = Batch, Output = ClassificationOutput>,
{
    let device = strategy.main_device().clone();
    let loader = |items: usize| {
        DataLoaderBuilder::new(RandomBatcher { features })
            .batch_size(rows)
            .set_device(device.clone())
            .build(InMemDataset::new((0..items).collect::<Vec<usize>>()))
    };
    SupervisedTraining::new(dir, loader(rows * batches), loader(rows))
        .with_training_strategy(strategy.into())
        .with_application_logger(None)
        .renderer(Box::new(Silent))
        .with_progress_logger(clock.clone())
        .metric_train_numeric(LossMetric::new())
        .num_epochs(EPOCHS)
        .launch(Learner::new(model, SgdConfig::new().init(), 0.01));
    clock.samples_per_s()
}

/// The wrapper in the README's loop, on what the Learner gets: [`EPOCHS`] epochs of
/// `batches` fresh random batches of `rows` rows, the loss read each step as the Learner's
/// loss metric reads it; samples per second over the epochs after the first.
fn own_loop(
    mut dp: DataParallel<Net>,
    rows: usize,
    features: usize,
    batches: usize,
    devices: &[Device],
) -> f64 {
    let mut optim: ModuleOptimizer = SgdConfig::new().init();
    let mut timed = Duration::ZERO;
    for epoch in 0..EPOCHS {
        let start = Instant::now();
        for _ in 0..batches {
            let batch = Batch::random(rows, features, &devices[0]);
            let (stepped, loss) = wrapped_step(dp, batch, &mut optim);
            dp = stepped;
            loss.into_scalar::<f32>();
        }
        for device in devices {
            device.sync().expect("the device runs the epoch");
        }
        if epoch > 0 {
            timed += start.elapsed();
        }
    }
    (rows * batches * (EPOCHS - 1)) as f64 / timed.as_secs_f64()
}

#[derive(Clone)]
struct RandomBatcher {
    features: usize,
}

impl Batcher<usize, Batch> for RandomBatcher {
    fn batch(&self, items: Vec<usize>, device: &Device) -> Batch {
        Batch::random(items.len(), self.features, device)
    }
}
