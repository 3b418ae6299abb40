//! The wrapper's own host work per training step, on the calling thread: making the replicas
//! (the profile's replicate stage) and the calling thread's part of the backward (its CPU
//! time in `backward()`: the loss's and the gather's backward, the seeds, the reduce; the
//! replicas' own backward runs on their workers). Replicas share the one device, so nothing
//! moves between devices and what is left is host work.
//!
//! ```sh
//! cargo bench --bench host_work                      # CPU (Flex): ResNet-18 and the encoder
//! cargo bench --bench host_work -- encoder           # one model
//! scripts/compare-bench.sh REV host_work             # this tree against commit REV, interleaved
//! ```
//!
//! Configurations run round-robin, `HOST_WORK_ROUNDS` times (default 3): each row gives the
//! median over every timed step of all rounds and, in brackets, the range of the rounds'
//! medians (the spread a difference must beat). Every step is profiled (on the CPU a stage's
//! synchronisation costs nothing).
//!
//! Environment: `HOST_WORK_REPLICAS` (default `2,4`), `HOST_WORK_BATCH` (default 16),
//! `HOST_WORK_STEPS="WARM,TIMED"` per round (default `3,20`), `HOST_WORK_ROUNDS`.

use std::time::{Duration, Instant};

use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer, Sgd, SgdConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{DataParallel, DataParallelBackend};

#[path = "common/measure.rs"]
mod measure;
use measure::{list_from_env, median, positional_args};
#[path = "common/models.rs"]
mod models;
#[allow(dead_code)]
#[path = "common/thread_cpu.rs"]
mod thread_cpu;
use models::*;
use thread_cpu::thread_cpu;

/// One step's measurements.
#[derive(Clone, Copy)]
struct Sample {
    replicate: Duration,
    backward_cpu: Duration,
    backward: Duration,
    step: Duration,
}

/// One configuration: a model wrapped with some replicas, its optimizer and its batch.
struct Config<B: AutodiffBackend> {
    model: String,
    replicas: usize,
    dp: Option<DataParallel<B, Model<B>>>,
    optim: OptimizerAdaptor<Sgd<B::InnerBackend>, DataParallel<B, Model<B>>, B>,
    input: Input<B>,
    targets: Tensor<B, 1, Int>,
    /// Each round's samples.
    rounds: Vec<Vec<Sample>>,
}

impl<B: DataParallelBackend + AutodiffBackend> Config<B> {
    fn new(model: &str, replicas: usize, batch: usize, device: &B::Device) -> Self {
        let dp = DataParallel::new(
            Model::new(model, CPU_SIZES, device),
            vec![device.clone(); replicas],
        )
        .expect("replicas on the one device");
        dp.set_profiling(true);
        Self {
            model: model.into(),
            replicas,
            dp: Some(dp),
            optim: SgdConfig::new().init(),
            input: input(model, CPU_SIZES, batch, device),
            targets: Tensor::<B, 1>::random(
                [batch],
                Distribution::Uniform(0.0, CLASSES as f64),
                device,
            )
            .int(),
            rounds: Vec::new(),
        }
    }

    fn step(&mut self) -> Sample {
        let dp = self.dp.take().expect("a model between steps");
        let start = Instant::now();
        let output = dp.forward_with(self.input.clone(), |m, x| m.forward(x));
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output, self.targets.clone());
        let replicate = dp.profile().expect("profiling is on").replicate;
        let (cpu, wall) = (thread_cpu(), Instant::now());
        let grads = loss.backward();
        let backward = wall.elapsed();
        let backward_cpu = match (cpu, thread_cpu()) {
            (Some(a), Some(b)) => b - a,
            _ => Duration::ZERO,
        };
        let grads = GradientsParams::from_grads(grads, &dp);
        self.dp = Some(self.optim.step(1e-3, dp, grads));
        Sample {
            replicate,
            backward_cpu,
            backward,
            step: start.elapsed(),
        }
    }
}

/// `median [lowest round - highest round]` in milliseconds.
fn summary(rounds: &[Vec<Sample>], pick: impl Fn(&Sample) -> Duration) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let all = median(rounds.iter().flatten().map(&pick).collect());
    let per_round: Vec<Duration> = rounds
        .iter()
        .map(|r| median(r.iter().map(&pick).collect()))
        .collect();
    let (low, high) = (
        per_round.iter().min().unwrap(),
        per_round.iter().max().unwrap(),
    );
    format!("{:.3} [{:.3}-{:.3}]", ms(all), ms(*low), ms(*high))
}

fn main() {
    type B = burn::backend::Autodiff<burn::backend::Flex>;
    let args: Vec<String> = positional_args();
    let models: Vec<&str> = ["resnet18", "encoder"]
        .into_iter()
        .filter(|m| args.is_empty() || args.iter().any(|a| a == m))
        .collect();
    let replicas = list_from_env("HOST_WORK_REPLICAS").unwrap_or_else(|| vec![2, 4]);
    let batch = list_from_env("HOST_WORK_BATCH").map_or(16, |b| b[0]);
    let steps = list_from_env("HOST_WORK_STEPS").unwrap_or_else(|| vec![3, 20]);
    let (warm, timed) = (steps[0], steps[1]);
    let rounds = list_from_env("HOST_WORK_ROUNDS").map_or(3, |r| r[0]);

    let device = Default::default();
    let mut configs: Vec<Config<B>> = models
        .iter()
        .flat_map(|m| replicas.iter().map(move |&r| (m, r)))
        .map(|(m, r)| Config::new(m, r, batch, &device))
        .collect();
    for round in 0..rounds {
        for config in &mut configs {
            for _ in 0..warm {
                config.step();
            }
            let samples = (0..timed).map(|_| config.step()).collect();
            config.rounds.push(samples);
            eprintln!(
                "round {}/{rounds}: {} x{} done",
                round + 1,
                config.model,
                config.replicas
            );
        }
    }
    println!(
        "| model | batch | replicas | replicate (ms) | calling thread's CPU in backward (ms) | \
         backward (ms) | step (ms) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for c in &configs {
        println!(
            "| {} | {batch} | {} | {} | {} | {} | {} |",
            c.model,
            c.replicas,
            summary(&c.rounds, |s| s.replicate),
            summary(&c.rounds, |s| s.backward_cpu),
            summary(&c.rounds, |s| s.backward),
            summary(&c.rounds, |s| s.step),
        );
    }
}
