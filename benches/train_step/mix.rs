//! `mix`: devices of different speeds in one wrapper. Each distinct device of `--devices`
//! alone (the bare model and its batch on it), then the wrapper over the whole list with even
//! shards and with adaptive shards, interleaved round by round; each configuration's median
//! step against the fastest device alone, and the adaptive split it ended on.

use burn::tensor::Device;
use burn_dataparallel::{AdaptiveShardsConfig, DataParallel, DataParallelConfig};

use crate::models::{Batch, Net, Trained};
use crate::own_loop::{Config, interleave, range};
use crate::{Args, median, ms};

/// Steps of the warm-up round, in which the adaptive split settles.
const WARM_UP_STEPS: usize = 12;

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
        .map(|(device, entry)| {
            let bare = Trained::Bare(Net::new(model, sizes, device));
            let batch = Batch::random(rows, features, device);
            Config::new(format!("{entry} alone"), 0, bare, batch)
        })
        .collect();
    let output = &devices[0];
    for adaptive in [false, true] {
        let config = DataParallelConfig::new()
            .with_adaptive_shards(adaptive.then(AdaptiveShardsConfig::new));
        let dp: DataParallel<Net> = config
            .init(Net::new(model, sizes, output), devices.to_vec())
            .expect("the devices exist");
        let name = match adaptive {
            true => "DataParallel, adaptive shards",
            false => "DataParallel, even shards",
        };
        let batch = Batch::random(rows, features, output);
        configs.push(Config::new(
            name.into(),
            devices.len(),
            Trained::Wrapped(dp),
            batch,
        ));
    }
    let distinct: Vec<Device> = distinct.into_iter().map(|(device, _)| device).collect();
    interleave(
        &mut configs,
        WARM_UP_STEPS,
        args.rounds,
        args.steps,
        &distinct,
    );
    let fastest = configs[..distinct.len()]
        .iter()
        .map(|c| median(c.rounds.clone()))
        .min()
        .expect("a device");
    for config in &configs {
        let step = median(config.rounds.clone());
        let (lo, hi) = range(&config.rounds);
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
