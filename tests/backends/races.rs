//! Burn 0.21's autodiff race (tracel-ai/burn#5573, fixed in 0.22): a `backward()` on one
//! thread can free steps of a graph another thread is still building, which then silently
//! loses a gradient (seen with `Tensor::cat` over leaves reused every step). The replicas'
//! backwards run on several threads at once, over the same parameters every step; this
//! repeats them many times while other threads run such autodiff loops beside them and
//! checks every gradient of every round, with the parallel backward and with the single one
//! (the replicas' forwards building one graph from their threads).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::common::*;
use burn::tensor::Tensor;
use burn_dataparallel::{DataParallelBackend, DataParallelConfig};

/// The loop that loses gradients on Burn 0.21 (the reproduction of tracel-ai/burn#5573): a
/// leaf goes through a throwaway backward (which drops its graph's entry), then through
/// `Tensor::cat`, whose window between taking its inputs and registering its output a
/// backward on another thread can reclaim. Counts the rounds whose leaf came back without a
/// gradient.
fn victim_loop<B: DataParallelBackend>(stop: Arc<AtomicBool>, lost: Arc<AtomicUsize>) {
    let device = Default::default();
    while !stop.load(Ordering::Relaxed) {
        let leaf = random::<B, 2>([128, 128], &device).require_grad();
        let _ = leaf.clone().mul_scalar(1.0).sum().backward();
        let both = Tensor::cat(vec![leaf.clone(), leaf.clone()], 0);
        let grads = both.sum().backward();
        if leaf.grad(&grads).is_none() {
            lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Backwards of throwaway graphs, each ending with Burn's cleanup of every graph.
fn sweeper_loop<B: DataParallelBackend>(stop: Arc<AtomicBool>) {
    let device = Default::default();
    while !stop.load(Ordering::Relaxed) {
        let a = random::<B, 1>([8], &device).require_grad();
        let _ = (a.clone() * a).sum().backward();
    }
}

/// `parallel`: the replicas' backwards on their workers (per-replica graphs); otherwise the
/// single backward on the calling thread, one graph that the replicas' forwards build from
/// their threads (what `Fusion` always runs).
fn replica_backwards_keep_every_gradient<B: DataParallelBackend>(
    replicas: usize,
    rounds: usize,
    parallel: bool,
) {
    let device = Default::default();
    let dp = DataParallelConfig::new()
        .with_parallel_backward(parallel)
        .init(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(replicas))
        .unwrap();
    let bare = dp.module().clone();
    // Reused leaves, every round: the parameters and a tracked input.
    let x = random::<B, 2>([2 * replicas + 1, 8], &device).require_grad();
    let loss = |out: Tensor<B, 2>| {
        let weights = probe(&out);
        (out * weights).sum()
    };
    let expected_grads = loss(bare.forward(x.clone())).backward();
    let expected = param_grads(&bare, &expected_grads);
    let expected_input = values(x.grad(&expected_grads).expect("input gradient"));

    let stop = Arc::new(AtomicBool::new(false));
    let bare_lost = Arc::new(AtomicUsize::new(0));
    let beside = vec![
        {
            let (stop, lost) = (stop.clone(), bare_lost.clone());
            std::thread::spawn(move || victim_loop::<B>(stop, lost))
        },
        {
            let stop = stop.clone();
            std::thread::spawn(move || sweeper_loop::<B>(stop))
        },
    ];
    let mut failed = Vec::new();
    for round in 0..rounds {
        let output = dp.forward_with(x.clone(), |m, x| m.forward(x));
        let grads = loss(output).backward();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_grads_close(&param_grads(dp.module(), &grads), &expected);
            let input = x.grad(&grads).expect("input gradient");
            assert_close(&values(input), &expected_input, "input gradient");
        }));
        if outcome.is_err() {
            failed.push(round);
        }
    }
    stop.store(true, Ordering::Relaxed);
    for thread in beside {
        thread.join().expect("the loop beside");
    }
    eprintln!(
        "{rounds} rounds of {replicas} replicas: {} with a wrong or missing gradient; the bare \
         loop beside them lost a gradient {} times",
        failed.len(),
        bare_lost.load(Ordering::Relaxed)
    );
    assert!(failed.is_empty(), "rounds with a lost gradient: {failed:?}");
}

backend_tests! {
    replica_backwards_keep_every_gradient_two => replica_backwards_keep_every_gradient(2, 1500, true);
    replica_backwards_keep_every_gradient_four => replica_backwards_keep_every_gradient(4, 750, true);
    single_backward_keeps_every_gradient_two => replica_backwards_keep_every_gradient(2, 1500, false);
    single_backward_keeps_every_gradient_four => replica_backwards_keep_every_gradient(4, 750, false);
}
