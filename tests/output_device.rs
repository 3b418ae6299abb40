//! Choosing the output device.

use burn::backend::wgpu::{Wgpu, WgpuDevice};
use burn::nn::Relu;
use burn_dataparallel::{DataParallel, DataParallelError};

/// A module without parameters touches no device, so these distinct devices need no GPU.
#[test]
fn output_device_must_be_listed() {
    let devices = vec![WgpuDevice::DiscreteGpu(0), WgpuDevice::DiscreteGpu(1)];
    let dp = DataParallel::<Wgpu, Relu>::new(Relu::new(), devices).unwrap();
    assert_eq!(dp.output_device(), &WgpuDevice::DiscreteGpu(0));

    let dp = dp.with_output_device(WgpuDevice::DiscreteGpu(1)).unwrap();
    assert_eq!(dp.output_device(), &WgpuDevice::DiscreteGpu(1));

    match dp.with_output_device(WgpuDevice::Cpu) {
        Err(error @ DataParallelError::OutputDeviceNotListed { .. }) => {
            assert_eq!(
                error.to_string(),
                "output device Cpu is not one of the devices [DiscreteGpu(0), DiscreteGpu(1)]"
            );
        }
        other => panic!("expected OutputDeviceNotListed, got {other:?}"),
    }
}
