//! Tracked tensors that reach the replicas other than as split input: passed whole
//! (`Broadcast`), or captured by the forward closure, which the wrapper refuses where it can
//! see it and bounds in time where it cannot. Each body runs under the watchdog of
//! `backend_tests!`.

use crate::common::*;
use crate::graphs::{assert_same, weighted, wrap};
use burn::tensor::Tensor;
use burn_dataparallel::{Broadcast, DataParallelBackend, DataParallelConfig, DataParallelError};

/// A tracked tensor passed whole to every replica (`Broadcast`) gets the sum of their
/// gradients; one captured by the closure and used on the output is refused with a typed
/// error rather than left without a gradient.
fn broadcast_and_captured_tensors_case<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = wrap(Mlp::<B>::new(8, 16, 4, &device), 3, true);
    let bare = dp.module().clone();
    let x = random::<B, 2>([7, 8], &device);
    let scale = random::<B, 2>([1, 4], &device).require_grad();
    let expected = weighted(bare.forward(x.clone()) * scale.clone(), 1.0).backward();
    let output = dp.forward_with(
        (x.clone(), Broadcast(scale.clone())),
        |m, (x, Broadcast(s))| m.forward(x) * s,
    );
    let actual = weighted(output, 1.0).backward();
    assert_same(&dp, &actual, &bare, &expected);
    assert_close(
        &values(scale.grad(&actual).expect("broadcast gradient")),
        &values(scale.grad(&expected).expect("broadcast gradient")),
        "broadcast gradient",
    );
    if distinct_plan() {
        // A captured tensor stays on the caller's device: a replica on another device fails
        // with Burn's device check, reported as that replica's panic (not a wrong answer).
        let captured = dp.try_forward_with(x, |m, x| m.forward(x) * scale.clone());
        assert_other_device_refused(captured.map(|t| t.dims()));
        return;
    }
    if B::concurrent_backward() {
        let captured = dp.try_forward_with(x, |m, x| m.forward(x) * scale.clone());
        assert!(
            matches!(captured, Err(DataParallelError::CapturedTensor { .. })),
            "expected a captured-tensor error, got {:?}",
            captured.map(|t| t.dims())
        );
    }
}

/// A tracked tensor captured by the closure, used on the replicas' input and in the caller's
/// loss too: the single backward gives it the bare model's gradient. Under the parallel
/// backward the wrapper cannot see it (Burn 0.21's public API); the caller's backward must
/// still end in bounded time: when Burn merged the replicas' graphs with the caller's (a
/// fresh tensor's first use), with a panic after the configured bound that names the bound
/// and captured tensors (a replica waited for its graph, or, when the replicas' threads raced
/// Burn's merges, its backward did not finish); or by returning.
fn captured_in_the_loss_case<B: DataParallelBackend>(parallel: bool) {
    let device = Default::default();
    let model = Mlp::<B>::new(8, 16, 4, &device);
    let dp = DataParallelConfig::new()
        .with_parallel_backward(parallel)
        .with_backward_timeout_secs(Some(2))
        .init(model, devices::<B>(3))
        .unwrap();
    let bare = dp.module().clone();
    let x = random::<B, 2>([7, 8], &device);
    let scale = random::<B, 2>([1, 8], &device).require_grad();
    let loss = |output: Tensor<B, 2>| weighted(output, 1.0) + scale.clone().sum();
    if distinct_plan() {
        let captured = dp.try_forward_with(x, |m, x| m.forward(x * scale.clone()));
        assert_other_device_refused(captured.map(|t| t.dims()));
        return;
    }
    if parallel && B::concurrent_backward() {
        let actual = loss(dp.forward_with(x, |m, x| m.forward(x * scale.clone())));
        let started = std::time::Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| actual.backward()));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "ended after {:?}, with a bound of 2 s",
            started.elapsed()
        );
        if let Err(payload) = result {
            let message = panic_text(payload.as_ref());
            assert!(
                message.contains("backward_timeout_secs") && message.contains("captured"),
                "message: {message}"
            );
        }
        return;
    }
    let expected = loss(bare.forward(x.clone() * scale.clone())).backward();
    let actual = loss(dp.forward_with(x, |m, x| m.forward(x * scale.clone()))).backward();
    assert_same(&dp, &actual, &bare, &expected);
    assert_close(
        &values(scale.grad(&actual).expect("captured gradient")),
        &values(scale.grad(&expected).expect("captured gradient")),
        "captured gradient",
    );
}

/// With replicas on distinct devices, a tensor captured on the caller's device meets a
/// replica's tensors on another device: Burn's device check fails that replica, and the
/// wrapper returns its panic as an error naming it.
fn assert_other_device_refused<T: std::fmt::Debug>(result: Result<T, DataParallelError>) {
    match result {
        Err(DataParallelError::ReplicaPanicked {
            replica, message, ..
        }) => {
            assert!(replica > 0, "replica 0 shares the caller's device");
            assert!(message.contains("same device"), "message: {message}");
        }
        other => panic!("expected replica on another device to fail, got {other:?}"),
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match payload.downcast_ref::<String>() {
        Some(message) => message.clone(),
        None => payload
            .downcast_ref::<&str>()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    }
}

backend_tests! {
    broadcast_and_captured => broadcast_and_captured_tensors_case();
    captured_in_the_loss => captured_in_the_loss_case(true);
    captured_in_the_loss_serial => captured_in_the_loss_case(false);
}
