//! CubeCL's cross-stream gaps on Burn 0.22.1 (CubeCL 0.11), on CUDA, without this crate: the
//! `reuse` and `late` controls of crate 0.1's `upstream/cross_stream/` (Burn 0.21, CubeCL
//! 0.10), the same steps and the same table. The backend is Burn's CUDA device as the build's
//! features make it (`fusion` on: Burn's Fusion over `CubeBackend`; off: `CubeBackend`).
//!
//! - `reuse`: a buffer of the main thread's stream is read twice by a worker thread on its own
//!   stream, a few milliseconds of matrix products between the reads; the main thread drops the
//!   buffer and fills a new one of the same size. CubeCL 0.10 protects the buffer only for the
//!   first read, so the second may read the fill.
//! - `late`: a buffer of zeros is allocated on the main stream, a worker reads another buffer
//!   of that stream (its stream waits for the main one past the zeros' allocation), then the
//!   main thread queues a few milliseconds of matrix products, adds 5 to the zeros in place and
//!   hands them over. CubeCL 0.10 waits again only for buffers allocated after the last wait,
//!   so the worker may read the zeros.
//!
//! Each row: rounds, rounds with a wrong value, the largest relative error, milliseconds per
//! round; the worker on its own stream (Burn's default), on the caller's
//! (`StreamId::executes`), or (`late`) on its own with the caller synced before the hand-off.
//! Run (after `scripts/llvm-from-pypi.sh`):
//!
//! ```sh
//! CUDARC_CUDA_VERSION=13000 cargo run --release --features cuda --example cross_stream -- [late|reuse|all] [ROUNDS]
//! ```

use std::sync::mpsc::channel;
use std::time::Instant;

use burn::tensor::{Device, StreamId, Tensor, TensorData};

/// Burn's CUDA backend as this build has it.
const BACKEND: &str = if cfg!(feature = "fusion") {
    "fusion<cube>"
} else {
    "cube"
};

/// Relative error above which a round counts as wrong.
const WRONG: f32 = 1e-2;

/// Elements of the buffers handed between threads.
const N: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(50);
    println!(
        "| control | backend | worker streams | rounds | wrong rounds | largest error | ms per round |"
    );
    println!("|---|---|---|---|---|---|---|");
    match args.first().map(String::as_str).unwrap_or("all") {
        "reuse" => reuse_all(rounds),
        "late" => late_all(rounds),
        "all" => {
            reuse_all(rounds);
            late_all(rounds);
        }
        other => panic!("unknown control {other}: reuse, late or all"),
    }
}

/// How the worker reads the main thread's buffer.
#[derive(Clone, Copy)]
enum Way {
    /// On its own stream (Burn's default).
    Own,
    /// On the main thread's stream.
    Shared,
    /// On its own stream, the main thread waiting for its device before the hand-off.
    Synced,
}

const WAYS: [(Way, &str); 3] = [
    (Way::Own, "own (Burn's default)"),
    (Way::Shared, "the caller's"),
    (Way::Synced, "own, the caller synced"),
];

fn device() -> Device {
    Device::cuda(0)
}

/// A few milliseconds of work queued on the calling thread's stream.
fn busy(device: &Device) -> Tensor<2> {
    let mut w = Tensor::<2>::ones([1024, 1024], device) / 1024.0;
    for _ in 0..40 {
        w = w.clone().matmul(w);
    }
    w
}

fn reuse_all(rounds: usize) {
    // Synced makes no sense here (nothing is handed over late): own and shared.
    for (way, streams) in &WAYS[..2] {
        let started = Instant::now();
        let wrong: Vec<f32> = (0..rounds).map(|_| reuse_round(*way)).collect();
        row("reuse", streams, &wrong, started);
    }
}

/// One round of `reuse`; the largest relative error of the worker's second read.
fn reuse_round(way: Way) -> f32 {
    let device = device();
    let x = Tensor::<1>::from_data(TensorData::new(vec![1.0f32; N], [N]), &device);
    let caller = StreamId::current();
    let (sender, receiver) = channel();
    std::thread::scope(|scope| {
        let mine = x.clone();
        let on = &device;
        scope.spawn(move || {
            let work = move || {
                // The first read waits for the main stream and protects `x` until it has run.
                let first = mine.clone() * 2.0;
                let w = busy(on);
                // The second read needs no new wait.
                let second = mine * 3.0;
                sender
                    .send((first, w, second))
                    .expect("the main thread waits");
            };
            match way {
                Way::Shared => caller.executes(work),
                Way::Own | Way::Synced => work(),
            }
        });
        let (first, w, second) = receiver.recv().expect("the worker's tensors");
        drop(x);
        // Same size: the main stream's pool hands out the memory `x` had.
        let fill = Tensor::<1>::full([N], -7.0, &device);
        let values = second.into_data().try_to_vec::<f32>().expect("f32 values");
        drop((first, w, fill));
        largest_error(&values, 3.0)
    })
}

fn late_all(rounds: usize) {
    for (way, streams) in WAYS {
        let started = Instant::now();
        let wrong: Vec<f32> = (0..rounds).map(|_| late_round(way)).collect();
        row("late", streams, &wrong, started);
    }
}

/// One round of `late`; the relative error of the worker's read (1 where it read the zeros).
fn late_round(way: Way) -> f32 {
    let device = device();
    // Allocated before the worker waits for this stream.
    let x = Tensor::<1>::zeros([N], &device);
    let other = Tensor::<1>::ones([N], &device);
    let caller = StreamId::current();
    let (to_worker, from_main) = channel::<Tensor<1>>();
    let (to_main, from_worker) = channel::<Vec<f32>>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let work = move || {
                for tensor in from_main {
                    let values = tensor.into_data().try_to_vec::<f32>().expect("f32 values");
                    to_main.send(values).expect("the main thread waits");
                }
            };
            match way {
                Way::Shared => caller.executes(work),
                Way::Own | Way::Synced => work(),
            }
        });
        // The worker's read of `other` makes its stream wait for this one, past `x`.
        to_worker.send(other).expect("a worker");
        from_worker.recv().expect("the worker's read");
        let w = busy(&device);
        // In place: `x` has no other handle.
        let x = x + 5.0;
        if let Way::Synced = way {
            device.sync().expect("the device finishes");
        }
        to_worker.send(x).expect("a worker");
        let values = from_worker.recv().expect("the worker's read");
        drop((to_worker, w));
        largest_error(&values, 5.0)
    })
}

fn largest_error(values: &[f32], expected: f32) -> f32 {
    values
        .iter()
        .map(|v| (v - expected).abs() / expected)
        .fold(0.0, f32::max)
}

fn row(control: &str, streams: &str, wrong: &[f32], started: Instant) {
    let bad = wrong.iter().filter(|e| **e > WRONG).count();
    let worst = wrong.iter().copied().fold(0.0f32, f32::max);
    let ms = started.elapsed().as_secs_f64() * 1e3 / wrong.len().max(1) as f64;
    println!(
        "| {control} | {} (Burn 0.22.1) | {streams} | {} | {bad} | {worst:.2e} | {ms:.2} |",
        BACKEND,
        wrong.len()
    );
}
