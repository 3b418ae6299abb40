//! Choices made when a wrapper is built: the output device, and the backends it refuses.

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

/// Burn 0.21's `Fusion` in f16 computes wrong outputs with several forwards of different row
/// counts queued (`upstream/half_precision.rs`), as replicas do: such a wrapper is refused with a
/// typed error naming the fault, unless the user accepts it explicitly. (A module without
/// parameters: no device is touched.)
#[test]
fn fusion_in_half_precision_is_refused_unless_allowed() {
    type Half = burn::backend::Autodiff<Wgpu<burn::tensor::f16>>;
    let devices = vec![WgpuDevice::DefaultDevice; 2];
    match DataParallel::<Half, Relu>::new(Relu::new(), devices.clone()) {
        Err(error @ DataParallelError::FusionHalfPrecision) => {
            let message = error.to_string();
            assert!(message.contains("CubeBackend"), "{message}");
            assert!(message.contains("allow_fusion_f16"), "{message}");
        }
        other => panic!("expected FusionHalfPrecision, got {:?}", other.map(|_| ())),
    }
    let allowed = burn_dataparallel::DataParallelConfig::new()
        .with_allow_fusion_f16(true)
        .init::<Half, Relu>(Relu::new(), devices.clone());
    assert!(allowed.is_ok());
    // f32 Fusion and f16 without fusion are fine.
    assert!(DataParallel::<Wgpu, Relu>::new(Relu::new(), devices.clone()).is_ok());
    type CubeHalf = burn::backend::wgpu::CubeBackend<
        burn::backend::wgpu::WgpuRuntime,
        burn::tensor::f16,
        i32,
        u32,
    >;
    assert!(DataParallel::<CubeHalf, Relu>::new(Relu::new(), devices).is_ok());
}
