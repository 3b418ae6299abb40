//! Batch normalization's running statistics average every replica's update.

use burn::module::Module;
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::{Device, Distribution, Tensor};
use burn_dataparallel::{DataParallel, shard_sizes};

use crate::common::assert_close;

/// After one forward, the running mean and variance are the mean over replicas of what each
/// shard alone gives, and outputs are each shard normalized with its own statistics.
pub fn running_statistics_come_from_every_replica(devices: &[Device]) {
    let device = &devices[0];
    let norm: BatchNorm = BatchNormConfig::new(4).init(device);
    let x = Tensor::<2>::random([9, 4], Distribution::Normal(1.0, 2.0), device);
    let sizes: Vec<usize> = shard_sizes(9, devices.len(), None);

    // What each shard alone gives, from the same starting statistics.
    let (mut means, mut vars, mut outputs) = (Vec::new(), Vec::new(), Vec::new());
    for piece in x.clone().split_with_sizes(sizes, 0) {
        let alone = norm.valid().train();
        outputs.push(alone.forward(piece));
        means.push(alone.running_mean.value_sync());
        vars.push(alone.running_var.value_sync());
    }
    let average = |values: Vec<Tensor<1>>| {
        let n = values.len() as f64;
        values
            .into_iter()
            .reduce(|a, b| a + b)
            .unwrap()
            .div_scalar(n)
    };

    let dp = DataParallel::new(norm, devices.to_vec()).unwrap();
    let found = dp.forward_with(x, |m, x| m.forward(x));
    assert_close(found, Tensor::cat(outputs, 0), 1e-5, "output");
    // `valid()` folds the replicas' pending updates, as burn-train's validation does.
    let module = dp.module().valid();
    assert_close(
        module.running_mean.value(),
        average(means),
        1e-5,
        "running mean",
    );
    assert_close(
        module.running_var.value(),
        average(vars),
        1e-5,
        "running variance",
    );
    assert_eq!(dp.devices(), vec![device.clone()], "the statistics' device");
}

crate::on_every_device_list!(
    running_statistics_come_from_every_replica => super::running_statistics_come_from_every_replica,
);
