//! Outputs and gradients equal the bare model's on the whole batch.

use burn::tensor::{Device, Tensor};
use burn_dataparallel::{DataParallel, Mean, Sum};

use super::models::{Mlp, batch};
use crate::common::{assert_close, assert_same_grads};

/// The wrapper's output and the gradients of a squared loss through it, against the bare
/// model's, for a batch of `rows`.
fn outputs_and_gradients_match(devices: &[Device], rows: usize) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let (x, _) = batch(rows, device);

    let expected = model.forward(x.clone());
    let found = dp.forward(x.clone());
    assert_close(found.clone(), expected.clone(), 1e-5, "output");

    let expected_grads = expected.powi_scalar(2).sum().backward();
    let found_grads = found.powi_scalar(2).sum().backward();
    // A control: the bare model's backward once more. Where it differs from the first, the
    // reference varies, whatever the wrapper does.
    let again = model.forward(x).powi_scalar(2).sum().backward();
    labelled(
        "the bare model's gradients differ between two backwards",
        || assert_same_grads(dp.module(), &again, &expected_grads, 1e-4),
    );
    assert_same_grads(dp.module(), &found_grads, &expected_grads, 1e-4);
}

/// Runs `check`; where it fails, says `what` failed before failing with the check's own
/// message (a control and the comparison it guards report alike).
fn labelled(what: &str, check: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
        eprintln!("{what}");
        std::panic::resume_unwind(payload);
    }
}

/// A control that uses no wrapper (run alone, a process without one): the bare model's
/// gradients of one batch, [`STEPS`] times more, equal the first's. Where it fails, the
/// reference the other tests compare with varies, whatever the wrapper does; as many
/// backwards as [`gradients_match_step_after_step`] runs of the bare model, so that a fault
/// as rare shows as often.
pub fn the_bare_model_s_gradients_repeat(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let (x, _) = batch(12, device);
    let first = model.forward(x.clone()).powi_scalar(2).sum().backward();
    for _ in 0..2 * STEPS {
        let again = model.forward(x.clone()).powi_scalar(2).sum().backward();
        assert_same_grads(&model, &again, &first, 1e-4);
    }
}

/// Step after step, on a batch of its own each, the wrapper's gradients equal the bare
/// model's and the bare model's equal themselves on a second backward: a fault that shows in
/// a few steps of a thousand (a race) shows here in one process.
pub fn gradients_match_step_after_step(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let loss = |y: Tensor<2>| y.powi_scalar(2).sum();
    for step in 0..STEPS {
        let (x, _) = batch(5 + step % 8, device);
        let expected = loss(model.forward(x.clone())).backward();
        let found = loss(dp.forward(x.clone())).backward();
        let again = loss(model.forward(x)).backward();
        // Which of the two differs tells a fault of the reference from one of the wrapper.
        let checks = [
            ("the bare model's second backward", &again),
            ("the wrapper's backward", &found),
        ];
        for (what, grads) in checks {
            let what =
                format!("step {step} of {STEPS}: {what} differs from the bare model's first");
            labelled(&what, || {
                assert_same_grads(dp.module(), grads, &expected, 1e-4)
            });
        }
    }
}

/// Steps of [`gradients_match_step_after_step`].
const STEPS: usize = 100;

pub fn even_batches(devices: &[Device]) {
    outputs_and_gradients_match(devices, 12);
}

pub fn uneven_batches(devices: &[Device]) {
    outputs_and_gradients_match(devices, 7);
}

pub fn batches_smaller_than_the_device_list(devices: &[Device]) {
    outputs_and_gradients_match(devices, 2);
    outputs_and_gradients_match(devices, 1);
}

/// `Mean` of per-replica means is the whole batch's mean, even for uneven shards; `Sum` the
/// whole batch's sum.
pub fn mean_and_sum_losses_are_the_whole_batch_s(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let (x, y) = batch(7, device);

    let bare = || (model.forward(x.clone()) - y.clone()).powi_scalar(2);
    let wrapped = || {
        dp.forward_with((x.clone(), y.clone()), |m, (x, y)| {
            let error = (m.forward(x) - y).powi_scalar(2);
            (Mean(error.clone().mean()), Sum(error.sum()))
        })
    };
    // One backward per graph: Burn keeps no graph after a backward.
    let (expected, (Mean(found), _)) = (bare().mean(), wrapped());
    assert_close(found.clone(), expected.clone(), 1e-5, "mean");
    assert_same_grads(dp.module(), &found.backward(), &expected.backward(), 1e-4);
    let (expected, (_, Sum(found))) = (bare().sum(), wrapped());
    assert_close(found.clone(), expected.clone(), 1e-5, "sum");
    assert_same_grads(dp.module(), &found.backward(), &expected.backward(), 1e-4);
}

/// Several forwards before one backward (gradient accumulation), and the wrapper applied to
/// its own output.
pub fn several_forwards_before_one_backward(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let (a, _) = batch(5, device);
    let (b, _) = batch(4, device);
    let square = |t: Tensor<2>| t.powi_scalar(2).sum();

    let expected = square(model.forward(a.clone())) + square(model.forward(b.clone()));
    let found = square(dp.forward(a)) + square(dp.forward(b));
    assert_close(found.clone(), expected.clone(), 1e-5, "loss");
    assert_same_grads(dp.module(), &found.backward(), &expected.backward(), 1e-4);
}

/// A wrapper inside a replica of another runs its module directly.
pub fn a_wrapper_inside_a_replica(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let inner = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let outer = DataParallel::new(inner.clone(), devices.to_vec()).unwrap();
    let (x, _) = batch(6, device);

    let expected = model.forward(x.clone());
    let found = outer.forward_with(x, |inner, x| inner.forward(x));
    assert_close(found.clone(), expected.clone(), 1e-5, "output");
    let grads = found.sum().backward();
    assert_same_grads(
        outer.module().module(),
        &grads,
        &expected.sum().backward(),
        1e-4,
    );
}

/// Two wrappers in one loss (an encoder and a head wrapped apart), against the bare pair.
pub fn two_wrappers_in_one_loss(devices: &[Device]) {
    let device = &devices[0];
    let encoder = Mlp::new(device);
    let head: burn::nn::Linear = burn::nn::LinearConfig::new(3, 2).init(device);
    let dp_encoder = DataParallel::new(encoder.clone(), devices.to_vec()).unwrap();
    let dp_head = DataParallel::new(head.clone(), devices.to_vec()).unwrap();
    let (x, _) = batch(7, device);

    let expected = head.forward(encoder.forward(x.clone()).tanh());
    let hidden = dp_encoder.forward(x).tanh();
    let found = dp_head.forward_with(hidden, |m, h| m.forward(h));
    assert_close(found.clone(), expected.clone(), 1e-5, "output");
    let (found, expected) = (
        found.powi_scalar(2).sum().backward(),
        expected.powi_scalar(2).sum().backward(),
    );
    assert_same_grads(dp_encoder.module(), &found, &expected, 1e-4);
    assert_same_grads(dp_head.module(), &found, &expected, 1e-4);
}

/// Inference on devices without autodiff: the bare model's outputs, nothing tracked.
pub fn inference_without_autodiff(devices: &[Device]) {
    let plain: Vec<Device> = devices
        .iter()
        .map(|d| d.clone().without_autodiff())
        .collect();
    let device = &plain[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), plain.clone()).unwrap();
    let (x, _) = batch(9, device);
    let found = dp.forward(x.clone());
    assert!(!found.is_require_grad());
    assert_close(found, model.forward(x), 1e-5, "output");
}

crate::on_every_device_list!(
    the_bare_model_s_gradients_repeat => super::the_bare_model_s_gradients_repeat,
    gradients_match_step_after_step => super::gradients_match_step_after_step,
    even_batches => super::even_batches,
    uneven_batches => super::uneven_batches,
    batches_smaller_than_the_device_list => super::batches_smaller_than_the_device_list,
    mean_and_sum_losses_are_the_whole_batch_s => super::mean_and_sum_losses_are_the_whole_batch_s,
    several_forwards_before_one_backward => super::several_forwards_before_one_backward,
    a_wrapper_inside_a_replica => super::a_wrapper_inside_a_replica,
    two_wrappers_in_one_loss => super::two_wrappers_in_one_loss,
    inference_without_autodiff => super::inference_without_autodiff,
);
