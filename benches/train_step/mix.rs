//! `mix`: devices of different speeds in one wrapper. Each distinct device of `--devices`
//! alone (the bare model and its batch on it), then the wrapper over the whole list with even
//! shards and with adaptive shards, interleaved round by round; each configuration's median
//! step against the fastest device alone, and the adaptive split it ended on.

use std::time::{Duration, Instant};

use burn::optim::{ModuleOptimizer, SgdConfig};
use burn::tensor::Device;
use burn_dataparallel::{AdaptiveShardsConfig, DataParallel, DataParallelConfig};

use crate::models::{Batch, Net};
use crate::own_loop::Trained;
use crate::{Args, median, ms};

/// Steps of the warm-up round, in which the adaptive split settles.
const WARM_UP_STEPS: usize = 12;

struct Config {
    name: String,
    model: Option<Trained>,
    batch: Batch,
    rounds: Vec<Duration>,
}

pub fn run(args: &Args) {
    let devices = args.replica_devices(args.devices.len());
    println!(
        "devices {:?}, {} rounds of {} steps after a warm-up round of {WARM_UP_STEPS}, sizes {:?}",
        args.devices.iter().collect::<Vec<_>>(),
        args.rounds,
        args.steps,
        args.sizes()
    );
    println!(
        "| model | rows | configuration | median step (ms) | rounds' range (ms) | vs the fastest alone | samples/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for model in &args.models {
        run_model(args, model, &devices);
    }
}

fn run_model(args: &Args, model: &str, devices: &[Device]) {
    let sizes = args.sizes();
    let features = Net::features(model, sizes);
    let rows = args.batch(model);
    // Each distinct device, named by its entry of `--devices`.
    let mut distinct: Vec<(Device, String)> = Vec::new();
    for (device, entry) in devices.iter().zip(args.devices.iter()) {
        if !distinct.iter().any(|(d, _)| d == device) {
            distinct.push((device.clone(), format!("{entry:?}")));
        }
    }
    let mut configs: Vec<Config> = distinct
        .iter()
        .map(|(device, entry)| Config {
            name: format!("{entry} alone"),
            model: Some(Trained::Bare(Net::new(model, sizes, device))),
            batch: Batch::random(rows, features, device),
            rounds: Vec::new(),
        })
        .collect();
    let output = &devices[0];
    for adaptive in [false, true] {
        let config = DataParallelConfig::new()
            .with_adaptive_shards(adaptive.then(AdaptiveShardsConfig::new));
        let dp: DataParallel<Net> = config
            .init(Net::new(model, sizes, output), devices.to_vec())
            .expect("the devices exist");
        configs.push(Config {
            name: match adaptive {
                true => "DataParallel, adaptive shards".into(),
                false => "DataParallel, even shards".into(),
            },
            model: Some(Trained::Wrapped(dp)),
            batch: Batch::random(rows, features, output),
            rounds: Vec::new(),
        });
    }
    let distinct: Vec<Device> = distinct.into_iter().map(|(device, _)| device).collect();
    let mut optims: Vec<ModuleOptimizer> =
        configs.iter().map(|_| SgdConfig::new().init()).collect();
    for round in 0..=args.rounds {
        let steps = match round {
            0 => WARM_UP_STEPS,
            _ => args.steps,
        };
        let count = configs.len();
        for k in 0..count {
            let i = (k + round) % count;
            let config = &mut configs[i];
            let mut trained = config.model.take().expect("a model");
            let mut times = Vec::with_capacity(steps);
            for _ in 0..steps {
                let start = Instant::now();
                trained = trained.step(&config.batch, &mut optims[i], &distinct);
                times.push(start.elapsed());
            }
            config.model = Some(trained);
            if round > 0 {
                config.rounds.push(median(times));
            }
        }
    }
    let fastest = configs[..distinct.len()]
        .iter()
        .map(|c| median(c.rounds.clone()))
        .min()
        .expect("a device");
    for config in &configs {
        let step = median(config.rounds.clone());
        let lo = config.rounds.iter().min().copied().unwrap_or_default();
        let hi = config.rounds.iter().max().copied().unwrap_or_default();
        println!(
            "| {model} | {rows} | {} | {} | {}–{} | {:.3} | {:.0} |",
            config.name,
            ms(step),
            ms(lo),
            ms(hi),
            step.as_secs_f64() / fastest.as_secs_f64(),
            rows as f64 / step.as_secs_f64(),
        );
        if let Some(Trained::Wrapped(dp)) = &config.model
            && let Some(weights) = dp.adaptive_weights()
        {
            let weights: Vec<String> = weights.iter().map(|w| format!("{w:.3}")).collect();
            println!("adaptive split {model}: [{}]", weights.join(", "));
        }
    }
}
