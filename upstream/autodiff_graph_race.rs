//! Burn 0.22.1's autodiff loses a recorded step when several threads record operations on
//! tensors of one graph at the same time, without this crate.
//!
//! Each parameter that requires a gradient starts an autodiff graph of its own, and an
//! operation whose parents belong to several graphs merges them. Recording an operation
//! selects its graph under the graph locator's lock, releases that lock, then locks the
//! graph's state to register the step (`burn-autodiff-0.22.1/src/runtime/graph.rs`,
//! `GraphMutexClient::register`): a thread that merges that graph away in between leaves the
//! step registered in a graph nobody reaches, and the backward later panics with "graph tape
//! has already been consumed".
//!
//! Here one batch is split into three pieces whose forwards run on three threads, sharing one
//! `Linear` and a scale, then concatenated for one backward; four such trainings run at once
//! (more threads make the window likelier on a small machine). The same work with the pieces'
//! forwards on the training's own thread never fails. Run:
//!
//! ```sh
//! cargo run --release --example autodiff_graph_race
//! ```
//!
//! Seen here (2 cores, 2026-12-05): 1 failure in 600 trainings with the forwards on threads,
//! 0 in 600 without. `DataParallel` records the replicas' forwards one after the other for
//! this reason (`src/parallel_apply.rs`).

use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Distribution, Tensor};

/// One training step; whether its backward ran.
fn step(forwards_on_threads: bool) -> bool {
    let device = Device::flex().autodiff();
    let body: Linear = LinearConfig::new(6, 3).init(&device);
    let scale = Tensor::<1>::from_floats([1.5, -0.5, 2.0], &device).require_grad();
    let x = Tensor::<2>::random([7, 6], Distribution::Default, &device);
    let pieces = x.split_with_sizes(vec![3, 2, 2], 0);
    let forward = |piece: Tensor<2>| body.forward(piece) * scale.clone().unsqueeze();
    let outputs: Vec<Tensor<2>> = match forwards_on_threads {
        true => std::thread::scope(|s| {
            let handles: Vec<_> = pieces
                .into_iter()
                .map(|piece| s.spawn(|| forward(piece)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        }),
        false => pieces.into_iter().map(forward).collect(),
    };
    let loss = Tensor::cat(outputs, 0).tanh().sum();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loss.backward())).is_ok()
}

fn main() {
    std::panic::set_hook(Box::new(|_| {}));
    for forwards_on_threads in [false, true] {
        let ran: usize = std::thread::scope(|s| {
            let trainings: Vec<_> = (0..4)
                .map(|_| s.spawn(move || (0..150).filter(|_| step(forwards_on_threads)).count()))
                .collect();
            trainings.into_iter().map(|h| h.join().unwrap()).sum()
        });
        println!(
            "forwards on threads: {forwards_on_threads}: {} of 600 backwards failed",
            600 - ran
        );
    }
}
