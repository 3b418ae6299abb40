//! Cross-stream memory reuse in CubeCL 0.10 on CUDA, and the controls that show where it bites.
//!
//! ```sh
//! cargo run --release --features cuda --example cross_stream -- all [ROUNDS]
//! cargo run --release --features cuda --example cross_stream -- reuse [ROUNDS]
//! cargo run --release --features cuda --example cross_stream -- late [ROUNDS]
//! cargo run --release --features cuda --example cross_stream -- bare cube|fusion [ROUNDS]
//! cargo run --release --features cuda --example cross_stream -- wrapper cube|fusion REPLICAS PARALLEL_BACKWARD(0|1) [ROUNDS]
//! ```
//!
//! CubeCL 0.10 gives every thread a stream of its own, each with its own memory pool. When a
//! kernel on stream B reads a buffer of stream A's pool, B waits for A and the buffer is kept
//! from reuse until that kernel has run, but only if B had not already waited for A past the
//! buffer's write (`cubecl-runtime-0.10.0/src/stream/event.rs`, `update_shared_bindings`:
//! only the bindings that need a new wait are handed to the collector). A second kernel on B
//! reading the same buffer is therefore not protected: once the last handle is dropped, A may
//! hand the memory to a new tensor and write it while B's kernel is still queued, and that
//! kernel reads the new values.
//!
//! - `reuse`: the reproduction on Burn's `CubeBackend` alone, no autodiff and no wrapper: a
//!   buffer made on the main thread is read twice by a worker thread, with a few milliseconds
//!   of matrix products queued between the reads; the main thread drops the buffer and fills
//!   a new one of the same size. With the worker on a stream of its own (Burn's default), the
//!   second read returns the new tensor's values; with the worker on the main thread's stream
//!   (`StreamId::executes`), never.
//! - `late`: the second gap, again on `CubeBackend` alone. A stream's wait for another is
//!   keyed to the cursor at which a buffer was *allocated* (`handle_cursor` reads the slice's
//!   cursor, set when the memory is bound): once stream B has waited for stream A past that
//!   point, B reads the buffer without waiting again, even if A has since queued a write to
//!   it. The main thread makes a buffer of zeros, a worker thread reads another buffer of the
//!   main stream (B waits for A, past the zeros' allocation), then the main thread queues a
//!   few milliseconds of matrix products and adds 5 to the zeros in place, and hands them to
//!   the worker, which reads them. On the worker's own stream it may read the zeros; on the
//!   main thread's stream, or with the main thread waiting for its device before the hand-off
//!   (`Backend::sync`), it reads 5. burn-train 0.21 reads every step's output on a metric
//!   thread of its own in this way (`metric/processor/async_wrapper.rs`, `ItemLazy::sync`).
//! - `bare`: an MLP driven from two persistent worker threads by hand (no wrapper): each runs
//!   the forward of half the batch, the main thread concatenates and runs the backward, four
//!   steps before the gradients are compared with the same steps on the main thread alone.
//! - `wrapper`: `DataParallel` with REPLICAS replicas on GPU 0 and the parallel backward on or
//!   off, one step per round, every gradient compared with the bare model's.
//!
//! Each control prints one table row: rounds, rounds with a wrong value, the largest relative
//! error, and milliseconds per round.

use std::sync::mpsc::{Sender, channel};
use std::time::Instant;

use burn::backend::Autodiff;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, StreamId, Tensor, TensorData};
use burn_cubecl::CubeBackend;
use burn_dataparallel::{DataParallelBackend, DataParallelConfig};
use cubecl::cuda::{CudaDevice, CudaRuntime};

type Cube = CubeBackend<CudaRuntime, f32, i32, u8>;
type CubeAd = Autodiff<Cube>;
type FusionAd = Autodiff<burn::backend::Cuda>;

/// Relative error above which a gradient counts as wrong (TF32 matrix products on the GPU
/// stay far below it).
const WRONG: f32 = 1e-2;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let rounds = |i: usize, default: usize| arg(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    println!(
        "| control | backend | worker streams | rounds | wrong rounds | largest error | ms per round |"
    );
    println!("|---|---|---|---|---|---|---|");
    match arg(0).unwrap_or("all") {
        "reuse" => reuse_both(rounds(1, 50)),
        "late" => late_all(rounds(1, 50)),
        "bare" => bare_both(arg(1).unwrap_or("cube"), rounds(2, 100)),
        "wrapper" => wrapper(
            arg(1).unwrap_or("cube"),
            rounds(2, 2),
            arg(3) != Some("0"),
            rounds(4, 200),
        ),
        "all" => {
            let n = rounds(1, 200);
            reuse_both(n / 4);
            late_all(n / 4);
            for backend in ["cube", "fusion"] {
                bare_both(backend, n);
                wrapper(backend, 1, true, n);
                wrapper(backend, 2, true, n);
                wrapper(backend, 2, false, n);
            }
        }
        other => panic!("unknown control {other}: reuse, late, bare, wrapper or all"),
    }
}

fn device() -> CudaDevice {
    CudaDevice { index: 0 }
}

fn row(control: &str, backend: &str, streams: &str, wrong: &[f32], started: Instant) {
    let bad = wrong.iter().filter(|e| **e > WRONG).count();
    let worst = wrong.iter().copied().fold(0.0f32, f32::max);
    let ms = started.elapsed().as_secs_f64() * 1e3 / wrong.len().max(1) as f64;
    println!(
        "| {control} | {backend} | {streams} | {} | {bad} | {worst:.2e} | {ms:.2} |",
        wrong.len()
    );
}

/// `reuse` with the worker on its own stream, then on the main thread's.
fn reuse_both(rounds: usize) {
    for shared in [false, true] {
        let started = Instant::now();
        let wrong: Vec<f32> = (0..rounds).map(|_| reuse_round(shared)).collect();
        row("reuse", "cube", streams(shared), &wrong, started);
    }
}

fn streams(shared: bool) -> &'static str {
    match shared {
        true => "the caller's",
        false => "own (Burn's default)",
    }
}

/// One round of the reproduction; the largest relative error of the worker's second read.
fn reuse_round(shared: bool) -> f32 {
    const N: usize = 1 << 20;
    let device = device();
    let x = Tensor::<Cube, 1>::from_data(TensorData::new(vec![1.0f32; N], [N]), &device);
    let caller = StreamId::current();
    let (sender, receiver) = channel();
    std::thread::scope(|scope| {
        let mine = x.clone();
        let on = &device;
        scope.spawn(move || {
            let work = move || {
                // The first read waits for the main thread's stream and protects `x` until it
                // has run.
                let first = mine.clone() * 2.0;
                // Keeps this stream busy for a few milliseconds.
                let mut w = Tensor::<Cube, 2>::ones([1024, 1024], on) / 1024.0;
                for _ in 0..40 {
                    w = w.clone().matmul(w);
                }
                // The second read needs no new wait, so nothing protects `x` for it.
                let second = mine * 3.0;
                sender
                    .send((first, w, second))
                    .expect("the main thread waits");
            };
            match shared {
                true => caller.executes(work),
                false => work(),
            }
        });
        let (first, w, second) = receiver.recv().expect("the worker's tensors");
        drop(x);
        // Same size: the main stream's pool hands out the memory `x` had, and the fill runs
        // at once on the idle main stream.
        let fill = Tensor::<Cube, 1>::full([N], -7.0, &device);
        let values = second.into_data().to_vec::<f32>().expect("f32 values");
        let error = values
            .iter()
            .map(|v| (v - 3.0).abs() / 3.0)
            .fold(0.0, f32::max);
        drop((first, w, fill));
        error
    })
}

/// How the `late` control's worker reads the main thread's buffer.
#[derive(Clone, Copy)]
enum Late {
    /// On its own stream (Burn's default), the buffer handed over at once.
    Own,
    /// On the main thread's stream.
    Shared,
    /// On its own stream, the main thread waiting for its device before the hand-off.
    Synced,
}

/// `late` in each of its three ways.
fn late_all(rounds: usize) {
    for (way, streams) in [
        (Late::Own, "own (Burn's default)"),
        (Late::Shared, "the caller's"),
        (Late::Synced, "own, the caller synced"),
    ] {
        let started = Instant::now();
        let wrong: Vec<f32> = (0..rounds).map(|_| late_round(way)).collect();
        row("late", "cube", streams, &wrong, started);
    }
}

/// One round of `late`; the relative error of the worker's read of the buffer (1 where it
/// read the zeros).
fn late_round(way: Late) -> f32 {
    const N: usize = 1 << 20;
    let device = device();
    // Allocated before the worker waits for this stream.
    let x = Tensor::<Cube, 1>::zeros([N], &device);
    let other = Tensor::<Cube, 1>::ones([N], &device);
    let caller = StreamId::current();
    let (to_worker, from_main) = channel::<Tensor<Cube, 1>>();
    let (to_main, from_worker) = channel::<Vec<f32>>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let work = move || {
                for tensor in from_main {
                    let values = tensor.into_data().to_vec::<f32>().expect("f32 values");
                    to_main.send(values).expect("the main thread waits");
                }
            };
            match way {
                Late::Shared => caller.executes(work),
                Late::Own | Late::Synced => work(),
            }
        });
        // The worker's read of `other` makes its stream wait for this one, past `x`.
        to_worker.send(other).expect("a worker");
        from_worker.recv().expect("the worker's read");
        // Keeps this stream busy for a few milliseconds before the write to `x`.
        let mut w = Tensor::<Cube, 2>::ones([1024, 1024], &device) / 1024.0;
        for _ in 0..40 {
            w = w.clone().matmul(w);
        }
        // In place: `x` has no other handle.
        let x = x + 5.0;
        if let Late::Synced = way {
            Cube::sync(&device).expect("the device finishes");
        }
        to_worker.send(x).expect("a worker");
        let values = from_worker.recv().expect("the worker's read");
        drop((to_worker, w));
        values
            .iter()
            .map(|v| (v - 5.0).abs() / 5.0)
            .fold(0.0, f32::max)
    })
}

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    first: Linear<B>,
    act: Relu,
    second: Linear<B>,
    third: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            first: LinearConfig::new(64, 256).init(device),
            act: Relu::new(),
            second: LinearConfig::new(256, 256).init(device),
            third: LinearConfig::new(256, 8).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = self.act.forward(self.first.forward(x));
        self.third.forward(self.act.forward(self.second.forward(h)))
    }
}

/// Every parameter gradient of `model`, flattened, in visiting order.
fn gradients<B: AutodiffBackend, M: Module<B>>(model: &M, grads: &B::Gradients) -> Vec<Vec<f32>> {
    struct Collect<'a, B: AutodiffBackend> {
        grads: &'a B::Gradients,
        out: Vec<Vec<f32>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param.val().grad(self.grads);
            let values = grad.map(|g| g.into_data().to_vec::<f32>().expect("f32 values"));
            self.out.push(values.unwrap_or_default());
        }
    }
    let mut visitor = Collect::<B> {
        grads,
        out: Vec::new(),
    };
    model.visit(&mut visitor);
    visitor.out
}

/// The largest relative error of `got` against `want`, parameter by parameter (a missing
/// gradient counts as wrong).
fn error(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.len() != w.len() {
                return f32::INFINITY;
            }
            let scale = w.iter().map(|v| v.abs()).fold(1e-6, f32::max);
            g.iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs() / scale)
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

fn bare_both(backend: &str, rounds: usize) {
    match backend {
        "cube" => {
            bare::<CubeAd>("cube", rounds, false);
            bare::<CubeAd>("cube", rounds, true);
        }
        "fusion" => {
            bare::<FusionAd>("fusion", rounds, false);
            bare::<FusionAd>("fusion", rounds, true);
        }
        other => panic!("unknown backend {other}: cube or fusion"),
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Two persistent worker threads, as the wrapper has lanes.
fn workers() -> Vec<Sender<Job>> {
    (0..2)
        .map(|_| {
            let (sender, jobs) = channel::<Job>();
            std::thread::spawn(move || jobs.into_iter().for_each(|job| job()));
            sender
        })
        .collect()
}

/// The bare model's forward split over two worker threads by hand, four steps per round.
fn bare<B: AutodiffBackend>(name: &str, rounds: usize, shared: bool)
where
    B::Device: From<CudaDevice>,
{
    const STEPS: usize = 4;
    let device: B::Device = device().into();
    let model = Mlp::<B>::new(&device);
    let lanes = workers();
    let started = Instant::now();
    let mut wrong = Vec::new();
    for _ in 0..rounds {
        let inputs: Vec<Tensor<B, 2>> = (0..STEPS)
            .map(|_| Tensor::random([64, 64], Distribution::Normal(0.0, 1.0), &device))
            .collect();
        let loss = |outputs: Tensor<B, 2>| outputs.powi_scalar(2).mean();
        let mut reference = Tensor::<B, 1>::zeros([1], &device);
        for x in &inputs {
            reference = reference + loss(model.forward(x.clone())).reshape([1]);
        }
        let want = gradients(&model, &reference.backward());
        let caller = StreamId::current();
        let mut total = Tensor::<B, 1>::zeros([1], &device);
        for x in inputs {
            let halves = x.split_with_sizes(vec![32, 32], 0);
            let (sender, receiver) = channel();
            for (index, (half, lane)) in halves.into_iter().zip(&lanes).enumerate() {
                let (model, sender) = (model.clone(), sender.clone());
                let job = move || {
                    let _ = sender.send((index, model.forward(half)));
                };
                lane.send(match shared {
                    true => Box::new(move || caller.executes(job)),
                    false => Box::new(job),
                })
                .expect("a worker");
            }
            drop(sender);
            let mut outputs: Vec<_> = receiver.iter().collect();
            outputs.sort_by_key(|(index, _)| *index);
            let output = Tensor::cat(outputs.into_iter().map(|(_, o)| o).collect(), 0);
            total = total + loss(output).reshape([1]);
        }
        wrong.push(error(&gradients(&model, &total.backward()), &want));
    }
    row("bare, 2 threads", name, streams(shared), &wrong, started);
}

fn wrapper(backend: &str, replicas: usize, parallel_backward: bool, rounds: usize) {
    match backend {
        "cube" => wrapper_on::<CubeAd>("cube", replicas, parallel_backward, rounds),
        "fusion" => wrapper_on::<FusionAd>("fusion", replicas, parallel_backward, rounds),
        other => panic!("unknown backend {other}: cube or fusion"),
    }
}

/// The wrapper over `replicas` replicas on GPU 0 against the bare model, one step per round.
fn wrapper_on<B: DataParallelBackend>(
    name: &str,
    replicas: usize,
    parallel_backward: bool,
    rounds: usize,
) where
    B::Device: From<CudaDevice>,
{
    let device: B::Device = device().into();
    let dp = DataParallelConfig::new()
        .with_parallel_backward(parallel_backward)
        .init(Mlp::<B>::new(&device), vec![device.clone(); replicas])
        .expect("a wrapper");
    // The wrapper's own module (its parameters initialised) is the bare model.
    let model = dp.module().clone();
    let started = Instant::now();
    let mut wrong = Vec::new();
    for _ in 0..rounds {
        let x = Tensor::<B, 2>::random([96, 64], Distribution::Normal(0.0, 1.0), &device);
        let want = gradients(
            &model,
            &model.forward(x.clone()).powi_scalar(2).mean().backward(),
        );
        let output = dp.forward_with(x, |m, x| m.forward(x));
        let got = gradients(&model, &output.powi_scalar(2).mean().backward());
        wrong.push(error(&got, &want));
    }
    let control = format!(
        "wrapper, {replicas} replica(s), parallel backward {}",
        match parallel_backward {
            true => "on",
            false => "off",
        }
    );
    row(&control, name, "as the wrapper runs them", &wrong, started);
}
