//! `moves`: a model's parameters between the first two distinct devices of `--devices`, as
//! Burn moves them (`Module::to_device`, one transfer per tensor) against as the wrapper
//! does (`replicate`: one transfer for them all), in both directions; and the backward that
//! brings a gradient of every parameter back (a loss of half the sum of every parameter's
//! square on the moved copy: each gradient the parameter, a dense tensor as a model's are). The four operations alternate round by round; each sample is `--steps` calls, the
//! devices synced at both ends.

use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor};
use burn_dataparallel::replicate;

use crate::models::Net;
use crate::own_loop::range;
use crate::{Args, median, ms};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    /// Burn's `Module::to_device`.
    Burn,
    /// The crate's `replicate`.
    Together,
}

pub fn run(args: &Args) {
    let devices: Vec<Device> = args.devices.list.clone().autodiff().into_vec();
    let mut distinct: Vec<Device> = Vec::new();
    for device in devices {
        if !distinct.contains(&device) {
            distinct.push(device);
        }
    }
    let [from, to, ..] = distinct.as_slice() else {
        panic!("`moves` needs two distinct devices in --devices");
    };
    println!(
        "from {from:?} to {to:?} and back, {} rounds of {} calls after a warm-up round",
        args.rounds, args.steps
    );
    println!(
        "| model | tensors | MB | operation | Burn's to_device (ms) | range | together (ms) | range | together/Burn |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for model in &args.models {
        for (source, target, label) in [(from, to, "there"), (to, from, "back")] {
            let net = Net::new(model, args.sizes(), source);
            let (count, bytes) = size(&net);
            let mb = bytes as f64 / 1e6;
            for backward in [false, true] {
                let mut times = [Vec::new(), Vec::new()];
                for round in 0..=args.rounds {
                    for k in 0..2 {
                        let way = [Way::Burn, Way::Together][(k + round) % 2];
                        let time = sample(&net, target, way, backward, args.steps);
                        if round > 0 {
                            times[(k + round) % 2].push(time);
                        }
                    }
                }
                let (burn, together) = (median(times[0].clone()), median(times[1].clone()));
                let ((b_lo, b_hi), (t_lo, t_hi)) = (range(&times[0]), range(&times[1]));
                let operation = match backward {
                    false => format!("move {label}"),
                    true => format!("move {label}, gradients back"),
                };
                println!(
                    "| {model} | {count} | {mb:.1} | {operation} | {} | {}–{} | {} | {}–{} | {:.3} |",
                    ms(burn),
                    ms(b_lo),
                    ms(b_hi),
                    ms(together),
                    ms(t_lo),
                    ms(t_hi),
                    together.as_secs_f64() / burn.as_secs_f64()
                );
            }
        }
    }
}

/// The time of one call of `way` moving `net` to `target` (and, with `backward`, a backward
/// through the moved copy), over `calls` calls.
fn sample(net: &Net, target: &Device, way: Way, backward: bool, calls: usize) -> Duration {
    let source = net.devices()[0].clone();
    let sync = || {
        source.sync().expect("the source answers");
        target.sync().expect("the target answers");
    };
    sync();
    let start = Instant::now();
    let mut kept = Vec::with_capacity(calls);
    for _ in 0..calls {
        let moved = match way {
            Way::Burn => net.clone().to_device(target),
            Way::Together => replicate(net, std::slice::from_ref(target)).remove(0),
        };
        if backward {
            let grads = sum_of_params(&moved).backward();
            kept.push(grads);
        } else {
            drop(moved);
        }
    }
    sync();
    let elapsed = start.elapsed() / calls as u32;
    drop(kept);
    elapsed
}

/// The number of float parameters (running states included) and their bytes.
fn size(net: &Net) -> (usize, usize) {
    struct Count(usize, usize);
    impl ModuleVisitor for Count {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let value = param.val();
            self.0 += 1;
            self.1 += value.shape().num_elements() * value.dtype().size();
        }
    }
    let mut count = Count(0, 0);
    net.visit(&mut count);
    (count.0, count.1)
}

/// Half the sum of every trainable parameter's squares: a loss whose backward gives every
/// parameter a gradient, the parameter itself. (A plain sum's gradients are broadcast views
/// of one value, which some backends copy slower than dense tensors.)
fn sum_of_params(net: &Net) -> Tensor<1> {
    struct Sum(Option<Tensor<1>>);
    impl ModuleVisitor for Sum {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let value = param.val();
            if !value.is_tracked() {
                return;
            }
            let sum = value.powi_scalar(2).sum().div_scalar(2.0);
            self.0 = Some(match self.0.take() {
                Some(total) => total + sum,
                None => sum,
            });
        }
    }
    let mut sum = Sum(None);
    net.visit(&mut sum);
    sum.0.expect("a trainable parameter")
}
