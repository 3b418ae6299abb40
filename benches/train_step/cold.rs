//! `cold`: one fresh process, from the start of `main` to the end of its first steps.

use std::time::Instant;

use burn::optim::{ModuleOptimizer, SgdConfig};
use burn_dataparallel::DataParallel;

use crate::models::{Batch, Net, Trained};
use crate::own_loop::wait;
use crate::{Args, median, ms};

/// Steps after the first three whose median is the steady step.
const STEADY: usize = 20;

pub fn run(args: &Args, start: Instant) {
    let model = &args.models[0];
    let replicas = args.cold_replicas;
    let devices = args.replica_devices(args.devices.len());
    let output = devices[0].clone();
    let sizes = args.sizes();
    let net = Net::new(model, sizes, &output);
    let mut trained = match replicas {
        0 => Trained::Bare(net),
        n => Trained::Wrapped(
            DataParallel::new(net, args.replica_devices(n)).expect("the devices exist"),
        ),
    };
    let batch = Batch::random(
        args.rows(model, replicas),
        Net::features(model, sizes),
        &output,
    );
    wait(&devices);
    let ready = start.elapsed();
    let mut optim: ModuleOptimizer = SgdConfig::new().init();
    let mut firsts = Vec::new();
    let mut steady = Vec::new();
    for i in 0..3 + STEADY {
        let step = Instant::now();
        trained = trained.step(&batch, &mut optim);
        wait(&devices);
        match i < 3 {
            true => firsts.push(start.elapsed()),
            false => steady.push(step.elapsed()),
        }
    }
    let firsts: Vec<String> = firsts
        .into_iter()
        .map(|d| format!("{:.3}", d.as_secs_f64()))
        .collect();
    println!(
        "cold {model} x{replicas} rows {}: model and batch on the devices {:.3} s; end of steps 1, 2, 3 at [{}] s from the start of main; steady step {} ms (median of the next {STEADY})",
        batch.inputs.dims()[0],
        ready.as_secs_f64(),
        firsts.join(", "),
        ms(median(steady)),
    );
}
