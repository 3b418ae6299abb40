//! Device faults on CUDA: a replica that runs out of device memory, and device memory over a
//! long run. CUDA only (`cuda_faults::`): on the CPU backends an allocation this size aborts
//! the process instead of failing.

use crate::common::*;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use burn_dataparallel::{DataParallel, DataParallelBackend, DataParallelError, Mean};
use cubecl::Runtime;

/// Device memory in use on CUDA device 0, after the queued work ran.
fn bytes_in_use<B: DataParallelBackend>() -> u64 {
    B::sync(&Default::default()).expect("sync");
    let client = cubecl::cuda::CudaRuntime::client(&Default::default());
    client.memory_usage().expect("memory usage").bytes_in_use
}

/// A replica whose output does not fit in device memory fails with a typed error naming it;
/// the wrapper then runs a smaller batch and matches the bare model.
fn out_of_memory_is_an_error<B: DataParallelBackend>() {
    let device = Default::default();
    // 16 -> 2^21 features: a shard of 20 000 rows needs 160 GiB for its output alone.
    let model: Linear<B> = LinearConfig::new(16, 1 << 21).init(&device);
    let dp = DataParallel::new(model, devices::<B>(2)).unwrap();
    let big = Tensor::<B, 2>::ones([40_000, 16], &device);
    let result = dp.try_forward_fallible(big, |m, x| {
        let y = m.forward(x);
        // Make the replica's allocation happen on its own thread.
        B::sync(&y.device()).map_err(|e| format!("{e:?}"))?;
        Ok::<_, String>(y.sum())
    });
    match result {
        Err(
            DataParallelError::ReplicaPanicked { .. } | DataParallelError::ReplicaFailed { .. },
        ) => {}
        other => panic!(
            "expected a replica error, got {:?}",
            other.map(|t| t.dims())
        ),
    }

    set_tolerance(TF32_TOLERANCE);
    let small = random::<B, 2>([6, 16], &device);
    let expected = values(dp.module().forward(small.clone()).narrow(1, 0, 64));
    let output = dp.forward_with(small, |m, x| m.forward(x).narrow(1, 0, 64));
    assert_close(&values(output), &expected, "output after the failure");
}

/// 2 000 training steps on four replicas leave device memory where it was after the first
/// hundred.
fn memory_is_flat_over_two_thousand_steps<B: DataParallelBackend>() {
    let device = Default::default();
    let mut dp = DataParallel::new(Mlp::<B>::new(64, 256, 8, &device), devices::<B>(4)).unwrap();
    let mut optim = SgdConfig::new().init();
    let (x, y) = (
        random::<B, 2>([64, 64], &device),
        random::<B, 2>([64, 8], &device),
    );
    let mut after_warm_up = 0;
    for step in 1..=2000 {
        let Mean(loss) = dp.forward_with((x.clone(), y.clone()), |m, (x, y)| {
            Mean((m.forward(x) - y).powi_scalar(2).mean())
        });
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = optim.step(1e-3, dp, grads);
        if step == 100 {
            after_warm_up = bytes_in_use::<B>();
        }
    }
    let end = bytes_in_use::<B>();
    println!("device memory in use: {after_warm_up} B after 100 steps, {end} B after 2000");
    assert!(
        end <= after_warm_up + (1 << 20),
        "device memory grew from {after_warm_up} B to {end} B"
    );
}

mod cuda_faults {
    use super::*;

    // CubeCL 0.10 allocates device memory lazily on its device-server thread and unwraps the
    // reservation (`cubecl-cuda-0.10.0/src/compute/server.rs:124`, `initialize_memory`): an
    // allocation failure panics there, the tensor's handle is never bound, and later work on
    // the device reads "Memory page 0 doesn't exist". Measured on an H200: the replica error
    // comes back typed on CubeBackend, but the next, small batch gives wrong values; under
    // Fusion the calling thread panics in burn-fusion's client. Run with `--ignored` to check
    // a newer CubeCL.
    #[test]
    #[ignore = "CubeCL 0.10's device server cannot recover from an allocation failure"]
    fn fusion_out_of_memory() {
        out_of_memory_is_an_error::<CudaAd>();
    }

    #[test]
    #[ignore = "CubeCL 0.10's device server cannot recover from an allocation failure"]
    fn cube_out_of_memory() {
        out_of_memory_is_an_error::<CubeAd>();
    }

    #[test]
    fn fusion_memory_is_flat() {
        set_tolerance(TF32_TOLERANCE);
        memory_is_flat_over_two_thousand_steps::<CudaAd>();
    }

    #[test]
    fn cube_memory_is_flat() {
        set_tolerance(TF32_TOLERANCE);
        memory_is_flat_over_two_thousand_steps::<CubeAd>();
    }
}
