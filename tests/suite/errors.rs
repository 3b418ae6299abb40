//! Bad input and failing replicas come back as typed errors, and the wrapper stays usable.

use burn::tensor::{Device, Tensor};
use burn_dataparallel::{DataParallel, DataParallelConfig, DataParallelError, LossReduction, Mean};

use super::models::{Mlp, batch};
use crate::common::{assert_close, flex};

#[test]
#[allow(deprecated)]
fn settings_that_do_not_fit_the_devices_are_refused() {
    let device = Device::flex().autodiff();
    let model = || Mlp::new(&device);
    assert!(matches!(
        DataParallel::new(model(), vec![]),
        Err(DataParallelError::NoDevices)
    ));
    assert!(matches!(
        DataParallelConfig::new()
            .with_output_index(2)
            .init(model(), flex(2)),
        Err(DataParallelError::OutputDeviceIndex { index: 2, len: 2 })
    ));
    assert!(matches!(
        DataParallelConfig::new()
            .with_shard_weights(Some(vec![1.0]))
            .init(model(), flex(2)),
        Err(DataParallelError::ShardWeightsLength {
            expected: 2,
            found: 1
        })
    ));
    assert!(matches!(
        DataParallelConfig::new()
            .with_shard_weights(Some(vec![1.0, f64::NAN]))
            .init(model(), flex(2)),
        Err(DataParallelError::InvalidShardWeight { index: 1, .. })
    ));
    let dp = DataParallel::new(model(), flex(2)).unwrap();
    assert!(matches!(
        dp.with_output_device(Device::ndarray()), // not listed
        Err(DataParallelError::OutputDeviceNotListed { .. })
    ));
}

/// Inputs that cannot be split.
pub fn bad_inputs_are_refused(devices: &[Device]) {
    let device = &devices[0];
    let dp = DataParallel::new(Mlp::new(device), devices.to_vec()).unwrap();
    let run = |input| dp.try_forward_with(input, |m, (x, _): (Tensor<2>, Tensor<2>)| m.forward(x));
    assert!(matches!(
        run((Tensor::zeros([0, 6], device), Tensor::zeros([0, 3], device))),
        Err(DataParallelError::EmptyBatch { dim: 0 })
    ));
    assert!(matches!(
        run((Tensor::zeros([4, 6], device), Tensor::zeros([5, 3], device))),
        Err(DataParallelError::BatchSizeMismatch {
            dim: 0,
            expected: 4,
            found: 5
        })
    ));
    assert!(matches!(
        dp.try_forward_with(3usize, |_, _n| ()),
        Err(DataParallelError::NothingToScatter { dim: 0 })
    ));
    let by_dim_two = DataParallelConfig::new()
        .with_dim(2)
        .init(Mlp::new(device), devices.to_vec())
        .unwrap();
    assert!(matches!(
        by_dim_two.try_forward(Tensor::zeros([4, 6], device)),
        Err(DataParallelError::DimOutOfRange { dim: 2, rank: 2 })
    ));
}

/// A panicking or failing replica names itself and its device, the others are joined, and
/// the next forward works.
pub fn failing_replicas_are_typed_errors(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let last = devices.len() - 1;
    // Shards of two rows each but the last, of one: that replica fails.
    let rows = 2 * devices.len() - 1;

    let result = dp.try_forward_with(batch(rows, device).0, |m, x| {
        if x.dims()[0] == 1 {
            panic!("a replica's own panic");
        }
        m.forward(x)
    });
    match result {
        Err(DataParallelError::ReplicaPanicked {
            replica,
            device,
            message,
        }) => {
            assert_eq!(replica, last);
            assert_eq!(device, format!("{:?}", devices[last]));
            assert_eq!(message, "a replica's own panic");
        }
        _ => panic!("expected a replica's panic"),
    }

    let result = dp.try_forward_fallible(batch(rows, device).0, |m, x| {
        if x.dims()[0] == 1 {
            return Err(std::io::Error::other("a replica's own error"));
        }
        Ok(m.forward(x))
    });
    match result {
        Err(DataParallelError::ReplicaFailed {
            replica, source, ..
        }) => {
            assert_eq!(replica, last);
            assert_eq!(source.to_string(), "a replica's own error");
        }
        _ => panic!("expected a replica's failure"),
    }

    let (x, _) = batch(rows, device);
    assert_close(
        dp.forward(x.clone()),
        model.forward(x),
        1e-5,
        "output after the errors",
    );
}

/// Outputs that do not gather.
pub fn outputs_that_disagree_are_refused(devices: &[Device]) {
    if devices.len() < 2 {
        return; // one device: the module's own output, nothing to disagree with
    }
    let device = &devices[0];
    let dp = DataParallel::new(Mlp::new(device), devices.to_vec()).unwrap();
    let rows = 3 * devices.len() - 1;
    let result = dp.try_forward_with(batch(rows, device).0, |_, x| {
        Tensor::<2>::zeros([1, x.dims()[0]], &x.device())
    });
    assert!(matches!(
        result,
        Err(DataParallelError::OutputShapeMismatch { .. })
    ));
    let result = dp.try_forward_with(batch(rows, device).0, |m, x| {
        (x.dims()[0] == 3).then(|| m.forward(x))
    });
    assert!(matches!(
        result,
        Err(DataParallelError::OutputStructureMismatch { .. })
    ));
}

/// `forward_with_captures` runs replicas of the output device only.
pub fn captures_stay_on_the_output_device(devices: &[Device]) {
    let device = &devices[0];
    let model = Mlp::new(device);
    let dp = DataParallel::new(model.clone(), devices.to_vec()).unwrap();
    let scale = Tensor::<2>::ones([1, 3], device)
        .mul_scalar(2.0)
        .require_grad();
    let (x, _) = batch(6, device);
    let result = dp.try_forward_with_captures(x.clone(), |m, x| m.forward(x) * scale.clone());
    if devices.iter().all(|d| d == device) {
        let found = result.unwrap();
        let expected = model.forward(x) * scale.clone();
        assert_close(found.clone(), expected.clone(), 1e-5, "output");
        let (found, expected) = (found.sum().backward(), expected.sum().backward());
        assert_close(
            scale.grad(&found).unwrap(),
            scale.grad(&expected).unwrap(),
            1e-4,
            "captured",
        );
    } else {
        assert!(matches!(
            result,
            Err(DataParallelError::CapturesAcrossDevices { .. })
        ));
    }
}

/// After a device is dropped (`without_device`), the wrapper keeps its settings and trains
/// as the bare model on the devices that remain; the output device cannot be dropped.
pub fn a_device_can_be_dropped(devices: &[Device]) {
    let output = &devices[0];
    let mlp = Mlp::new(output);
    let config = DataParallelConfig::new()
        .with_loss_reduction(LossReduction::Mean)
        .with_sync_learner_steps(false);
    let dp = config.init(mlp.clone(), devices.to_vec()).unwrap();
    let refused = dp.clone().without_device(output).map(|_| ()).unwrap_err();
    assert!(
        matches!(refused, DataParallelError::OutputDeviceRemoved { .. }),
        "{refused}"
    );
    let Some(other) = devices.iter().find(|d| *d != output) else {
        return; // every replica on the output device: nothing else to drop
    };
    let dp = dp.without_device(other).unwrap();
    let remaining: Vec<Device> = devices.iter().filter(|d| *d != other).cloned().collect();
    assert_eq!(dp.replica_devices(), remaining.as_slice());
    assert_eq!(dp.output_device(), output);
    assert!(!dp.sync_learner_steps(), "the settings stay");
    let (x, y) = batch(7, output);
    let loss =
        |m: &Mlp, (x, y): (Tensor<2>, Tensor<2>)| Mean((m.forward(x) - y).powi_scalar(2).mean());
    let Mean(found) = dp.forward_with((x.clone(), y.clone()), loss);
    let Mean(expected) = loss(&mlp, (x, y));
    crate::common::assert_same_grads(dp.module(), &found.backward(), &expected.backward(), 1e-5);
}

crate::on_every_device_list!(
    a_device_can_be_dropped => super::a_device_can_be_dropped,
    bad_inputs_are_refused => super::bad_inputs_are_refused,
    failing_replicas_are_typed_errors => super::failing_replicas_are_typed_errors,
    outputs_that_disagree_are_refused => super::outputs_that_disagree_are_refused,
    captures_stay_on_the_output_device => super::captures_stay_on_the_output_device,
);

/// A CUDA GPU that does not exist is refused when the wrapper is made, naming it.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gpu_that_does_not_exist_is_a_typed_error() {
    let device = Device::cuda(0).autodiff();
    let result = DataParallel::new(Mlp::new(&device), vec![device.clone(), Device::cuda(99)]);
    match result {
        Err(DataParallelError::UnknownDevice { device, available }) => {
            assert!(device.contains("99"), "{device}");
            assert!(available.contains('0'), "{available}");
        }
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("a wrapper over a GPU that does not exist"),
    }
}
