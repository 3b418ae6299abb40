//! `#[derive(Scatter)]` and `#[derive(Gather)]` on a user's batch and output structs, against
//! the bare model.

use burn::tensor::{Device, Tensor};
use burn_dataparallel::{DataParallel, Gather, Mean, Scatter, Shards, Shared};

use super::models::{Mlp, batch};
use crate::common::{assert_close, assert_same_grads};

/// A batch: inputs and targets split by rows, a setting every replica gets whole.
#[derive(Debug, Clone, Scatter)]
struct Batch {
    inputs: Tensor<2>,
    targets: Tensor<2>,
    scale: Shared<f32>,
}

/// What a replica gives back: its outputs, concatenated, and its loss, combined as the
/// whole batch's mean.
#[derive(Debug, Gather)]
struct Step {
    outputs: Tensor<2>,
    loss: Mean<Tensor<1>>,
}

fn step(mlp: &Mlp, batch: Batch) -> Step {
    let outputs = mlp.forward(batch.inputs) * batch.scale.0;
    let loss = (outputs.clone() - batch.targets).powi_scalar(2).mean();
    Step {
        outputs,
        loss: Mean(loss),
    }
}

/// Derived structs go through the forward as the bare model's values: the outputs, the
/// loss and every gradient.
pub fn derived_structs_split_and_gather(devices: &[Device]) {
    let device = &devices[0];
    let mlp = Mlp::new(device);
    let dp = DataParallel::new(mlp.clone(), devices.to_vec()).unwrap();
    let (inputs, targets) = batch(7, device);
    let whole = Batch {
        inputs,
        targets,
        scale: Shared(0.5),
    };
    let expected = step(&mlp, whole.clone());
    let found = dp.forward_with(whole, step);
    assert_close(found.outputs, expected.outputs, 1e-5, "outputs");
    let (found, expected) = (found.loss.0.backward(), expected.loss.0.backward());
    assert_same_grads(dp.module(), &found, &expected, 1e-5);
}

/// A generic struct, and a loss weight stated with the attribute.
#[derive(Debug, Clone, Scatter)]
#[scatter(loss_weight = |part| part.mask.clone().sum().into_scalar::<f64>())]
struct Masked<T> {
    tokens: T,
    mask: Tensor<2>,
}

pub fn generic_structs_and_loss_weights(devices: &[Device]) {
    let device = &devices[0];
    let batch = Masked {
        tokens: Tensor::<2>::zeros([4, 3], device),
        mask: Tensor::from_floats(
            [
                [1.0, 1.0, 1.0],
                [1.0, 0.0, 0.0],
                [1.0, 1.0, 0.0],
                [0.0, 0.0, 0.0],
            ],
            device,
        ),
    };
    assert_eq!(batch.batch_size(0).unwrap(), Some(4));
    let shards = Shards::new(
        4,
        &[device.clone(), device.clone()],
        None,
        0,
        device.clone(),
    );
    let parts = batch.scatter(&shards);
    assert_eq!(parts[0].tokens.dims(), [2, 3]);
    assert_eq!(parts[0].loss_weight(), Some(4.0));
    assert_eq!(parts[1].loss_weight(), Some(2.0));
    assert!(!parts[0].carries_gradients());
    let masks = vec![parts[0].mask.clone(), parts[1].mask.clone()];
    let gathered = <Tensor<2> as Gather>::gather(masks, &shards).unwrap();
    assert_eq!(gathered.dims(), [4, 3]);
}

crate::on_every_device_list!(
    derived_structs_split_and_gather => super::derived_structs_split_and_gather,
    generic_structs_and_loss_weights => super::generic_structs_and_loss_weights,
);
