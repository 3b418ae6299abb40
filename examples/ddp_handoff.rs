//! Outgrowing `DataParallel`: train a model through the wrapper, save its checkpoint, and
//! continue training the same model from that checkpoint with Burn's own distributed data
//! parallelism, the steps of the crate docs' chapter "Outgrowing one machine".
//!
//! ```sh
//! cargo run --release --example ddp_handoff            # CPU (Flex), 2 peers
//! cargo run --release --example ddp_handoff -- 4       # CPU, 4 peers
//! ```
//!
//! With the peers as processes (burn-collective's orchestrator, a node per process): the
//! `multinode/` workspace, `cargo run --manifest-path multinode/Cargo.toml --example
//! ddp_processes` after `scripts/patch-collective.sh`.
//!
//! The distributed form here is burn-collective's (burn's `collective` feature): every peer
//! holds the whole model, takes its own slice of each global batch, and all-reduces its
//! gradients with the other peers' (`GradientsParams::all_reduce`, `ReduceOperation::Mean`)
//! before its own optimizer step, so that every peer applies the same update. Peers here are
//! threads of this process, each registered with burn-collective. burn-train's
//! `ExecutionStrategy::ddp` is the same algorithm under
//! the `Learner`, on backends that implement `DistributedBackend` (in Burn 0.21: CubeCL's,
//! CUDA with NCCL; not the CPU's).
//!
//! To show that nothing is lost in the hand-off, the example also continues the wrapper's run
//! from the same checkpoint and compares: after the same steps at the same global batch, the
//! peers' parameters equal the wrapper's within float tolerance.

// The model, its data and both training loops: `handoff/` (shared with `tests/ddp_handoff.rs`
// and the peers as processes in `multinode/`).
use burn_dataparallel_handoff::*;

fn main() {
    type B = burn::backend::Autodiff<burn::backend::Flex>;
    let device = Default::default();
    let peers: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2);
    let (global_batch, optim) = (64, Optim::Adam(1e-2));

    // 1. Train through DataParallel on one machine (two replicas here) and save.
    let all = batches(40, global_batch);
    let (first, next) = all.split_at(20);
    let path = train_and_save::<B>("ddp_handoff", &device, 2, first, optim);
    println!("checkpoint: {}", path.display());

    // 2. Continue from the checkpoint with Burn's all-reduce over `peers` peers (threads of
    //    this process), at the same global batch: each peer takes global_batch / peers rows.
    let runs = train_all_reduce::<B>(&path, vec![device; peers], next, optim);
    let mean = |step: usize| runs.iter().map(|r| r.losses[step]).sum::<f32>() / peers as f32;
    println!(
        "all-reduce over {peers} peers, 20 more steps: loss {:.4} -> {:.4}",
        mean(0),
        mean(19)
    );
    let trained = runs.into_iter().next().expect("a peer").trained;

    // 3. The same 20 steps through DataParallel from the same checkpoint, for comparison.
    let resumed = load::<B>(&path, &device).expect("the checkpoint");
    let (reference, _) = train_data_parallel(resumed, vec![device; 2], next, optim);
    let difference = relative_difference(&parameters(&trained), &parameters(&reference));
    println!(
        "parameters, all-reduce peers against DataParallel: relative difference {difference:.2e}"
    );
    let _ = std::fs::remove_dir_all(path.parent().expect("the checkpoint folder"));
}
