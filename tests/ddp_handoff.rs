//! The hand-off from `DataParallel` to Burn's distributed data parallelism
//! (`examples/ddp_handoff.rs`, its code in `handoff/`): a model trained through the wrapper and saved continues from
//! that checkpoint on burn-collective peers that all-reduce their gradients, and after the
//! same steps at the same global batch it matches the wrapper's own continuation.

mod common;

use std::sync::Mutex;

use burn::tensor::backend::AutodiffBackend;
use burn_dataparallel::DataParallelBackend;
use burn_dataparallel_handoff::*;

/// burn-collective keeps one collective per backend type in the process: one hand-off at a
/// time.
static COLLECTIVE: Mutex<()> = Mutex::new(());

/// Six steps through the wrapper (three replicas), the checkpoint, then six more steps on
/// `peers` peers and, for reference, through the wrapper again from the same checkpoint.
/// SGD's update is proportional to the gradient, so a wrong reduction (a sum for a mean, a
/// peer left out) shows; Adam's is not, and carries per-parameter state.
fn hand_off<B: DataParallelBackend + AutodiffBackend>(peers: usize, optim: Optim) {
    let _one = COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner());
    let device: B::Device = Default::default();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (all, saved) = first_half::<B>(&device, optim, dir.path());
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
