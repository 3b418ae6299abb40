//! Host cost of Burn's autodiff on several threads at once: the bound on how well replicas
//! that are limited by their host work (small batches, many small kernels) can scale.
//!
//! ```sh
//! cargo bench --bench autodiff_threads          # 1 against 2 threads, 7 rounds
//! cargo bench --bench autodiff_threads -- 4     # 1 against 4 threads
//! cargo bench --features cuda --bench autodiff_threads -- 2 cube            # one GPU
//! cargo bench --features cuda --bench autodiff_threads -- 2 cube distinct   # a GPU each
//! ```
//!
//! Each thread trains its own deep, narrow model (60 `Linear` 4→4 layers with ReLU and two
//! scalar ops, batch 2; on Flex, or with `cube` or `fusion` on CUDA), so a step is almost
//! only host work: on a GPU, launching some 300 tiny kernels. Threads start every step
//! together (a barrier); each takes the median of its forward times and of its backward
//! times, and a row shows the slowest thread's against one thread alone, run just before.
//! The same forward without autodiff (`plain`) is the control: what the threads cost each
//! other outside autodiff (cores, caches, allocator, and on a GPU the device's one server
//! thread, through which CubeCL runs every thread's launches for that device). On CUDA the
//! threads share the default device unless `distinct` gives each its own (modulo the count).

use std::sync::Barrier;
use std::time::Instant;

use burn::backend::flex::FlexDevice;
use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::{AutodiffBackend, Backend};
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

/// Median forward and backward time (µs) of each of `threads` threads over `steps` steps,
/// thread `i` on `devices[i % devices.len()]`; without `autodiff`, the forward alone on the
/// inner backend. Each forward and backward ends with its device synchronised, so on a GPU
/// the times include the kernels (and, under `Fusion`, their execution at all).
fn per_thread<B: AutodiffBackend>(
    devices: &[B::Device],
    threads: usize,
    steps: usize,
    autodiff: bool,
) -> Vec<(f64, f64)> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let barrier = &barrier;
                let device = devices[i % devices.len()].clone();
                scope.spawn(move || {
                    let model = Deep::<B>::new(&device);
                    let plain = model.valid();
                    let sync = || B::sync(&device).expect("sync");
                    let (mut forwards, mut backwards) = (Vec::new(), Vec::new());
                    for _ in 0..steps {
                        barrier.wait();
                        let start = Instant::now();
                        if autodiff {
                            let x = Tensor::<B, 2>::random([2, 4], Distribution::Default, &device);
                            let loss = model.forward(x).sum();
                            sync();
                            forwards.push(start.elapsed().as_secs_f64());
                            let start = Instant::now();
                            let _grads = loss.backward();
                            sync();
                            backwards.push(start.elapsed().as_secs_f64());
                        } else {
                            let x = Tensor::random([2, 4], Distribution::Default, &device);
                            let _ = plain.forward(x).sum();
                            sync();
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

/// Seven rounds of one thread alone against `many` at once, thread `i` on
/// `devices[i % devices.len()]`, and the median ratios.
fn rounds<B: AutodiffBackend>(devices: &[B::Device], many: usize) {
    println!(
        "| round | autodiff forward, 1 / {many} threads (µs) | ratio | autodiff backward (µs) | \
         ratio | plain forward (µs) | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    let slowest = |rows: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        rows.iter().map(pick).fold(0.0, f64::max)
    };
    let run = |threads, autodiff| per_thread::<B>(devices, threads, 200, autodiff);
    // Every thread's device warms up (kernels compiled, memory reserved) before timing.
    let _ = (run(many, true), run(many, false));
    let mut ratios = [Vec::new(), Vec::new(), Vec::new()];
    for round in 1..=7 {
        // Alone and together back to back, so that both see the same machine state.
        let (one, together) = (run(1, true), run(many, true));
        let (plain_one, plain_together) = (run(1, false), run(many, false));
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

/// Every device of `B`'s default kind with `distinct`, else the default device alone.
#[cfg(feature = "cuda")]
fn devices<B: Backend>(distinct: bool) -> Vec<B::Device> {
    use burn::tensor::backend::Device;
    match distinct {
        true => {
            dataparallel_dev::spread::<B>(B::device_count(B::Device::default().to_id().type_id))
        }
        false => vec![B::Device::default()],
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let many: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(2);
    let has = |name: &str| args.iter().any(|a| a == name);
    let distinct = has("distinct");
    #[cfg(feature = "cuda")]
    {
        use burn::backend::{Autodiff, Cuda};
        type Cube = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
        if has("cube") {
            println!("CubeBackend<CudaRuntime>; {}", placement(distinct));
            return rounds::<Autodiff<Cube>>(&devices::<Cube>(distinct), many);
        }
        if has("fusion") {
            println!("Cuda (Fusion); {}", placement(distinct));
            return rounds::<Autodiff<Cuda>>(&devices::<Cuda>(distinct), many);
        }
    }
    println!("Flex; {}", placement(distinct));
    rounds::<Autodiff<Flex>>(&[FlexDevice], many);
}

/// How the threads are placed, for the heading.
fn placement(distinct: bool) -> &'static str {
    match distinct {
        true => "one device per thread (modulo the count)",
        false => "every thread on one device",
    }
}
