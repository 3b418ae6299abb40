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
fn victim_loop<B: DataParallelBackend>(stop: Arc<AtomicBool>, lost: Arc<AtomicUsize>, size: usize) {
    let device = Default::default();
    while !stop.load(Ordering::Relaxed) {
        let leaf = random::<B, 2>([size, size], &device).require_grad();
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

/// Starts `pairs` victim loops over leaves of `size` x `size`, counting into `lost`, and as
/// many sweepers, all running until `stop`.
fn start_loops<B: DataParallelBackend>(
    pairs: usize,
    size: usize,
    stop: &Arc<AtomicBool>,
    lost: &Arc<AtomicUsize>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for _ in 0..pairs {
        let (victim_stop, lost) = (stop.clone(), lost.clone());
        threads.push(std::thread::spawn(move || {
            victim_loop::<B>(victim_stop, lost, size)
        }));
        let sweeper_stop = stop.clone();
        threads.push(std::thread::spawn(move || sweeper_loop::<B>(sweeper_stop)));
    }
    threads
}

/// Stops the loops [`start_loops`] started and waits for them.
fn stop_loops(stop: &AtomicBool, threads: Vec<std::thread::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a victim or sweeper loop");
    }
}

/// Runs `rounds` rounds with the victim and sweeper loops running beside them: each round
/// computes its gradients (`round`) and returns the checks of them, which are caught, so that
/// every wrong round is counted. Prints the count beside the bare loop's lost gradients and
/// fails on any wrong round.
fn under_stress<B: DataParallelBackend, C: FnOnce()>(
    what: &str,
    rounds: usize,
    mut round: impl FnMut() -> C,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let bare_lost = Arc::new(AtomicUsize::new(0));
    let beside = start_loops::<B>(1, 128, &stop, &bare_lost);
    let mut failed = Vec::new();
    let rounds = stress_rounds(rounds);
    for index in 0..rounds {
        let checks = round();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(checks)).is_err() {
            failed.push(index);
        }
    }
    stop_loops(&stop, beside);
    eprintln!(
        "{rounds} {what}: {} with a wrong or missing gradient; the bare loop beside them lost a \
         gradient {} times",
        failed.len(),
        bare_lost.load(Ordering::Relaxed)
    );
    assert!(failed.is_empty(), "rounds with a lost gradient: {failed:?}");
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
    let what = format!("rounds of {replicas} replicas");
    under_stress::<B, _>(&what, rounds, || {
        let output = dp.forward_with(x.clone(), |m, x| m.forward(x));
        let grads = loss(output).backward();
        let (dp, x, expected, expected_input) = (&dp, &x, &expected, &expected_input);
        move || {
            assert_grads_close(&param_grads(dp.module(), &grads), expected);
            let input = x.grad(&grads).expect("input gradient");
            assert_close(&values(input), expected_input, "input gradient");
        }
    });
}

backend_tests! {
    replica_backwards_keep_every_gradient_two => replica_backwards_keep_every_gradient(2, 1500, true);
    replica_backwards_keep_every_gradient_four => replica_backwards_keep_every_gradient(4, 750, true);
    single_backward_keeps_every_gradient_two => replica_backwards_keep_every_gradient(2, 1500, false);
    single_backward_keeps_every_gradient_four => replica_backwards_keep_every_gradient(4, 750, false);
}

/// The Learner path under the same stress: rounds of the wrapper's `TrainStep::step` (every
/// replica's own step, its `loss.backward()` on its lane) with the loops above running beside
/// it, every gradient of every round against the bare model's own step on the same batch.
/// `parallel` false takes the replicas' steps one at a time, as on `Fusion`.
#[cfg(feature = "train")]
fn train_steps_case<B: DataParallelBackend>(rounds: usize, parallel: bool) {
    use burn::data::dataloader::batcher::Batcher;
    use burn::module::{Module, ModuleVisitor, Param, ParamId};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::AutodiffBackend;
    use burn::train::TrainStep;

    use crate::learner::{ImageBatcher, items};
    use crate::learner_steps::{Custom, Heads};

    /// Every gradient of `grads` for `module`'s parameters, in visiting order.
    fn collect<B: AutodiffBackend, M: Module<B>>(
        module: &M,
        grads: &GradientsParams,
    ) -> Vec<(ParamId, Vec<f32>)> {
        struct Collect<'a> {
            grads: &'a GradientsParams,
            out: Vec<(ParamId, Vec<f32>)>,
        }
        impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
                    self.out
                        .push((param.id, values(Tensor::<B, D>::from_inner(grad))));
                }
            }
        }
        let mut visitor = Collect {
            grads,
            out: Vec::new(),
        };
        module.visit(&mut visitor);
        visitor.out
    }

    let device = Default::default();
    let dp = DataParallelConfig::new()
        .with_parallel_backward(parallel)
        .init(Heads::<B>::new(Custom::Penalty, &device), devices::<B>(3))
        .unwrap();
    let bare = dp.module().clone();
    // Seven items over three replicas (3, 2, 2), the same batch every round.
    let batch = ImageBatcher.batch(items(7, 3), &device);
    let expected = collect(&bare, &TrainStep::step(&bare, batch.clone()).grads);
    // The body's and the head's weight and bias (the auxiliary head is unused here).
    assert_eq!(expected.len(), 4, "every used parameter has a gradient");
    under_stress::<B, _>("train steps over 3 replicas", rounds, || {
        let output = TrainStep::step(&dp, batch.clone());
        let (dp, expected) = (&dp, &expected);
        move || assert_grads_close(&collect(dp.module(), &output.grads), expected)
    });
}

/// The Learner path's cases, in a module of their own (one `backend_tests!` per module).
#[cfg(feature = "train")]
mod learner_path {
    use super::*;

    backend_tests! {
        train_steps_keep_every_gradient => train_steps_case(500, true);
        train_steps_one_at_a_time_keep_every_gradient => train_steps_case(500, false);
    }
}

/// The positive control of the stress above: Burn #5573's own reproduction on the bare model,
/// no wrapper (six victim loops and six sweepers, leaves of 256 x 256), which must lose a
/// gradient within `DATAPARALLEL_CONTROL_SECS` (60 by default) for the stress tests' zeros to
/// bound Burn's race. Ignored, since it has not fired on any machine tried (two CPU cores,
/// about 23,000 rounds; sixteen, 20 s on each backend, 2026-12-02): run it with `--ignored`
/// where you want to know (`scripts/gpu-check.sh run LOG_DIR trust` runs it on every backend
/// built). Until it fires, the stress tests bound the wrapper's own graph building only.
fn bare_loops_lose_a_gradient<B: DataParallelBackend>() {
    const LOOPS: usize = 6;
    let bound = std::env::var("DATAPARALLEL_CONTROL_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(60);
    let stop = Arc::new(AtomicBool::new(false));
    let lost = Arc::new(AtomicUsize::new(0));
    let threads = start_loops::<B>(LOOPS, 256, &stop, &lost);
    let began = std::time::Instant::now();
    while lost.load(Ordering::Relaxed) == 0 && began.elapsed().as_secs() < bound {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    stop_loops(&stop, threads);
    let lost = lost.load(Ordering::Relaxed);
    eprintln!(
        "positive control: {lost} lost gradients in {:.1} s",
        began.elapsed().as_secs_f64()
    );
    assert!(
        lost > 0,
        "Burn's race did not fire within {bound} s on the bare loops"
    );
}

/// The positive control on each backend (see [`bare_loops_lose_a_gradient`]), each under the
/// tests' watchdog.
mod positive_control {
    use super::*;

    macro_rules! controls {
        ($($(#[$cfg:meta])* $name:ident => $backend:ident;)*) => {$(
            $(#[$cfg])*
            #[test]
            #[ignore = "a positive control that has not fired on the machines tried; run with --ignored"]
            fn $name() {
                within_for(stringify!($name), 180, bare_loops_lose_a_gradient::<$backend>);
            }
        )*};
    }

    controls! {
        flex => FlexAd;
        ndarray => NdArrayAd;
        #[cfg(feature = "cuda")]
        cuda_fusion => CudaAd;
        #[cfg(feature = "cuda")]
        cuda_cube => CubeAd;
    }
}
