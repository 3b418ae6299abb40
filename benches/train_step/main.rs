//! Training-step speed on Burn 0.22: the bare model against `DataParallel` with 1, 2 and 4
//! replicas, in a plain training loop and under burn-train's `Learner` beside its own
//! `MultiDevice` strategies; and the cold start of a fresh process.
//!
//! ```sh
//! cargo bench --bench train_step                                   # CPU (Flex), small sizes
//! cargo bench --features cuda,fusion,autotune --bench train_step -- --devices cuda:0
//! cargo bench --features cuda,fusion,autotune --bench train_step -- learner --devices cuda:0
//! cargo bench --features cuda,fusion,autotune --bench train_step -- cold --model mlp
//! ```
//!
//! `loop` (the default) trains each model in the plain loop of the README: every
//! configuration (`bare`, then `xN` for each `--replicas` entry) runs `--steps` steps in
//! turn, the order rotating each round, for `--rounds` rounds after one warm-up round. It
//! prints each configuration's median step, the spread of its rounds' medians, and its
//! ratio to the bare step of the same round (median and range over the rounds), then the
//! wrapper's stage profile of one step.
//!
//! `learner` runs burn-train's `SupervisedTraining` with the bare model, the wrapper, and
//! `ExecutionStrategy::MultiDevice` with both optimizer modes (and `ExecutionStrategy::ddp`
//! where the replicas are distinct CUDA GPUs), and the wrapper in its own loop on the same
//! batches (the loss read each step, as the Learner's loss metric reads it), each
//! configuration in a process of its own (a configuration that faults is reported, the others
//! still run), the configurations alternating for `--rounds` rounds; samples per second over
//! the epochs after the first. After its run, the wrapper's process prints one profiled
//! `TrainStep` (its stages) and its gradient sum's rate against a copy between its devices.
//!
//! `mix` runs each distinct device of `--devices` alone and the wrapper over the whole list
//! with even and with adaptive shards (devices of different speeds: `cuda:0,cpu`).
//!
//! `moves` times a model's parameters moved between the first two distinct devices of
//! `--devices` as Burn moves them and as the wrapper does, both ways, with and without the
//! backward that brings their gradients back (`cuda:0,cpu`).
//!
//! `cold` times one fresh process: from the start of `main` to the end of each of the first
//! steps, and the median of the steps that follow.
//!
//! Replicas: entry `i` of an `xN` configuration is entry `i` modulo the length of
//! `--devices` (`cuda:0`: N replicas sharing the GPU; `cuda:0,cuda:1`: spread over two). The
//! first device holds the model and the batch. `--scale-batch` multiplies the batch by the
//! replica count (a scaling run: the rows per replica stay the bare model's).

use std::time::{Duration, Instant};

use burn_dataparallel::{DeviceList, ParseDeviceError};
use clap::{Parser, ValueEnum};

mod clock;
mod cold;
mod learner;
mod mix;
mod models;
mod moves;
mod own_loop;
#[path = "../../tests/common/silent.rs"]
mod silent;
mod stages;

use models::{CPU_SIZES, GPU_SIZES, Sizes};

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Mode {
    Loop,
    Learner,
    Cold,
    Mix,
    Moves,
    /// One configuration of `learner`, in the process `learner` starts.
    #[value(hide = true)]
    LearnerChild,
}

#[derive(Parser, Debug, Clone)]
struct Args {
    #[arg(value_enum, default_value = "loop")]
    mode: Mode,
    /// The devices replicas cycle over; the first holds the model and the batch.
    #[arg(long, default_value = "cpu")]
    devices: Devices,
    /// Models to run, comma-separated (`mlp`, `resnet18`).
    #[arg(long, value_delimiter = ',', default_value = "mlp,resnet18")]
    models: Vec<String>,
    /// Replica counts of the wrapper's configurations.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    replicas: Vec<usize>,
    /// Rows per batch (per step); by default 512 for the MLP and 256 for ResNet-18 on a GPU,
    /// 64 and 16 on the CPU.
    #[arg(long)]
    batch: Option<usize>,
    #[arg(long)]
    scale_batch: bool,
    /// Timed rounds (after one warm-up round).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Steps per configuration and round (`loop`), batches per epoch (`learner`).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// The model's sizes: the GPU's (`large`) or the CPU's (`small`); by the first device's
    /// kind unless given.
    #[arg(long)]
    sizes: Option<SizeChoice>,
    /// `learner`: the configurations to run, comma-separated (`bare`, `dp`, `loop`, `main`,
    /// `sharded`, `ddp`; all when empty). Ratios are to the first that runs (the bare Learner
    /// where it does).
    #[arg(long, value_delimiter = ',')]
    configs: Vec<String>,
    /// `learner-child`: the configuration to run (`bare`, `dp`, `loop`, `main`, `sharded`, `ddp`).
    #[arg(long, default_value = "bare")]
    config: String,
    /// `learner-child`: replicas (or MultiDevice workers).
    #[arg(long, default_value_t = 1)]
    count: usize,
    /// Added by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
    /// `cold`: the replica count (0: the bare model).
    #[arg(long, default_value_t = 0)]
    cold_replicas: usize,
}

/// `--devices`: the list, and the text it was parsed from (for `learner`'s child processes).
#[derive(Clone, Debug)]
struct Devices {
    text: String,
    list: DeviceList,
}

impl std::str::FromStr for Devices {
    type Err = ParseDeviceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let list = text.parse()?;
        Ok(Self {
            text: text.to_string(),
            list,
        })
    }
}

impl std::ops::Deref for Devices {
    type Target = DeviceList;

    fn deref(&self) -> &DeviceList {
        &self.list
    }
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum SizeChoice {
    Small,
    Large,
}

impl Args {
    fn sizes(&self) -> Sizes {
        let first = format!("{:?}", self.devices[0]);
        let gpu = !(first.contains("Flex") || first.contains("NdArray"));
        match self.sizes {
            Some(SizeChoice::Large) => GPU_SIZES,
            Some(SizeChoice::Small) => CPU_SIZES,
            None if gpu => GPU_SIZES,
            None => CPU_SIZES,
        }
    }

    fn batch(&self, model: &str) -> usize {
        let large = self.sizes().mlp == GPU_SIZES.mlp;
        self.batch.unwrap_or(match (model, large) {
            ("mlp", true) => 512,
            (_, true) => 256,
            ("mlp", false) => 64,
            _ => 16,
        })
    }

    /// The device list of `replicas` replicas (autodiff on).
    fn replica_devices(&self, replicas: usize) -> Vec<burn::tensor::Device> {
        let devices = self.devices.list.clone().autodiff();
        (0..replicas)
            .map(|i| devices[i % devices.len()].clone())
            .collect()
    }

    /// The rows of one step with `replicas` replicas.
    fn rows(&self, model: &str, replicas: usize) -> usize {
        match self.scale_batch {
            true => self.batch(model) * replicas.max(1),
            false => self.batch(model),
        }
    }
}

/// The median of `values` (the upper one of an even count).
fn median<T: PartialOrd + Copy>(mut values: Vec<T>) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    values[values.len() / 2]
}

/// Milliseconds with two decimals.
fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn main() {
    let start = Instant::now();
    let args = Args::parse();
    match args.mode {
        Mode::Loop => own_loop::run(&args),
        Mode::Learner => learner::run(&args),
        Mode::LearnerChild => learner::child(&args),
        Mode::Cold => cold::run(&args, start),
        Mode::Mix => mix::run(&args),
        Mode::Moves => moves::run(&args),
    }
}
