//! Outgrowing `DataParallel` across processes: train a model through the wrapper, save its
//! checkpoint, and continue from it on `N` processes (this program again, one node each) that
//! all-reduce their gradients through burn-collective's orchestrator on the loopback
//! interface, as nodes on several machines would with their addresses in their
//! `CollectiveConfig`. Then compare with the wrapper's own continuation.
//!
//! ```sh
//! scripts/patch-collective.sh      # once: burn-collective 0.21.0 with its barrier fixed
//! cargo run --release --manifest-path multinode/Cargo.toml --example ddp_processes -- 4
//! ```

use std::process::Command;
use std::time::Duration;

use burn_dataparallel_handoff::*;
use burn_dataparallel_multinode::nodes::{Hosts, run_node_from_env, run_processes};

fn main() {
    type B = burn::backend::Autodiff<burn::backend::Flex>;
    let device = Default::default();
    if run_node_from_env::<B>(device) {
        return;
    }
    let nodes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2);
    let (global_batch, optim) = (64, Optim::Adam(1e-2));

    // 1. Train through DataParallel on one machine (two replicas here) and save.
    let all = batches(40, global_batch);
    let (first, next) = all.split_at(20);
    let path = train_and_save::<B>("ddp_processes", &device, 2, first, optim);

    // 2. Continue on `nodes` processes at the same global batch, each on its own slice.
    let exe = std::env::current_exe().expect("this program");
    let trained = run_processes::<B>(
        |_node| Command::new(&exe),
        &Hosts::loopback(nodes),
        &path,
        (20, 40, global_batch),
        optim,
        &device,
        Duration::from_secs(120),
    );
    println!("all-reduce over {nodes} processes, 20 more steps: done");

    // 3. The same 20 steps through DataParallel from the same checkpoint, for comparison.
    let resumed = load::<B>(&path, &device).expect("the checkpoint");
    let (reference, _) = train_data_parallel(resumed, vec![device; 2], next, optim);
    for (node, model) in trained.iter().enumerate() {
        let difference = relative_difference(&parameters(model), &parameters(&reference));
        println!("node {node} against DataParallel: relative difference {difference:.2e}");
    }
    let _ = std::fs::remove_dir_all(path.parent().expect("the checkpoint folder"));
}
