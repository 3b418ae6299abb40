//! Replicas on other devices hold the module's parameters, moved together (one transfer
//! where both devices allow it), and the gradients that flow back through them are the bare
//! model's: for a module of more parameters than one kernel launch binds on wgpu, with a
//! frozen one.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Distribution, Tensor};
use burn_dataparallel::replicate;

use crate::common::{assert_same_grads, assert_same_params, params};

/// Twenty-four layers (48 parameters), the first one's weight frozen, initialized (Burn
/// initializes a parameter when it is first read).
fn layers(device: &Device) -> Vec<Linear> {
    let layers = lazy_layers(device);
    params(&layers);
    layers
}

/// [`layers`], not yet initialized.
fn lazy_layers(device: &Device) -> Vec<Linear> {
    let mut layers: Vec<Linear> = (0..24)
        .map(|_| LinearConfig::new(5, 5).init(device))
        .collect();
    layers[0].weight = layers[0].weight.clone().set_require_grad(false);
    layers
}

fn forward(layers: &[Linear], x: Tensor<2>) -> Tensor<2> {
    layers.iter().fold(x, |x, layer| layer.forward(x).tanh())
}

pub fn replicas_hold_the_module_s_parameters(devices: &[Device]) {
    let device = &devices[0];
    let module = layers(device);
    let replicas = replicate(&module, devices);
    for (replica, device) in replicas.iter().zip(devices) {
        assert_eq!(replica.devices(), vec![device.clone()]);
        assert_same_params(replica, &module, 0.0);
        assert!(!replica[0].weight.val().is_require_grad());
    }

    let x = Tensor::<2>::random([3, 5], Distribution::Default, device);
    let expected = forward(&module, x.clone())
        .sum()
        .mul_scalar(replicas.len() as f32)
        .backward();
    let found = (replicas.iter().zip(devices))
        .map(|(replica, there)| forward(replica, x.clone().to_device(there)).sum())
        .map(|loss| loss.to_device(device))
        .reduce(|a, b| a + b)
        .expect("a replica")
        .backward();
    assert_same_grads(&module, &found, &expected, 1e-5);
}

/// A module whose parameters are not yet initialized: every replica holds the values the
/// module itself then reads, on its own device, as if it had been initialized first.
pub fn replicas_of_a_lazy_module_hold_its_values(devices: &[Device]) {
    let device = &devices[0];
    let module = lazy_layers(device);
    let replicas = replicate(&module, devices);
    for (replica, device) in replicas.iter().zip(devices) {
        assert_eq!(replica.devices(), vec![device.clone()]);
        assert_same_params(replica, &module, 0.0);
    }
    assert_eq!(module.devices(), vec![device.clone()]);
}

crate::on_every_device_list!(
    replicas_hold_the_module_s_parameters => super::replicas_hold_the_module_s_parameters,
    replicas_of_a_lazy_module_hold_its_values => super::replicas_of_a_lazy_module_hold_its_values,
);
