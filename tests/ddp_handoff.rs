//! The hand-off from `DataParallel` to Burn's distributed data parallelism
//! (`examples/ddp_handoff.rs`): a model trained through the wrapper and saved continues from
//! that checkpoint on burn-collective peers that all-reduce their gradients, and after the
//! same steps at the same global batch it matches the wrapper's own continuation.

mod common;

#[allow(dead_code)]
#[path = "../examples/common/handoff.rs"]
mod handoff;
#[path = "../examples/common/handoff_nodes.rs"]
mod handoff_nodes;

use std::sync::Mutex;

use burn::tensor::backend::AutodiffBackend;
use burn_dataparallel::DataParallelBackend;
use handoff::*;
use handoff_nodes::{NODE_ENV, run_node_from_env, run_processes};

/// burn-collective keeps one collective per backend type in the process: one hand-off at a
/// time.
static COLLECTIVE: Mutex<()> = Mutex::new(());

/// The hand-offs' data: `BATCHES` global batches of `ROWS` rows (equal slices for 2, 3 and 4
/// peers and replicas), the first `HALF` trained through the wrapper, the rest after the
/// hand-off.
const BATCHES: usize = 12;
const ROWS: usize = 12;
const HALF: usize = 6;

/// The first half of a hand-off: `HALF` steps through the wrapper (three replicas), and the
/// checkpoint, `classifier` in the returned folder. Returns the batches, the saved
/// parameters and the folder.
fn first_half<B: DataParallelBackend + AutodiffBackend>(
    device: &B::Device,
    optim: Optim,
) -> (Vec<Batch>, Vec<f32>, tempfile::TempDir) {
    let all = batches(BATCHES, ROWS);
    let model = Classifier::<B>::new(device);
    let (model, _) = train_data_parallel(model, vec![device.clone(); 3], &all[..HALF], optim);
    let saved = parameters(&model);
    let dir = tempfile::tempdir().expect("a temporary folder");
    save(model, &dir.path().join("classifier")).expect("save");
    (all, saved, dir)
}

/// Six steps through the wrapper (three replicas), the checkpoint, then six more steps on
/// `peers` peers and, for reference, through the wrapper again from the same checkpoint.
/// SGD's update is proportional to the gradient, so a wrong reduction (a sum for a mean, a
/// peer left out) shows; Adam's is not, and carries per-parameter state.
fn hand_off<B: DataParallelBackend + AutodiffBackend>(peers: usize, optim: Optim) {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let device: B::Device = Default::default();
    let (all, saved, dir) = first_half::<B>(&device, optim);
    let (next, path) = (&all[HALF..], dir.path().join("classifier"));

    let runs = train_all_reduce::<B>(&path, vec![device.clone(); peers], next, optim);
    assert_eq!(runs.len(), peers);
    for (peer, run) in runs.iter().enumerate() {
        assert_eq!(
            parameters(&run.loaded),
            saved,
            "peer {peer} starts from the checkpoint"
        );
    }
    let mean = |step: usize| runs.iter().map(|r| r.losses[step]).sum::<f32>() / peers as f32;
    let last = BATCHES - HALF - 1;
    assert!(
        mean(last) < mean(0),
        "the loss falls: {} -> {}",
        mean(0),
        mean(last)
    );

    let reference = load::<B>(&path, &device).expect("load");
    let (reference, _) = train_data_parallel(reference, vec![device; 3], next, optim);
    let reference = parameters(&reference);
    let first = parameters(&runs[0].trained);
    for (peer, run) in runs.iter().enumerate() {
        let trained = parameters(&run.trained);
        let difference = relative_difference(&trained, &reference);
        assert!(
            difference < 1e-4,
            "peer {peer} against DataParallel: relative difference {difference:e}"
        );
        assert!(
            relative_difference(&trained, &first) < 1e-6,
            "peer {peer} against peer 0"
        );
    }
}

/// The same hand-off with the peers as processes: this test binary again, once per node,
/// running [`node_process`] (the node's half of [`run_processes`]), all-reducing through
/// burn-collective's orchestrator over the loopback interface.
fn hand_off_to_processes<B: DataParallelBackend + AutodiffBackend>(nodes: usize, optim: Optim) {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let device: B::Device = Default::default();
    let (all, saved, dir) = first_half::<B>(&device, optim);
    let (next, path) = (&all[HALF..], dir.path().join("classifier"));

    let exe = std::env::current_exe().expect("this test binary");
    let command = || {
        let mut command = std::process::Command::new(&exe);
        command.args(["--exact", "node_process", "--ignored", "--nocapture"]);
        command
    };
    let limit = std::time::Duration::from_secs(60);
    let trained = run_processes::<B>(
        command,
        nodes,
        &path,
        (HALF, BATCHES, ROWS),
        optim,
        &device,
        limit,
    );

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

/// Two processes on Flex (the nodes' backend). Ignored: burn-collective 0.21.0's multi-node
/// all-reduce hangs on loopback after the first gradients (see `handoff_nodes.rs`); this test
/// is its reproduction, and fails within a minute when run (`--ignored`).
#[test]
#[ignore = "burn-collective 0.21.0's multi-node all-reduce hangs on loopback (benches/RESULTS.md, 2026-12-01)"]
fn two_processes_continue_the_wrappers_training() {
    common::within("two_processes", || {
        hand_off_to_processes::<common::FlexAd>(2, Optim::Sgd(0.1))
    });
}

/// A node of [`hand_off_to_processes`]: runs only in a process that test starts (the node's
/// settings in the environment); elsewhere it has nothing to do.
#[test]
#[ignore = "a node process of the multi-process hand-off, started by that test"]
fn node_process() {
    assert!(
        run_node_from_env::<common::FlexAd>(Default::default()),
        "started without {NODE_ENV}: run by `hand_off_to_processes` only"
    );
}

macro_rules! hand_off_tests {
    ($($module:ident => $backend:ty;)*) => {$(
        mod $module {
            use super::*;

            #[test]
            fn two_peers_continue_the_wrappers_training_sgd() {
                common::within("two_peers_sgd", || hand_off::<$backend>(2, Optim::Sgd(0.1)));
            }

            #[test]
            fn four_peers_continue_the_wrappers_training_sgd() {
                common::within("four_peers_sgd", || hand_off::<$backend>(4, Optim::Sgd(0.1)));
            }

            #[test]
            fn two_peers_continue_the_wrappers_training_adam() {
                common::within("two_peers_adam", || hand_off::<$backend>(2, Optim::Adam(1e-2)));
            }

            #[test]
            fn four_peers_continue_the_wrappers_training_adam() {
                common::within("four_peers_adam", || hand_off::<$backend>(4, Optim::Adam(1e-2)));
            }
        }
    )*};
}

hand_off_tests! {
    flex => common::FlexAd;
    ndarray => common::NdArrayAd;
}
