//! Replicas on distinct devices of a backend that cannot copy between them: wgpu's
//! `WgpuDevice::DefaultDevice` and `WgpuDevice::Cpu` are two Burn devices, each with its own
//! CubeCL server (over Mesa's lavapipe in CI, both on the one CPU adapter), and Burn 0.21's
//! `to_device` between them is not implemented. The wrapper moves tensors between them
//! through host memory (`TransferOps::host_staged_transfers`): parameters are copied to the
//! other device, shards scattered, outputs gathered and gradients reduced across devices, as
//! on several GPUs, and the results equal a single-device run's. Each case checks that the
//! transfers really ran (the step profile's bytes).

mod common;

use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, Wgpu, WgpuDevice, WgpuRuntime};
use burn::module::Module;
use burn::tensor::Tensor;
use burn_dataparallel::{
    DataParallel, DataParallelBackend, DataParallelError, Mean, replicate_with_buckets,
};
use common::*;

/// `CubeBackend` on wgpu (replicas' backwards at once) and Burn's default `Wgpu` (Fusion).
type Cube = WgpuCubeAd;
type Fused = Autodiff<Wgpu>;

/// Three replicas over two distinct devices, the output device first.
fn two_devices() -> Vec<WgpuDevice> {
    vec![
        WgpuDevice::DefaultDevice,
        WgpuDevice::Cpu,
        WgpuDevice::DefaultDevice,
    ]
}

fn mse<B: DataParallelBackend>(model: &Mlp<B>, x: Tensor<B, 2>, y: Tensor<B, 2>) -> Tensor<B, 1> {
    (model.forward(x) - y).powi_scalar(2).mean()
}

/// Outputs and parameter gradients equal the bare model's on the default device, several
/// steps in a row (the parameters' copies made again each step), and the profile shows the
/// parameters broadcast to the other device and the gradients reduced from it.
fn mlp_across_devices<B: DataParallelBackend<Device = WgpuDevice>>(test: &str) {
    if skip_wgpu(test) {
        return;
    }
    set_tolerance(1e-4);
    let device = WgpuDevice::DefaultDevice;
    let dp = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), two_devices()).unwrap();
    let bare = Mlp::<B>::new(8, 16, 4, &device).load_record(dp.module().clone().into_record());
    dp.set_profiling(true);
    for _ in 0..3 {
        let (x, y) = (
            random::<B, 2>([7, 8], &device),
            random::<B, 2>([7, 4], &device),
        );
        let Mean(loss) = dp.forward_with((x.clone(), y.clone()), |m, (x, y)| Mean(mse(m, x, y)));
        let expected = mse(&bare, x, y);
        assert_close(&values(loss.clone()), &values(expected.clone()), "loss");
        let (actual, expected) = (loss.backward(), expected.backward());
        assert_grads_close(
            &param_grads(dp.module(), &actual),
            &param_grads(&bare, &expected),
        );
    }
    let profile = dp.profile().expect("a profiled step");
    let param_bytes = dp.module().num_params() as u64 * 4;
    assert_eq!(
        profile.bytes_broadcast, param_bytes,
        "the parameters went to the other device once: {profile}"
    );
    assert_eq!(
        profile.bytes_reduced, param_bytes,
        "their gradients came back once: {profile}"
    );
    assert!(profile.bytes_scattered > 0, "{profile}");
}

/// Batch norm across devices: with running states per device, training steps run and the
/// statistics fold back to the module; without, a typed error (Burn's own `to_device` inside
/// the replica's forward cannot run between these devices).
fn batch_norm_across_devices<B: DataParallelBackend<Device = WgpuDevice>>(test: &str) {
    if skip_wgpu(test) {
        return;
    }
    let device = WgpuDevice::DefaultDevice;
    let dp = DataParallel::new(BnNet::<B>::new(0.0, &device), two_devices()).unwrap();
    let before = values(dp.module().norm.running_mean.value());
    let x = random::<B, 2>([9, 8], &device);
    match dp.try_forward_with(x.clone(), |m, x| m.forward(x)) {
        Err(DataParallelError::SharedRunningStates { .. }) => {}
        other => panic!("expected SharedRunningStates, got {:?}", other.map(|_| ())),
    }
    let dp = dp.with_running_states_per_device();
    dp.set_profiling(true);
    let output = dp.forward_with(x, |m, x| m.forward(x));
    assert_eq!(output.dims(), [9, 4]);
    let _ = output.sum().backward();
    let after = values(dp.module().norm.running_mean.value());
    assert_ne!(before, after, "the statistics moved");
    assert!(after.iter().all(|v| v.is_finite()));
    let profile = dp.profile().expect("a profiled step");
    assert!(profile.bytes_running_states > 0, "{profile}");
}

#[test]
fn cube_mlp_across_devices() {
    let _one = one_at_a_time();
    within("cube_mlp_across_devices", || {
        mlp_across_devices::<Cube>("cube_mlp_across_devices")
    });
}

#[test]
fn fusion_mlp_across_devices() {
    let _one = one_at_a_time();
    within("fusion_mlp_across_devices", || {
        mlp_across_devices::<Fused>("fusion_mlp_across_devices")
    });
}

#[test]
fn cube_batch_norm_across_devices() {
    let _one = one_at_a_time();
    within("cube_batch_norm_across_devices", || {
        batch_norm_across_devices::<Cube>("cube_batch_norm_across_devices")
    });
}

/// A module copied to the other device in 256-byte buckets ([`replicate_with_buckets`]: the
/// first layer's weight alone, its bias with the output layer's, the frozen output weight
/// alone) computes the original's output there, and the original parameters get the same
/// gradients back through the buckets' backward; the frozen one gains none.
#[test]
fn a_module_moved_in_buckets_trains_like_the_original() {
    let _one = one_at_a_time();
    within("a_module_moved_in_buckets_trains_like_the_original", || {
        if skip_wgpu("a_module_moved_in_buckets_trains_like_the_original") {
            return;
        }
        let (home, other) = (WgpuDevice::DefaultDevice, WgpuDevice::Cpu);
        let mut model = Mlp::<Cube>::new(6, 16, 3, &home);
        model.output.weight = model.output.weight.set_require_grad(false);
        let rows = [[0.5, -1.0, 2.0, 0.0, 1.5, -0.25]; 3];
        let copy = replicate_with_buckets(&model, std::slice::from_ref(&other), 256)
            .pop()
            .expect("one copy");
        assert_eq!(copy.hidden.weight.val().device(), other);
        let output = copy.forward(Tensor::from_floats(rows, &other));
        let expected = model.forward(Tensor::from_floats(rows, &home));
        assert_close(&values(output.clone()), &values(expected.clone()), "output");
        let grads = (output.clone() * output).sum().backward();
        let reference = (expected.clone() * expected).sum().backward();
        let gradients = |param: &Tensor<Cube, 1>| {
            let got = param.grad(&grads).expect("a gradient");
            let want = param.grad(&reference).expect("a gradient");
            assert_eq!(got.device(), home, "the gradient's device");
            (data_values(got.into_data()), data_values(want.into_data()))
        };
        let weight = model.hidden.weight.val();
        let got = weight.grad(&grads).expect("a gradient");
        let want = weight.grad(&reference).expect("a gradient");
        assert_eq!(got.device(), home, "the weight gradient's device");
        assert_close(
            &data_values(got.into_data()),
            &data_values(want.into_data()),
            "weight",
        );
        for bias in [&model.hidden.bias, &model.output.bias] {
            let (got, want) = gradients(&bias.as_ref().expect("a bias").val());
            assert_close(&got, &want, "bias");
        }
        assert!(model.output.weight.val().grad(&grads).is_none());
        assert!(!copy.output.weight.val().is_require_grad());
    });
}

/// One host-staged move, no wrapper: the values arrive on the other device.
#[test]
fn host_staged_move() {
    let _one = one_at_a_time();
    within("host_staged_move", || {
        if skip_wgpu("host_staged_move") {
            return;
        }
        type Inner = CubeBackend<WgpuRuntime, f32, i32, u32>;
        use burn_dataparallel::TransferOps;
        let rows = [[1.0, 2.0], [3.0, 4.0]];
        let tensor = Tensor::<Inner, 2>::from_floats(rows, &WgpuDevice::DefaultDevice);
        let moved = Inner::float_move(tensor.into_primitive().tensor(), &WgpuDevice::Cpu);
        let moved = Tensor::<Inner, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(moved));
        assert_eq!(moved.device(), WgpuDevice::Cpu);
        assert_eq!(moved.dims(), [2, 2]);
        assert_eq!(
            moved.into_data().to_vec::<f32>().unwrap(),
            [1.0, 2.0, 3.0, 4.0]
        );
    });
}

/// A host-staged move larger than one piece (`TransferOps::float_move` writes pieces of at
/// most 1 MiB), through `backend::move_to` under `Autodiff`: the values arrive whole and in
/// order, and the gradient comes back the same way.
#[test]
fn host_staged_move_in_pieces() {
    let _one = one_at_a_time();
    within("host_staged_move_in_pieces", || {
        if skip_wgpu("host_staged_move_in_pieces") {
            return;
        }
        // 2.4 pieces' worth, the last one partial.
        let (rows, columns) = (3, 209_715);
        let count = rows * columns;
        let values: Vec<f32> = (0..count).map(|i| (i % 1_000_003) as f32).collect();
        let data = burn::tensor::TensorData::new(values.clone(), [rows, columns]);
        let x = Tensor::<Cube, 2>::from_data(data, &WgpuDevice::DefaultDevice).require_grad();
        let moved = burn_dataparallel::backend::move_to(x.clone(), &WgpuDevice::Cpu);
        assert_eq!(moved.device(), WgpuDevice::Cpu);
        assert_eq!(moved.dims(), [rows, columns]);
        let weights: Vec<f32> = (0..count).map(|i| (i % 7) as f32 - 3.0).collect();
        let weights_data = burn::tensor::TensorData::new(weights.clone(), [rows, columns]);
        let probe = Tensor::<Cube, 2>::from_data(weights_data, &WgpuDevice::Cpu);
        assert_eq!(moved.clone().into_data().to_vec::<f32>().unwrap(), values);
        let grads = (moved * probe).sum().backward();
        let grad = x.grad(&grads).expect("the input's gradient");
        assert_eq!(grad.device(), WgpuDevice::DefaultDevice);
        assert_eq!(grad.into_data().to_vec::<f32>().unwrap(), weights);
    });
}
