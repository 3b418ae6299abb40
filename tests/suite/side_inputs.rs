//! What a replica reads besides its shard: `Broadcast` tensors, a second module, a batch
//! struct with its own loss weights.

use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Tensor};
use burn_dataparallel::{Broadcast, DataParallel, Mean, impl_scatter};

use super::models::batch;
use crate::common::{assert_close, assert_same_grads};

/// A `Broadcast` tensor's gradient is the sum over the replicas: the bare model's.
pub fn broadcast_tensors_get_the_bare_gradient(devices: &[Device]) {
    let device = &devices[0];
    let body: Linear = LinearConfig::new(6, 3).init(device);
    let head: Linear = LinearConfig::new(3, 2).init(device);
    let dp = DataParallel::new((body.clone(), head.clone()), devices.to_vec()).unwrap();
    let scale = Tensor::<1>::from_floats([1.5, -0.5, 2.0], device).require_grad();
    let (x, _) = batch(7, device);

    let expected = head.forward(body.forward(x.clone()) * scale.clone().unsqueeze());
    let found = dp.forward_with(
        (x, Broadcast(scale.clone())),
        |(body, head), (x, Broadcast(s))| head.forward(body.forward(x) * s.unsqueeze()),
    );
    assert_close(found.clone(), expected.clone(), 1e-5, "output");
    let (found, expected) = (
        found.tanh().sum().backward(),
        expected.tanh().sum().backward(),
    );
    assert_close(
        scale.grad(&found).unwrap(),
        scale.grad(&expected).unwrap(),
        1e-4,
        "scale",
    );
    assert_same_grads(dp.module(), &found, &expected, 1e-4);
}

#[derive(Debug, Clone)]
struct Masked {
    inputs: Tensor<2>,
    targets: Tensor<2>,
    mask: Tensor<2>,
}

impl_scatter!(
    Masked {
        inputs,
        targets,
        mask
    },
    loss_weight = |part| { part.mask.clone().sum().into_scalar::<f64>() }
);

/// A loss that is a mean over unmasked entries, whose parts state their weight, equals the
/// bare model's over the whole batch however the mask falls.
pub fn stated_loss_weights_give_the_whole_batch_s_mean(devices: &[Device]) {
    let device = &devices[0];
    let model: Linear = LinearConfig::new(6, 3).init(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let (inputs, targets) = batch(7, device);
    let mask = Tensor::<2>::from_floats(
        [
            [1., 1., 1.],
            [1., 0., 0.],
            [0., 0., 0.],
            [1., 1., 0.],
            [1., 1., 1.],
            [0., 1., 0.],
            [1., 1., 1.],
        ],
        device,
    );
    let masked_mean = |m: &Linear, batch: Masked| {
        let error = (m.forward(batch.inputs) - batch.targets).powi_scalar(2) * batch.mask.clone();
        Mean(error.sum() / batch.mask.sum())
    };
    let whole = Masked {
        inputs,
        targets,
        mask,
    };
    let Mean(expected) = masked_mean(&model, whole.clone());
    let Mean(found) = dp.forward_with(whole, masked_mean);
    assert_close(found.clone(), expected.clone(), 1e-5, "loss");
    assert_same_grads(dp.module(), &found.backward(), &expected.backward(), 1e-4);
}

crate::on_every_device_list!(
    broadcast_tensors_get_the_bare_gradient => super::broadcast_tensors_get_the_bare_gradient,
    stated_loss_weights_give_the_whole_batch_s_mean => super::stated_loss_weights_give_the_whole_batch_s_mean,
);
