//! `loop`: the bare model and the wrapper's configurations in the README's training loop,
//! interleaved round by round.

use std::time::{Duration, Instant};

use burn::optim::{ModuleOptimizer, SgdConfig};
use burn::tensor::Device;
use burn_dataparallel::DataParallel;

use crate::models::{Batch, Net, Trained};
use crate::{Args, median, ms};

/// One configuration: the bare model (`replicas == 0`) or the wrapper over `replicas`, its
/// batch, its optimizer, and each timed round's median step.
pub struct Config {
    pub name: String,
    pub replicas: usize,
    pub model: Option<Trained>,
    pub batch: Batch,
    pub optim: ModuleOptimizer,
    pub rounds: Vec<Duration>,
}

impl Config {
    pub fn new(name: String, replicas: usize, model: Trained, batch: Batch) -> Self {
        Self {
            name,
            replicas,
            model: Some(model),
            batch,
            optim: SgdConfig::new().init(),
            rounds: Vec::new(),
        }
    }
}

/// `configs` in turn, a warm-up round of `warm_up` steps each, then `rounds` rounds of
/// `steps` steps, the order rotating each round so that no configuration always follows the
/// same one; each timed round's median step goes to the configuration's `rounds`. Every step
/// waits for `devices`.
pub fn interleave(
    configs: &mut [Config],
    warm_up: usize,
    rounds: usize,
    steps: usize,
    devices: &[Device],
) {
    for round in 0..=rounds {
        let steps = if round == 0 { warm_up } else { steps };
        let count = configs.len();
        for k in 0..count {
            let config = &mut configs[(k + round) % count];
            let mut trained = config.model.take().expect("a model");
            let mut times = Vec::with_capacity(steps);
            for _ in 0..steps {
                let start = Instant::now();
                trained = trained.step(&config.batch, &mut config.optim);
                wait(devices);
                times.push(start.elapsed());
            }
            config.model = Some(trained);
            if round > 0 {
                config.rounds.push(median(times));
            }
        }
    }
}

/// Waits for everything queued on `devices`.
pub fn wait(devices: &[Device]) {
    for device in devices {
        device.sync().expect("the device runs the step");
    }
}

pub fn run(args: &Args) {
    let output = args.replica_devices(1).remove(0);
    println!(
        "devices {:?}, {} rounds of {} steps after a warm-up round, sizes {:?}",
        args.devices.iter().collect::<Vec<_>>(),
        args.rounds,
        args.steps,
        args.sizes()
    );
    println!(
        "| model | rows | configuration | median step (ms) | rounds' range (ms) | vs bare: median (range) | samples/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for model in &args.models {
        run_model(args, model, &output);
    }
}

fn run_model(args: &Args, model: &str, output: &Device) {
    let sizes = args.sizes();
    let features = Net::features(model, sizes);
    let all_devices = args.replica_devices(args.devices.len());
    let mut configs: Vec<Config> = std::iter::once(0)
        .chain(args.replicas.iter().copied())
        .map(|replicas| {
            let net = Net::new(model, sizes, output);
            let trained = match replicas {
                0 => Trained::Bare(net),
                n => Trained::Wrapped(
                    DataParallel::new(net, args.replica_devices(n)).expect("the devices exist"),
                ),
            };
            let name = match replicas {
                0 => "bare".into(),
                n => format!("DataParallel x{n}"),
            };
            let batch = Batch::random(args.rows(model, replicas), features, output);
            Config::new(name, replicas, trained, batch)
        })
        .collect();
    interleave(
        &mut configs,
        args.steps,
        args.rounds,
        args.steps,
        &all_devices,
    );
    let bare = configs[0].rounds.clone();
    for config in &configs {
        let ratios: Vec<f64> = config
            .rounds
            .iter()
            .zip(&bare)
            .map(|(t, b)| t.as_secs_f64() / b.as_secs_f64())
            .collect();
        let step = median(config.rounds.clone());
        let (lo, hi) = range(&config.rounds);
        let (rlo, rhi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
        let rows = config.batch.inputs.dims()[0];
        println!(
            "| {model} | {rows} | {} | {} | {}–{} | {:.3} ({rlo:.3}–{rhi:.3}) | {:.0} |",
            config.name,
            ms(step),
            ms(lo),
            ms(hi),
            median(ratios.clone()),
            rows as f64 / step.as_secs_f64(),
        );
    }
    // One profiled step of each wrapper: where its time goes.
    for config in &mut configs {
        let Some(Trained::Wrapped(dp)) = config.model.take() else {
            continue;
        };
        dp.set_profiling(true);
        let stepped = Trained::Wrapped(dp).step(&config.batch, &mut config.optim);
        wait(&all_devices);
        let dp = match stepped {
            Trained::Wrapped(dp) => dp,
            Trained::Bare(_) => unreachable!("a wrapper steps into a wrapper"),
        };
        if let Some(p) = dp.profile() {
            let forwards: Vec<String> = p.forward.iter().map(|d| ms(*d)).collect();
            println!(
                "profile {model} x{}: shards {:?}, scatter {} ms, replicate {} ms, forwards [{}] ms, running states {} ms, gather {} ms",
                config.replicas,
                p.shard_sizes,
                ms(p.scatter),
                ms(p.replicate),
                forwards.join(", "),
                ms(p.running_states),
                ms(p.gather),
            );
        }
    }
}

/// The smallest and the largest of `times`.
pub fn range(times: &[Duration]) -> (Duration, Duration) {
    let lo = times.iter().min().copied().unwrap_or_default();
    let hi = times.iter().max().copied().unwrap_or_default();
    (lo, hi)
}
