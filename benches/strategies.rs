//! Training-step time of one model at one global batch, for each way a Burn user can spread it
//! over N devices: the bare model under burn-train's `Learner` on one device; `DataParallel`
//! with N replicas, in a hand-written loop and under the `Learner` (the model's own
//! `TrainStep` on every replica); and burn-train 0.21's `ExecutionStrategy::MultiDevice` over
//! the same N devices, with both optimizer modes (`OptimMainDevice`, `OptimSharded`).
//!
//! ```sh
//! cargo bench --bench strategies                       # CPU (Flex), small shapes
//! cargo bench --features cuda --bench strategies       # CUDA (CubeBackend), benchmark shapes
//! cargo bench --bench strategies -- resnet18 encoder   # only those models
//! ```
//!
//! Every configuration trains the same model (`benches/common/models.rs`) from the same
//! parameters on the same global batch per step: the bare model and the wrapper take batches
//! of `G`, `MultiDevice` one batch of `G / N` per device per step (burn-train splits the
//! data loader over the devices). The model's `TrainStep` notes when it starts (after waiting
//! for its device, so that queued work does not hide in the next step); a step's time is the
//! time between two steps' starts, the optimizer and the data loader included. Configurations
//! run round-robin, `STRATEGIES_ROUNDS` times (default 3), so that every one sees the same
//! drift of the machine: each row gives the median step time over all rounds and the range of
//! the rounds' medians, which is the spread a difference must beat. "Calling thread's CPU per
//! step" is the CPU time of the thread that runs the loop (the `Learner`'s or the own loop's)
//! over the whole run, divided by its steps: what is left on that thread when the replicas'
//! work runs on theirs (Unix only).
//!
//! Devices: replica `i` on device `i` modulo the device count (the one CPU device, one GPU
//! listed N times, or N GPUs). Where a strategy cannot run in a configuration, its row says
//! why. burn-train 0.21's DDP strategy is not among the rows: it needs `DistributedBackend`,
//! which Burn 0.21 implements only for CubeCL backends (not the CPU's), and burn-train's
//! `ddp` feature (burn-collective, NCCL on CUDA), which this crate does not build.
//!
//! Environment: `STRATEGIES_REPLICAS` (default `2,4`), `STRATEGIES_STEPS="WARM,TIMED"`
//! (default `3,10` on the CPU, `5,20` on CUDA), `STRATEGIES_BATCH` (the global batch; default
//! the model's `train_step` batch), `STRATEGIES_ROUNDS`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};
use burn::train::{
    ClassificationOutput, ExecutionStrategy, InferenceStep, Learner, MultiDeviceOptim,
    SupervisedTraining, TrainOutput, TrainStep,
};
use burn_dataparallel::{DataParallel, DataParallelBackend, Mean, impl_scatter};

#[path = "common/models.rs"]
mod models;
#[path = "../tests/common/silent.rs"]
mod silent;
#[path = "../tests/common/spread.rs"]
mod spread;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;
use models::*;
use silent::Silent;
use thread_cpu::thread_cpu;

/// One batch: the model's input and its class targets.
#[derive(Clone, Debug)]
pub struct Batch<B: Backend> {
    pub input: Input<B>,
    pub targets: Tensor<B, 1, Int>,
}
impl_scatter!(Batch<B> { input, targets });

impl<B: Backend> Model<B> {
    fn classify(&self, batch: Batch<B>) -> ClassificationOutput<B> {
        let output = self.forward(batch.input);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, output, batch.targets)
    }
}

/// When each call of the model's `TrainStep` started, and the most device memory in use seen
/// after a forward.
static STARTS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
static PEAK: Mutex<Option<u64>> = Mutex::new(None);
static MEMORY: Mutex<MemoryProbe> = Mutex::new(no_memory);

/// Device memory in use, where the backend can tell.
type MemoryProbe = fn() -> Option<u64>;

fn no_memory() -> Option<u64> {
    None
}

impl<B: AutodiffBackend> TrainStep for Model<B> {
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: Batch<B>) -> TrainOutput<ClassificationOutput<B>> {
        B::sync(&batch.targets.device()).expect("sync");
        STARTS.lock().unwrap().push(Instant::now());
        let item = self.classify(batch);
        let memory = (*MEMORY.lock().unwrap())();
        let mut peak = PEAK.lock().unwrap();
        *peak = (*peak).max(memory);
        drop(peak);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Model<B> {
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: Batch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

/// Random batches for one model: an item is only a seed, the batch is drawn on the device.
#[derive(Clone)]
struct Random {
    model: String,
    sizes: Sizes,
}

impl<B: Backend> Batcher<B, u64, Batch<B>> for Random {
    fn batch(&self, items: Vec<u64>, device: &B::Device) -> Batch<B> {
        let n = items.len();
        Batch {
            input: input::<B>(&self.model, self.sizes, n, device),
            targets: Tensor::random([n], Distribution::Uniform(0.0, CLASSES as f64), device),
        }
    }
}

/// The ways of training that the bench compares.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Strategy {
    /// The bare model under the `Learner`, on one device.
    Bare,
    /// `DataParallel` in a hand-written loop (`forward_with`, the gathered loss's backward).
    WrapperLoop,
    /// `DataParallel` under the `Learner` (the model's own `TrainStep` on every replica).
    WrapperLearner,
    /// burn-train's `MultiDevice`, optimizer on the main device.
    MultiDeviceMain,
    /// burn-train's `MultiDevice`, optimizer sharded over the devices.
    MultiDeviceSharded,
}

impl Strategy {
    fn name(self, n: usize) -> String {
        match self {
            Strategy::Bare => "bare, Learner".into(),
            Strategy::WrapperLoop => format!("DataParallel x{n}, own loop"),
            Strategy::WrapperLearner => format!("DataParallel x{n}, Learner"),
            Strategy::MultiDeviceMain => format!("MultiDevice x{n}, OptimMainDevice"),
            Strategy::MultiDeviceSharded => format!("MultiDevice x{n}, OptimSharded"),
        }
    }
}

/// One configuration of one model.
struct Config {
    strategy: Strategy,
    replicas: usize,
    /// Each round's step times, or why the configuration could not run.
    rounds: Result<Vec<Vec<Duration>>, String>,
    /// Each round's CPU time of the calling thread per step.
    cpu: Vec<Duration>,
    memory: Option<u64>,
}

/// What the bench runs for one model on one backend.
struct Setup<B: Backend> {
    model: String,
    sizes: Sizes,
    batch: usize,
    steps: (usize, usize),
    template: Model<B>,
}

impl<B: DataParallelBackend> Setup<B> {
    /// A fresh copy of the one model every configuration starts from.
    fn model(&self) -> Model<B> {
        self.template.clone()
    }

    fn random(&self) -> Random {
        Random {
            model: self.model.clone(),
            sizes: self.sizes,
        }
    }

    /// Trains `warm + timed` steps in one of the ways; the step times after the warm-up, and
    /// the calling thread's CPU time per step over the whole run (setup included).
    fn run(&self, strategy: Strategy, replicas: usize) -> (Vec<Duration>, Option<Duration>) {
        let cpu_start = thread_cpu();
        let devices = spread::spread::<B>(replicas);
        let (warm, timed) = self.steps;
        let steps = warm + timed + 1;
        STARTS.lock().unwrap().clear();
        let model = self.model();
        let per_step = match strategy {
            Strategy::Bare => 1,
            _ => replicas,
        };
        match strategy {
            Strategy::WrapperLoop => self.own_loop(model, devices, steps),
            _ => self.learner(strategy, model, devices, steps),
        }
        let starts = std::mem::take(&mut *STARTS.lock().unwrap());
        assert_eq!(
            starts.len(),
            steps * per_step,
            "one start per replica and step"
        );
        // A step's start is its first replica's.
        let firsts: Vec<Instant> = starts
            .chunks(per_step)
            .map(|c| *c.iter().min().unwrap())
            .collect();
        let cpu = thread_cpu()
            .zip(cpu_start)
            .map(|(end, start)| (end - start) / steps as u32);
        let times = firsts.windows(2).skip(warm).map(|w| w[1] - w[0]).collect();
        (times, cpu)
    }

    /// `steps` steps of the wrapper in a hand-written loop, with SGD.
    fn own_loop(&self, model: Model<B>, devices: Vec<B::Device>, steps: usize) {
        let device = B::Device::default();
        let mut dp = DataParallel::new(model, devices)
            .expect("replica devices")
            .with_running_states_per_device();
        let mut optim = SgdConfig::new().init();
        for _ in 0..steps {
            let batch: Batch<B> = self.random().batch(vec![0; self.batch], &device);
            let Mean(loss) = dp.forward_with(batch, |m, batch| {
                // The same start mark as the model's own step.
                B::sync(&batch.targets.device()).expect("sync");
                STARTS.lock().unwrap().push(Instant::now());
                Mean(m.classify(batch).loss)
            });
            let grads = GradientsParams::from_grads(loss.backward(), &dp);
            dp = optim.step(0.01, dp, grads);
        }
        B::sync(&device).expect("sync");
    }

    /// `steps` steps under the `Learner`, with SGD, in one epoch.
    fn learner(&self, strategy: Strategy, model: Model<B>, devices: Vec<B::Device>, steps: usize) {
        let device = B::Device::default();
        // `MultiDevice` takes one batch of the data loader per device and step.
        let loaders = match strategy {
            Strategy::MultiDeviceMain | Strategy::MultiDeviceSharded => devices.len(),
            _ => 1,
        };
        let loader_batch = self.batch / loaders;
        let global = loader_batch * loaders;
        let train = DataLoaderBuilder::new(self.random())
            .batch_size(loader_batch)
            .set_device(device.clone())
            .build(InMemDataset::new((0..(steps * global) as u64).collect()));
        let valid = DataLoaderBuilder::new(self.random())
            .batch_size(1)
            .set_device(device.clone())
            .build(InMemDataset::new(vec![0u64]));
        let dir = tempfile::tempdir().expect("a temporary folder");
        // One epoch, nothing logged or shown (a macro: its type follows the model's).
        macro_rules! training {
            () => {
                SupervisedTraining::new(dir.path(), train, valid)
                    .with_application_logger(None)
                    .renderer(Silent)
                    .num_epochs(1)
            };
        }
        match strategy {
            Strategy::Bare => {
                training!().launch(Learner::new(model, SgdConfig::new().init(), 0.01));
            }
            Strategy::WrapperLearner => {
                let dp = DataParallel::new(model, devices)
                    .expect("replica devices")
                    .with_running_states_per_device();
                training!().launch(Learner::new(dp, SgdConfig::new().init(), 0.01));
            }
            Strategy::MultiDeviceMain | Strategy::MultiDeviceSharded => {
                let mode = match strategy {
                    Strategy::MultiDeviceMain => MultiDeviceOptim::OptimMainDevice,
                    _ => MultiDeviceOptim::OptimSharded,
                };
                training!()
                    .with_training_strategy(ExecutionStrategy::MultiDevice(devices, mode).into())
                    .launch(Learner::new(model, SgdConfig::new().init(), 0.01));
            }
            Strategy::WrapperLoop => unreachable!("not under the Learner"),
        }
        B::sync(&device).expect("sync");
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn list_from_env(name: &str) -> Option<Vec<usize>> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
}

/// Every configuration of one model, round-robin; prints its table.
fn bench_model<B: DataParallelBackend>(
    backend: &str,
    model: &str,
    sizes: Sizes,
    batch: usize,
    steps: (usize, usize),
    memory: MemoryProbe,
) {
    *MEMORY.lock().unwrap() = memory;
    let device = B::Device::default();
    let setup = Setup::<B> {
        model: model.to_string(),
        sizes,
        batch,
        steps,
        template: Model::<B>::new(model, sizes, &device),
    };
    let replica_counts = list_from_env("STRATEGIES_REPLICAS").unwrap_or_else(|| vec![2, 4]);
    let rounds = list_from_env("STRATEGIES_ROUNDS")
        .and_then(|r| r.first().copied())
        .unwrap_or(3);
    let mut configs = vec![Config {
        strategy: Strategy::Bare,
        replicas: 1,
        rounds: Ok(Vec::new()),
        cpu: Vec::new(),
        memory: None,
    }];
    for &n in &replica_counts {
        for strategy in [
            Strategy::WrapperLoop,
            Strategy::WrapperLearner,
            Strategy::MultiDeviceMain,
            Strategy::MultiDeviceSharded,
        ] {
            let rounds = match batch % n {
                0 => Ok(Vec::new()),
                _ => Err(format!(
                    "the global batch {batch} does not split into {n} equal batches"
                )),
            };
            configs.push(Config {
                strategy,
                replicas: n,
                rounds,
                cpu: Vec::new(),
                memory: None,
            });
        }
    }
    // Quiet panics: a strategy that cannot run is a row, not a crash.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for _ in 0..rounds {
        for config in configs.iter_mut() {
            let Ok(done) = &mut config.rounds else {
                continue;
            };
            *PEAK.lock().unwrap() = None;
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                setup.run(config.strategy, config.replicas)
            }));
            match run {
                Ok((times, cpu)) => {
                    done.push(times);
                    config.cpu.extend(cpu);
                    config.memory = config.memory.max(*PEAK.lock().unwrap());
                }
                Err(payload) => {
                    let message = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic".into());
                    let first = message.lines().next().unwrap_or_default().to_string();
                    config.rounds = Err(format!("failed: {first}"));
                }
            }
        }
    }
    std::panic::set_hook(default_hook);

    println!(
        "\n{backend} {model}, global batch {batch}, {rounds} rounds of {} steps",
        steps.1
    );
    println!(
        "| backend | model | batch | strategy | step (median) | rounds' medians | samples/s | \
         vs bare | calling thread's CPU per step | memory in use after a forward |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut bare = None;
    for config in &configs {
        let name = config.strategy.name(config.replicas);
        match &config.rounds {
            Ok(rounds) => {
                let all = median(rounds.iter().flatten().copied().collect());
                let medians: Vec<Duration> = rounds.iter().map(|r| median(r.clone())).collect();
                let (lo, hi) = (medians.iter().min().unwrap(), medians.iter().max().unwrap());
                let samples = batch as f64 / all.as_secs_f64();
                if config.strategy == Strategy::Bare {
                    bare = Some(samples);
                }
                let cpu = match config.cpu.is_empty() {
                    true => "-".to_string(),
                    false => format!("{:.2} ms", ms(median(config.cpu.clone()))),
                };
                println!(
                    "| {backend} | {model} | {batch} | {name} | {:.2} ms | {:.2}–{:.2} ms | {:.0} | \
                     {} | {cpu} | {} |",
                    ms(all),
                    ms(*lo),
                    ms(*hi),
                    samples,
                    bare.map(|b| format!("{:.2}x", samples / b))
                        .unwrap_or_else(|| "-".into()),
                    config
                        .memory
                        .map(|b| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64))
                        .unwrap_or_else(|| "-".into()),
                );
            }
            Err(why) => {
                println!("| {backend} | {model} | {batch} | {name} | not run: {why} ||||||")
            }
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_memory() -> Option<u64> {
    use cubecl::Runtime;
    let client = cubecl::cuda::CudaRuntime::client(&Default::default());
    client.memory_usage().ok().map(|m| m.bytes_in_use)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let models: Vec<&str> = match args.is_empty() {
        true => vec!["mlp", "resnet18", "encoder"],
        false => args.iter().map(String::as_str).collect(),
    };
    let cuda = cfg!(feature = "cuda");
    let steps = list_from_env("STRATEGIES_STEPS")
        .filter(|s| s.len() == 2)
        .map(|s| (s[0], s[1]))
        .unwrap_or(if cuda { (5, 20) } else { (3, 10) });
    let global = list_from_env("STRATEGIES_BATCH").and_then(|b| b.first().copied());
    for model in models {
        let batch = global.unwrap_or(match model {
            "resnet18" if cuda => 256,
            "resnet18" => 32,
            "encoder" if cuda => 128,
            "encoder" => 32,
            _ if cuda => 1024,
            _ => 256,
        });
        #[cfg(feature = "cuda")]
        {
            type B = burn::backend::Autodiff<
                burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
            >;
            bench_model::<B>("burn-cube", model, CUDA_SIZES, batch, steps, cuda_memory);
        }
        #[cfg(not(feature = "cuda"))]
        bench_model::<burn::backend::Autodiff<burn::backend::Flex>>(
            "flex", model, CPU_SIZES, batch, steps, no_memory,
        );
    }
}
