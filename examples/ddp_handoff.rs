//! Outgrowing `DataParallel`: train a model through the wrapper, save its checkpoint, and
//! continue training the same model from that checkpoint with Burn's own distributed data
//! parallelism, the steps of the crate docs' chapter "Outgrowing one machine".
//!
//! ```sh
//! cargo run --release --example ddp_handoff            # CPU (Flex), 2 peers
//! cargo run --release --example ddp_handoff -- 4       # CPU, 4 peers
//! cargo run --release --example ddp_handoff -- 2 --processes   # 2 processes: hangs in Burn 0.21
//! ```
//!
//! The distributed form here is burn-collective's (burn's `collective` feature): every peer
//! holds the whole model, takes its own slice of each global batch, and all-reduces its
//! gradients with the other peers' (`GradientsParams::all_reduce`, `ReduceOperation::Mean`)
//! before its own optimizer step, so that every peer applies the same update. Peers are
//! threads of this process, each registered with burn-collective, or with `--processes` one
//! process each (this program again), all-reducing through burn-collective's orchestrator
//! over the loopback interface, as nodes on several machines would with their addresses in
//! their `CollectiveConfig` (in Burn 0.21 this form hangs after the first gradients and the
//! example stops after two minutes with the nodes' state: see `common/handoff_nodes.rs`). burn-train's `ExecutionStrategy::ddp` is the same algorithm under
//! the `Learner`, on backends that implement `DistributedBackend` (in Burn 0.21: CubeCL's,
//! CUDA with NCCL; not the CPU's).
//!
//! To show that nothing is lost in the hand-off, the example also continues the wrapper's run
//! from the same checkpoint and compares: after the same steps at the same global batch, the
//! peers' parameters equal the wrapper's within float tolerance.

// Shared with `tests/ddp_handoff.rs`, which uses parts this program does not.
#[allow(dead_code)]
#[path = "common/handoff.rs"]
mod handoff;
#[allow(dead_code)]
#[path = "common/handoff_nodes.rs"]
mod handoff_nodes;

use std::process::Command;
use std::time::Duration;

use handoff::*;
use handoff_nodes::{run_node_from_env, run_processes};

fn main() {
    type B = burn::backend::Autodiff<burn::backend::Flex>;
    let device = Default::default();
    if run_node_from_env::<B>(device) {
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let processes = args.iter().any(|a| a == "--processes");
    let peers: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(2);
    let (global_batch, optim) = (64, Optim::Adam(1e-2));

    // 1. Train through DataParallel on one machine (two replicas here) and save.
    let all = batches(40, global_batch);
    let (first, next) = all.split_at(20);
    let model = Classifier::<B>::new(&device);
    let (model, losses) = train_data_parallel(model, vec![device; 2], first, optim);
    println!(
        "DataParallel, 20 steps: loss {:.4} -> {:.4}",
        losses[0], losses[19]
    );
    let dir = std::env::temp_dir().join(format!("ddp_handoff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a checkpoint folder");
    let path = dir.join("classifier");
    save(model, &path).expect("save the checkpoint");
    println!("checkpoint: {}", path.display());

    // 2. Continue from the checkpoint with Burn's all-reduce over `peers` peers, at the same
    //    global batch (each peer takes global_batch / peers rows of it): threads of this
    //    process, or with `--processes` one process per peer, on the loopback interface.
    let trained = match processes {
        false => {
            let runs = train_all_reduce::<B>(&path, vec![device; peers], next, optim);
            let mean =
                |step: usize| runs.iter().map(|r| r.losses[step]).sum::<f32>() / peers as f32;
            println!(
                "all-reduce over {peers} peers, 20 more steps: loss {:.4} -> {:.4}",
                mean(0),
                mean(19)
            );
            runs.into_iter().next().expect("a peer").trained
        }
        true => {
            let exe = std::env::current_exe().expect("this program");
            let command = || Command::new(&exe);
            let models = run_processes::<B>(
                command,
                peers,
                &path,
                (20, 40, global_batch),
                optim,
                &device,
                Duration::from_secs(120),
            );
            println!("all-reduce over {peers} processes, 20 more steps: done");
            models.into_iter().next().expect("a node")
        }
    };

    // 3. The same 20 steps through DataParallel from the same checkpoint, for comparison.
    let resumed = load::<B>(&path, &device).expect("the checkpoint");
    let (reference, _) = train_data_parallel(resumed, vec![device; 2], next, optim);
    let difference = relative_difference(&parameters(&trained), &parameters(&reference));
    println!(
        "parameters, all-reduce peers against DataParallel: relative difference {difference:.2e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
