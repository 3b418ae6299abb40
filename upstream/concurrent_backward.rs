//! Whether independent trainings on several threads of one process, sharing one device and
//! nothing else, each get the same gradients step after step, without this crate.
//!
//! Each thread builds a two-layer perceptron and a batch of its own, takes the gradients of
//! a squared loss once as its reference, then `ROUNDS` times more; a round whose gradients
//! differ from the reference by more than the crate's GPU tolerance (5e-3 of each
//! gradient's largest element: TF32 products round to about 1e-3 of it) is wrong. With `churn`, every round
//! also allocates and drops tensors of a few sizes, so that memory the other threads free is
//! handed out again. With `tanh`, the perceptron's activation is a tanh instead of a ReLU:
//! where products are rounded differently from one backward to the next, a ReLU turns the
//! difference at a unit whose input is near zero into that unit's whole term, a tanh keeps
//! it a rounding difference. Burn's CubeCL backends give every thread a stream of its own.
//!
//! A last row runs trainings one after the other, each on a fresh thread (a stream of its
//! own) with a model of its own, two backwards each: how a test harness runs tests.
//!
//! Rows: threads, rounds, wrong rounds, the largest relative error, milliseconds per round.
//! Run (CUDA after `scripts/llvm-from-pypi.sh`; `flex` needs no feature):
//!
//! ```sh
//! cargo run --release --example concurrent_backward -- [flex|cuda] [ROUNDS] [churn] [tanh]
//! CUDARC_CUDA_VERSION=13000 cargo run --release --features cuda,fusion --example concurrent_backward -- cuda 200
//! ```

use std::time::Instant;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::activation::Activation;
use burn::nn::{Linear, LinearConfig, Relu, Tanh};
use burn::tensor::{Device, Distribution, Gradients, Tensor};

/// Error, relative to a gradient's largest element, above which a round counts as wrong.
const WRONG: f32 = 5e-3;

#[derive(Module, Debug)]
struct Mlp {
    first: Linear,
    activation: Activation,
    second: Linear,
}

impl Mlp {
    /// With a ReLU, or with a tanh where `smooth`.
    fn new(smooth: bool, device: &Device) -> Self {
        Self {
            first: LinearConfig::new(6, 8).init(device),
            activation: match smooth {
                true => Tanh::new().into(),
                false => Relu::new().into(),
            },
            second: LinearConfig::new(8, 3).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.second
            .forward(self.activation.forward(self.first.forward(x)))
    }
}

/// Every parameter's gradient of `grads`, read to the host, in the module's order.
fn gradients(model: &Mlp, grads: &Gradients) -> Vec<Vec<f32>> {
    struct Read<'a>(&'a Gradients, Vec<Vec<f32>>);
    impl ModuleVisitor for Read<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let grad = param
                .val()
                .grad(self.0)
                .expect("every parameter has a gradient");
            self.1.push(
                grad.into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .expect("f32"),
            );
        }
    }
    let mut read = Read(grads, Vec::new());
    model.visit(&mut read);
    read.1
}

/// The largest difference of any gradient's elements, relative to that gradient's largest
/// element (relative to each element, a rounding of a small one would look large).
fn largest_error(found: &[Vec<f32>], expected: &[Vec<f32>]) -> f32 {
    (found.iter().zip(expected))
        .map(|(f, e)| {
            let scale = e.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            (f.iter().zip(e))
                .map(|(f, e)| (f - e).abs() / scale)
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

/// One thread's training: the largest error of each round against the first.
fn training(device: &Device, rounds: usize, churn: bool, smooth: bool) -> Vec<f32> {
    let model = Mlp::new(smooth, device);
    let x = Tensor::<2>::random([12, 6], Distribution::Normal(0.0, 1.0), device);
    let grads = |model: &Mlp| {
        let loss = model.forward(x.clone()).powi_scalar(2).sum();
        gradients(model, &loss.backward())
    };
    let reference = grads(&model);
    (0..rounds)
        .map(|round| {
            if churn {
                let sizes = [1 << 6, 1 << 10, 1 << 14, 1 << 18];
                let kept: Vec<Tensor<1>> = (sizes.iter())
                    .map(|&n| Tensor::<1>::full([n + round % 7], 1.0, device) * 2.0)
                    .collect();
                drop(kept);
            }
            largest_error(&grads(&model), &reference)
        })
        .collect()
}

/// `rounds` trainings one after the other, each on a fresh thread with a model of its own:
/// the largest error of each one's second backward against its first.
fn fresh_threads(device: &Device, rounds: usize, churn: bool, smooth: bool) -> Vec<f32> {
    (0..rounds)
        .map(|_| {
            std::thread::scope(|s| {
                s.spawn(|| training(device, 1, churn, smooth)[0])
                    .join()
                    .expect("a training")
            })
        })
        .collect()
}

fn device(name: &str) -> Device {
    let device = match name {
        "flex" => Device::flex(),
        #[cfg(feature = "cuda")]
        "cuda" => Device::cuda(0),
        other => panic!("unknown device {other}: flex, or cuda with its feature"),
    };
    device.autodiff()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map_or("flex", String::as_str);
    let rounds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let churn = args.iter().skip(2).any(|a| a == "churn");
    let smooth = args.iter().skip(2).any(|a| a == "tanh");
    let device = device(name);
    let activation = if smooth { "tanh" } else { "relu" };
    println!(
        "| device | activation | churn | threads | rounds | wrong rounds | largest error | ms per round |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for threads in [1, 2, 4, 8] {
        let started = Instant::now();
        let errors: Vec<f32> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| s.spawn(|| training(&device, rounds, churn, smooth)))
                .collect();
            let per_thread = handles.into_iter().map(|h| h.join().expect("a training"));
            per_thread.flatten().collect()
        });
        let what = format!("{name} | {activation} | {churn} | {threads}");
        row(&what, &errors, rounds, started);
    }
    let started = Instant::now();
    let errors = fresh_threads(&device, rounds, churn, smooth);
    let what = format!("{name} | {activation} | {churn} | 1 at a time, fresh");
    row(&what, &errors, rounds, started);
}

/// A row of the table: `what` (its first columns), then the counts and times.
fn row(what: &str, errors: &[f32], rounds: usize, started: Instant) {
    let wrong = errors.iter().filter(|e| **e > WRONG).count();
    let worst = errors.iter().copied().fold(0.0f32, f32::max);
    let ms = started.elapsed().as_secs_f64() * 1e3 / rounds as f64;
    println!(
        "| {what} | {} | {wrong} | {worst:.2e} | {ms:.2} |",
        errors.len()
    );
}
