//! Host cost of Burn's autodiff on several threads at once: the bound on how well replicas
//! that are limited by their host work (small batches, many small kernels) can scale.
//!
//! ```sh
//! cargo bench --bench autodiff_threads          # 1 against 2 threads, 7 rounds
//! cargo bench --bench autodiff_threads -- 4     # 1 against 4 threads
//! ```
//!
//! Each thread trains its own deep, narrow model (60 `Linear` 4→4 layers with ReLU and two
//! scalar ops, batch 2, on Flex), so a step is almost only host work. Threads start every
//! step together (a barrier); each takes the median of its forward times and of its backward
//! times, and a row shows the slowest thread's against one thread alone, run just before.
//! The same forward without autodiff (`plain`) is the control: what the threads cost each
//! other outside autodiff (cores, caches, allocator).

use std::sync::Barrier;
use std::time::Instant;

use burn::backend::flex::FlexDevice;
use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

#[derive(Module, Debug)]
struct Deep<B: Backend> {
    layers: Vec<Linear<B>>,
    relu: Relu,
}

impl<B: Backend> Deep<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            layers: (0..60)
                .map(|_| LinearConfig::new(4, 4).init(device))
                .collect(),
            relu: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for layer in &self.layers {
            x = self
                .relu
                .forward(layer.forward(x))
                .mul_scalar(0.5)
                .add_scalar(0.1);
        }
        x
    }
}

/// Median forward and backward time (µs) of each of `threads` threads over `steps` steps;
/// without `autodiff`, the forward alone on the inner backend.
fn per_thread(threads: usize, steps: usize, autodiff: bool) -> Vec<(f64, f64)> {
    let device = FlexDevice;
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let model = Deep::<Autodiff<Flex>>::new(&device);
                    let plain = model.valid();
                    let (mut forwards, mut backwards) = (Vec::new(), Vec::new());
                    for _ in 0..steps {
                        barrier.wait();
                        let start = Instant::now();
                        if autodiff {
                            let x = Tensor::random([2, 4], Distribution::Default, &device);
                            let loss = model.forward(x).sum();
                            forwards.push(start.elapsed().as_secs_f64());
                            let start = Instant::now();
                            let _grads = loss.backward();
                            backwards.push(start.elapsed().as_secs_f64());
                        } else {
                            let x = Tensor::random([2, 4], Distribution::Default, &device);
                            let _ = plain.forward(x).sum();
                            forwards.push(start.elapsed().as_secs_f64());
                            backwards.push(0.0);
                        }
                    }
                    (median(forwards) * 1e6, median(backwards) * 1e6)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The middle value of `values` (the upper one of an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let many: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2);
    println!(
        "| round | autodiff forward, 1 / {many} threads (µs) | ratio | autodiff backward (µs) | \
         ratio | plain forward (µs) | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    let slowest = |rows: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        rows.iter().map(pick).fold(0.0, f64::max)
    };
    let mut ratios = [Vec::new(), Vec::new(), Vec::new()];
    for round in 1..=7 {
        // Alone and together back to back, so that both see the same machine state.
        let (one, together) = (per_thread(1, 200, true), per_thread(many, 200, true));
        let (plain_one, plain_together) = (per_thread(1, 200, false), per_thread(many, 200, false));
        let cells = [
            (slowest(&one, |r| r.0), slowest(&together, |r| r.0)),
            (slowest(&one, |r| r.1), slowest(&together, |r| r.1)),
            (
                slowest(&plain_one, |r| r.0),
                slowest(&plain_together, |r| r.0),
            ),
        ];
        let mut line = format!("| {round} |");
        for (i, (alone, shared)) in cells.iter().enumerate() {
            ratios[i].push(shared / alone);
            line += &format!(" {alone:.0} / {shared:.0} | {:.2}x |", shared / alone);
        }
        println!("{line}");
    }
    let [forward, backward, plain] = ratios.map(median);
    println!(
        "median ratio, slowest of {many} threads against one: autodiff forward {forward:.2}x, \
         autodiff backward {backward:.2}x, plain forward {plain:.2}x"
    );
}
