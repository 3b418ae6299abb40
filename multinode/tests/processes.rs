//! The hand-off to burn-collective with the peers as processes: this test binary again, once
//! per node, running `node_process`, all-reducing through the orchestrator over the loopback
//! interface. Against the fixed burn-collective of this workspace; every wait is bounded.

use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn_dataparallel_multinode::handoff::*;
use burn_dataparallel_multinode::nodes::{NODE_ENV, run_node_from_env, run_processes};

type B = Autodiff<Flex>;

/// burn-collective keeps one collective per backend type in the process: one test at a time.
static COLLECTIVE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The barrier that ends every global all-reduce, on one node: with the fix, the second
/// all-reduce returns (published 0.21.0: it never does; the main crate's
/// `tests/ddp_handoff.rs` keeps that reproduction, ignored).
#[test]
fn two_global_all_reduces_in_one_process() {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    two_global_all_reduces::<Flex>(Duration::from_secs(30)).unwrap();
}

/// `HALF` steps through the wrapper, the checkpoint, then `HALF` more on `nodes` processes,
/// each on its own slice of every global batch; their parameters equal the wrapper's own
/// continuation from the same checkpoint.
fn hand_off_to_processes(nodes: usize, optim: Optim) {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let device = Default::default();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (all, saved) = first_half::<B>(&device, optim, dir.path());
    let (next, path) = (&all[HALF..], dir.path().join("classifier"));
    let exe = std::env::current_exe().expect("this test binary");
    let command = || {
        let mut command = std::process::Command::new(&exe);
        command.args(["--exact", "node_process", "--ignored", "--nocapture"]);
        command
    };
    let trained = run_processes::<B>(
        command,
        nodes,
        &path,
        (HALF, BATCHES, ROWS),
        optim,
        &device,
        Duration::from_secs(60),
    );
    assert_eq!(trained.len(), nodes);
    let reference = load::<B>(&path, &device).expect("load");
    assert_eq!(
        parameters(&reference),
        saved,
        "the checkpoint keeps every bit"
    );
    let (reference, _) = train_data_parallel(reference, vec![device; 3], next, optim);
    let reference = parameters(&reference);
    for (node, trained) in trained.iter().enumerate() {
        let difference = relative_difference(&parameters(trained), &reference);
        assert!(
            difference < 1e-4,
            "node {node} against DataParallel: relative difference {difference:e}"
        );
    }
}

#[test]
fn two_processes_continue_the_wrappers_training_sgd() {
    hand_off_to_processes(2, Optim::Sgd(0.1));
}

#[test]
fn four_processes_continue_the_wrappers_training_sgd() {
    hand_off_to_processes(4, Optim::Sgd(0.1));
}

#[test]
fn two_processes_continue_the_wrappers_training_adam() {
    hand_off_to_processes(2, Optim::Adam(1e-2));
}

#[test]
fn four_processes_continue_the_wrappers_training_adam() {
    hand_off_to_processes(4, Optim::Adam(1e-2));
}

/// A node of [`hand_off_to_processes`]: runs only in a process that test starts (the node's
/// settings in the environment); elsewhere it has nothing to do.
#[test]
#[ignore = "a node process of the multi-process hand-off, started by those tests"]
fn node_process() {
    assert!(
        run_node_from_env::<B>(Default::default()),
        "started without {NODE_ENV}: run by `hand_off_to_processes` only"
    );
}
