//! The controls on `CubeBackend` alone (no autodiff, no wrapper): `reuse` and `late`.

use std::sync::mpsc::channel;
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{StreamId, Tensor, TensorData};

use crate::{Cube, device, row, streams};

/// `reuse` with the worker on its own stream, then on the main thread's.
pub fn reuse_both(rounds: usize) {
    for shared in [false, true] {
        let started = Instant::now();
        let wrong: Vec<f32> = (0..rounds).map(|_| reuse_round(shared)).collect();
        row("reuse", "cube", streams(shared), &wrong, started);
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
pub fn late_all(rounds: usize) {
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
