//! Training-step time of one model at one global batch, for each way a Burn user can spread it
//! over N devices: the bare model under burn-train's `Learner` on one device; `DataParallel`
//! with N replicas, in a hand-written loop and under the `Learner` (the model's own
//! `TrainStep` on every replica); burn-train 0.21's `ExecutionStrategy::MultiDevice` over
//! the same N devices, with both optimizer modes (`OptimMainDevice`, `OptimSharded`); and
//! burn-collective's all-reduce of gradients between N peers.
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
//! why. DDP's algorithm runs as burn-collective's all-reduce in a hand-written loop (one peer
//! per device, threads, each with the whole model and a batch of `G / N`, gradients averaged
//! before each peer's own SGD step; its CPU column is peer 0's thread). burn-train 0.21's
//! `ExecutionStrategy::ddp` itself is not among the rows: it needs `DistributedBackend`, which
//! Burn 0.21 implements only for CubeCL backends (not the CPU's), and burn's `distributed`
//! feature (NCCL on CUDA), which this crate does not build.
//!
//! Each configuration's round runs in a process of its own (the bench runs itself with
//! `STRATEGIES_CHILD=MODEL:STRATEGY:REPLICAS`), so that a device fault (a CUDA error that
//! leaves the device unusable) fails that configuration alone: its row says which round
//! faulted and how, and the other rows keep their numbers. The table is printed after every
//! round. `STRATEGIES_IN_PROCESS=1` runs every configuration in this process instead. The
//! model's parameters come from a fixed seed, the same in every process.
//!
//! Environment: `STRATEGIES_REPLICAS` (default `2,4`), `STRATEGIES_STEPS="WARM,TIMED"`
//! (default `3,10` on the CPU, `5,20` on CUDA), `STRATEGIES_BATCH` (the global batch; default
//! the model's `train_step` batch), `STRATEGIES_ROUNDS`; `STRATEGIES_CSV` appends the rows to
//! a CSV file that `train_step plot-speedup-global` draws. `STRATEGIES_FREE=1`: the model's
//! `TrainStep` does not wait for its device before noting its start, so that a step's time
//! is the pace the loop keeps when nothing waits but what the strategy itself waits for (the
//! row "items not synced" against "Learner" is then the cost of the wrapper's
//! `sync_learner_steps`). `STRATEGIES_ONLY=learner,unsynced` runs only those strategies beside
//! the bare Learner (keys: `loop`, `learner`, `unsynced`, `main`, `sharded`, `allreduce`).

use std::time::Duration;

use burn_dataparallel::DataParallelBackend;

#[path = "common/learner_steps.rs"]
mod learner_steps;
#[path = "common/measure.rs"]
mod measure;
#[cfg(feature = "cuda")]
use measure::cuda_memory;
use measure::{list_from_env, median, positional_args};
#[path = "common/models.rs"]
mod models;
#[path = "common/strategy_child.rs"]
mod strategy_child;
#[path = "common/strategy_runs.rs"]
mod strategy_runs;
#[allow(dead_code)]
#[path = "common/thread_cpu.rs"]
mod thread_cpu;
use learner_steps::*;
use models::*;
use strategy_child::{RESULT, Round, child_round, format_round};
use strategy_runs::{Setup, Strategy};

/// One configuration of one model.
struct Config {
    strategy: Strategy,
    replicas: usize,
    /// Each finished round's step times.
    rounds: Vec<Vec<Duration>>,
    /// Why the configuration is not run (any more): it cannot be, or a round failed.
    stopped: Option<String>,
    /// Each round's CPU time of the calling thread per step.
    cpu: Vec<Duration>,
    memory: Option<u64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
    // The same parameters in every process (each configuration runs in one of its own).
    B::seed(&device, 7);
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
        rounds: Vec::new(),
        stopped: None,
        cpu: Vec::new(),
        memory: None,
    }];
    // STRATEGIES_ONLY: the strategies to run besides the bare Learner (all by default).
    let only = std::env::var("STRATEGIES_ONLY").ok();
    let wanted = |strategy: Strategy| {
        (only.as_deref()).is_none_or(|list| list.split(',').any(|k| k.trim() == strategy.key()))
    };
    for &n in &replica_counts {
        for strategy in [
            Strategy::WrapperLoop,
            Strategy::WrapperLearner,
            Strategy::WrapperLearnerUnsynced,
            Strategy::MultiDeviceMain,
            Strategy::MultiDeviceSharded,
            Strategy::AllReduce,
        ]
        .into_iter()
        .filter(|s| wanted(*s))
        {
            let stopped = (!batch.is_multiple_of(n)).then(|| {
                format!("not run: the global batch {batch} does not split into {n} equal batches")
            });
            configs.push(Config {
                strategy,
                replicas: n,
                rounds: Vec::new(),
                stopped,
                cpu: Vec::new(),
                memory: None,
            });
        }
    }
    // A strategy that cannot run is a row, not a crash; every panic (a worker's or a peer's
    // too, whose message the row does not show) is one line on stderr.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let message = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()));
        let first = message.unwrap_or_default().replace('\n', " / ");
        eprintln!("panic in {}: {first}", thread.name().unwrap_or("a thread"));
    }));
    let isolated = std::env::var("STRATEGIES_IN_PROCESS").as_deref() != Ok("1");
    for round in 1..=rounds {
        for config in configs.iter_mut() {
            if config.stopped.is_some() {
                continue;
            }
            *PEAK.lock().unwrap() = None;
            let began = std::time::Instant::now();
            let run = match isolated {
                true => child_round(model, config.strategy, config.replicas),
                false => in_process(&setup, config.strategy, config.replicas),
            };
            match run {
                Ok((times, cpu, memory)) => {
                    // Progress on stderr: a run cut short by a time limit still shows how
                    // far it came, and that the first round of each configuration holds its
                    // compiling and tuning.
                    eprintln!(
                        "round {round}/{rounds}: {} in {:.1} s, median step {:?}",
                        config.strategy.name(config.replicas),
                        began.elapsed().as_secs_f64(),
                        median(times.clone())
                    );
                    config.rounds.push(times);
                    config.cpu.extend(cpu);
                    config.memory = config.memory.max(memory);
                }
                Err(why) => {
                    let name = config.strategy.name(config.replicas);
                    eprintln!("round {round}/{rounds}: {name} failed: {why}");
                    config.stopped = Some(format!("failed in round {round}: {why}"));
                }
            }
        }
        print_table(backend, model, batch, (round, rounds), steps.1, &configs);
    }
    std::panic::set_hook(default_hook);
    let csv = csv_rows(backend, model, batch, &configs);
    // STRATEGIES_CSV: the rows that ran, appended in the CSV layout of the other benches'
    // charts (`train_step plot-speedup-global OUT.svg FILE.csv`).
    if let Ok(path) = std::env::var("STRATEGIES_CSV") {
        use std::io::Write as _;
        let fresh = std::fs::metadata(&path)
            .map(|m| m.len() == 0)
            .unwrap_or(true);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("open the CSV");
        if fresh {
            let header = "backend,model,batch,config,median_ms,samples_per_s,memory_bytes\n";
            file.write_all(header.as_bytes()).expect("write the CSV");
        }
        file.write_all(csv.as_bytes()).expect("write the CSV");
    }
}

fn main() {
    let args: Vec<String> = positional_args();
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
    let child = std::env::var("STRATEGIES_CHILD").ok();
    // A child runs the one configuration it names, of its model only.
    let models: Vec<&str> = match &child {
        Some(spec) => models
            .into_iter()
            .filter(|m| spec.split(':').next() == Some(*m))
            .collect(),
        None => models,
    };
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
            match &child {
                Some(spec) => run_child::<B>(spec, CUDA_SIZES, batch, steps, cuda_memory),
                None => bench_model::<B>("burn-cube", model, CUDA_SIZES, batch, steps, cuda_memory),
            }
        }
        #[cfg(not(feature = "cuda"))]
        {
            type B = burn::backend::Autodiff<burn::backend::Flex>;
            match &child {
                Some(spec) => run_child::<B>(spec, CPU_SIZES, batch, steps, no_memory),
                None => bench_model::<B>("flex", model, CPU_SIZES, batch, steps, no_memory),
            }
        }
    }
}

/// One round in this process; a panic is the round's failure.
fn in_process<B: DataParallelBackend>(
    setup: &Setup<B>,
    strategy: Strategy,
    replicas: usize,
) -> Result<Round, String> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        setup.run(strategy, replicas)
    }));
    match run {
        Ok((times, cpu)) => Ok((times, cpu, *PEAK.lock().unwrap())),
        Err(payload) => {
            let message = (payload.downcast_ref::<String>().cloned())
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Err(message.lines().next().unwrap_or_default().to_string())
        }
    }
}

/// In a child process: the one round `STRATEGIES_CHILD` names, printed on stdout.
fn run_child<B: DataParallelBackend>(
    spec: &str,
    sizes: Sizes,
    batch: usize,
    steps: (usize, usize),
    memory: MemoryProbe,
) {
    let [model, key, replicas] = <[&str; 3]>::try_from(spec.split(':').collect::<Vec<_>>())
        .expect("STRATEGIES_CHILD=MODEL:STRATEGY:REPLICAS");
    let strategy = Strategy::from_key(key).expect("a strategy's key");
    let replicas: usize = replicas.parse().expect("a replica count");
    *MEMORY.lock().unwrap() = memory;
    let device = B::Device::default();
    B::seed(&device, 7);
    let setup = Setup::<B> {
        model: model.to_string(),
        sizes,
        batch,
        steps,
        template: Model::<B>::new(model, sizes, &device),
    };
    let (times, cpu) = setup.run(strategy, replicas);
    let round = (times, cpu, *PEAK.lock().unwrap());
    println!("{RESULT} {}", format_round(&round));
}

/// The table of every configuration's finished rounds, after round `round.0` of `round.1`.
fn print_table(
    backend: &str,
    model: &str,
    batch: usize,
    round: (usize, usize),
    timed: usize,
    configs: &[Config],
) {
    println!(
        "\n{backend} {model}, global batch {batch}, after round {} of {}, {timed} steps a round",
        round.0, round.1
    );
    println!(
        "| backend | model | batch | strategy | step (median) | rounds' medians | samples/s | \
         vs bare | calling thread's CPU per step | memory in use after a forward |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut bare = None;
    for config in configs {
        let name = config.strategy.name(config.replicas);
        let note = config.stopped.as_deref().unwrap_or("");
        if config.rounds.is_empty() {
            println!("| {backend} | {model} | {batch} | {name} | {note} ||||||");
            continue;
        }
        let all = median(config.rounds.iter().flatten().copied().collect());
        let medians: Vec<Duration> = config.rounds.iter().map(|r| median(r.clone())).collect();
        let (lo, hi) = (medians.iter().min().unwrap(), medians.iter().max().unwrap());
        let samples = batch as f64 / all.as_secs_f64();
        if config.strategy == Strategy::Bare {
            bare = Some(samples);
        }
        let cpu = match config.cpu.is_empty() {
            true => "-".to_string(),
            false => format!("{:.2} ms", ms(median(config.cpu.clone()))),
        };
        let rounds = match note.is_empty() {
            true => format!("{:.2}–{:.2} ms", ms(*lo), ms(*hi)),
            false => format!(
                "{:.2}–{:.2} ms ({} rounds; then {note})",
                ms(*lo),
                ms(*hi),
                medians.len()
            ),
        };
        println!(
            "| {backend} | {model} | {batch} | {name} | {:.2} ms | {rounds} | {samples:.0} | {} | \
             {cpu} | {} |",
            ms(all),
            bare.map(|b| format!("{:.2}x", samples / b))
                .unwrap_or_else(|| "-".into()),
            config
                .memory
                .map(|b| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "-".into()),
        );
    }
}

/// The configurations' rows in the CSV layout of the other benches' charts.
fn csv_rows(backend: &str, model: &str, batch: usize, configs: &[Config]) -> String {
    let mut csv = String::new();
    for config in configs.iter().filter(|c| !c.rounds.is_empty()) {
        let all = median(config.rounds.iter().flatten().copied().collect());
        let samples = batch as f64 / all.as_secs_f64();
        csv.push_str(&format!(
            "{backend},{model},{batch},{},{:.4},{samples:.1},{}\n",
            config.strategy.name(config.replicas).replace(", ", " "),
            ms(all),
            config.memory.map(|m| m.to_string()).unwrap_or_default()
        ));
    }
    csv
}
