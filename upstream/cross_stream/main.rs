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
//! `buffers.rs` holds `reuse` and `late`, `models.rs` `bare` and `wrapper`. Each control
//! prints one table row: rounds, rounds with a wrong value, the largest relative error, and
//! milliseconds per round.

mod buffers;
mod models;

use std::time::Instant;

use burn::backend::Autodiff;
use burn_cubecl::CubeBackend;
use cubecl::cuda::{CudaDevice, CudaRuntime};

use buffers::{late_all, reuse_both};
use models::{bare_both, wrapper};

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

fn streams(shared: bool) -> &'static str {
    match shared {
        true => "the caller's",
        false => "own (Burn's default)",
    }
}
