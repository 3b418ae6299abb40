//! What the tests share: the device lists every test runs on, the bare-model comparisons and
//! a watchdog.

#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Gradients;
use burn::tensor::{DType, Device, DeviceError, FloatDType, Int, Tensor, TensorData};

mod silent;
#[allow(unused_imports)] // not every test binary runs a Learner
pub use silent::Silent;

/// Instantiates `$body(devices)` once per device list: several replicas on Flex, and two
/// distinct devices of different backends (Flex and NdArray), which moves every parameter,
/// shard, output and gradient between them.
#[macro_export]
macro_rules! on_every_device_list {
    ($($name:ident => $body:path),+ $(,)?) => {
        mod flex_two {
            $(#[test] fn $name() { $crate::common::within(|| $body(&$crate::common::flex(2))); })+
        }
        mod flex_three {
            $(#[test] fn $name() { $crate::common::within(|| $body(&$crate::common::flex(3))); })+
        }
        mod flex_and_ndarray {
            $(#[test] fn $name() { $crate::common::within(|| $body(&$crate::common::flex_and_ndarray())); })+
        }
        /// The devices of `DATAPARALLEL_DEVICES` (a `DeviceList`: `cuda:0,cuda:0`,
        /// `cuda:0,cpu`), run with `--ignored` on a machine that has them.
        mod listed {
            $(
                #[test]
                #[ignore = "runs on the devices of DATAPARALLEL_DEVICES"]
                fn $name() { $crate::common::within(|| $body(&$crate::common::listed())); }
            )+
        }
    };
}

/// `n` replicas on the Flex CPU device, with autodiff.
pub fn flex(n: usize) -> Vec<Device> {
    vec![Device::flex().autodiff(); n]
}

/// Two distinct devices, Flex then NdArray (deprecated in Burn 0.22, but the one other CPU
/// backend: distinct devices without a GPU or a Vulkan driver), with autodiff.
#[allow(deprecated)]
pub fn flex_and_ndarray() -> Vec<Device> {
    vec![Device::flex().autodiff(), Device::ndarray().autodiff()]
}

/// The devices of `DATAPARALLEL_DEVICES`, with autodiff, their float type set to
/// `DATAPARALLEL_FLOAT` (`f16`, `bf16`; `f32` when unset).
///
/// # Panics
///
/// When a variable does not parse, or a device does not support the float type.
pub fn listed() -> Vec<Device> {
    let list =
        std::env::var("DATAPARALLEL_DEVICES").expect("DATAPARALLEL_DEVICES names the devices");
    let devices: burn_dataparallel::DeviceList = list
        .parse()
        .unwrap_or_else(|error| panic!("DATAPARALLEL_DEVICES={list}: {error}"));
    let float = match std::env::var("DATAPARALLEL_FLOAT").as_deref() {
        Ok("f16") => FloatDType::F16,
        Ok("bf16") => FloatDType::BF16,
        Ok("f32") | Err(_) => FloatDType::F32,
        Ok(other) => panic!("DATAPARALLEL_FLOAT is f16, bf16 or f32, not {other:?}"),
    };
    let mut devices = devices.into_vec();
    for device in &mut devices {
        // Settings hold for the process; an earlier test (or the device's first entry) set
        // them already.
        match device.configure(float) {
            Ok(()) | Err(DeviceError::AlreadyInitialized { .. }) => {}
            Err(error) => panic!("{device:?} in {float:?}: {error}"),
        }
        assert_eq!(
            device.settings().float_dtype,
            float,
            "{device:?}: its float type was set before the tests"
        );
    }
    let devices: Vec<Device> = devices.into_iter().map(Device::autodiff).collect();
    for device in &devices {
        let dtype = Tensor::<1>::zeros([1], device).dtype();
        assert_eq!(dtype, float.into(), "{device:?}: tensors in {dtype:?}");
    }
    devices
}

/// Runs `body` on a thread of its own and fails the test if it takes over a minute (a hang
/// fails in bounded time) or panics. `DATAPARALLEL_TEST_LIMIT` (seconds) sets another limit:
/// a first test on an empty GPU kernel cache, with other processes compiling beside it, can
/// take longer.
pub fn within<F: FnOnce() + Send + 'static>(body: F) {
    let limit = std::env::var("DATAPARALLEL_TEST_LIMIT").map_or(60, |limit| {
        (limit.parse())
            .unwrap_or_else(|_| panic!("DATAPARALLEL_TEST_LIMIT is seconds, not {limit:?}"))
    });
    let (done, finished) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(limit)) {
        Ok(()) => handle.join().expect("the test body"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(payload) = handle.join() {
                std::panic::resume_unwind(payload);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test did not finish within {limit} s"),
    }
}

/// A tensor of `dims` holding `start`, `start + 1`, ... (distinct values, so that a value
/// copied from the wrong place shows).
pub fn counting<const D: usize>(dims: [usize; D], start: usize, device: &Device) -> Tensor<D> {
    let count: usize = dims.iter().product();
    if count == 0 {
        // Burn 0.22.1's `reshape` of an empty tensor indexes past its shape.
        return Tensor::zeros(dims, device);
    }
    Tensor::<1, Int>::arange(start as i64..(start + count) as i64, device)
        .float()
        .reshape(dims)
}

/// [`counting`]'s values, written from the host: a tensor that is no chain of operations
/// under Burn's Fusion, whose own `Tensor::cat` of such chains a MiB large took minutes on
/// lavapipe (`benches/journal/2026-12-07.md`).
pub fn counting_on_host<const D: usize>(
    dims: [usize; D],
    start: usize,
    device: &Device,
) -> Tensor<D> {
    let count: usize = dims.iter().product();
    let values: Vec<f32> = (start..start + count).map(|v| v as f32).collect();
    Tensor::from_data(TensorData::new(values, dims), device)
}

/// The values of `tensor`, on the host.
pub fn values<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 values")
}

/// The tolerance of a GPU's float32 results: its matrix products may run in TF32 (a 10-bit
/// mantissa), and a shard's sums are rounded in another order than the whole batch's.
pub const GPU_TOLERANCE: f32 = 5e-3;

/// The tolerance of results in 16-bit floats (`DATAPARALLEL_FLOAT`): a few units of their
/// last place, over sums of a few dozen terms and three optimizer steps.
pub const F16_TOLERANCE: f32 = 2e-2;
pub const BF16_TOLERANCE: f32 = 8e-2;

/// Whether `device` is one of the CPU backends, whose float32 arithmetic is exact float32.
pub fn on_cpu(device: &Device) -> bool {
    let name = format!("{device:?}");
    name.contains("Flex") || name.contains("NdArray")
}

/// Asserts that two tensors hold the same shape and values within `tolerance` (absolute,
/// relative to the larger magnitude above 1), widened to [`GPU_TOLERANCE`] for tensors on a
/// GPU and to [`F16_TOLERANCE`] or [`BF16_TOLERANCE`] for 16-bit tensors, where `tolerance`
/// is not zero.
pub fn assert_close<const D: usize>(
    found: Tensor<D>,
    expected: Tensor<D>,
    tolerance: f32,
    what: &str,
) {
    assert_eq!(found.dims(), expected.dims(), "{what}: shapes");
    let gpu = !on_cpu(&found.device()) || !on_cpu(&expected.device());
    let floor = match (found.dtype(), expected.dtype()) {
        (DType::BF16, _) | (_, DType::BF16) => BF16_TOLERANCE,
        (DType::F16, _) | (_, DType::F16) => F16_TOLERANCE,
        _ if gpu => GPU_TOLERANCE,
        _ => 0.0,
    };
    let tolerance = match tolerance > 0.0 {
        true => tolerance.max(floor),
        false => tolerance,
    };
    let (found, expected) = (values(found), values(expected));
    for (i, (f, e)) in found.iter().zip(&expected).enumerate() {
        let scale = f.abs().max(e.abs()).max(1.0);
        assert!(
            (f - e).abs() <= tolerance * scale,
            "{what}: element {i} is {f}, expected {e}"
        );
    }
}

/// Every float parameter's value and gradient, in visiting order.
pub fn params_and_grads<M: Module>(
    module: &M,
    grads: &Gradients,
) -> Vec<(Tensor<1>, Option<Tensor<1>>)> {
    struct Collect<'a> {
        grads: &'a Gradients,
        out: Vec<(Tensor<1>, Option<Tensor<1>>)>,
    }
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let value = param.val();
            let grad = value.grad(self.grads).map(|g| g.flatten(0, D - 1));
            self.out.push((value.flatten(0, D - 1).detach(), grad));
        }
    }
    let mut collect = Collect {
        grads,
        out: Vec::new(),
    };
    module.visit(&mut collect);
    collect.out
}

/// Every float parameter's value, in visiting order.
pub fn params<M: Module>(module: &M) -> Vec<Tensor<1>> {
    struct Collect(Vec<Tensor<1>>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.val().flatten(0, D - 1).detach());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Asserts that two modules' parameters agree within `tolerance`.
pub fn assert_same_params<M: Module>(found: &M, expected: &M, tolerance: f32) {
    let (found, expected) = (params(found), params(expected));
    assert_eq!(found.len(), expected.len(), "parameter count");
    for (i, (f, e)) in found.into_iter().zip(expected).enumerate() {
        assert_close(f, e, tolerance, &format!("parameter {i}"));
    }
}

/// Asserts that the gradients `found` gives `module`'s parameters are those `expected` gives.
pub fn assert_same_grads<M: Module>(
    module: &M,
    found: &Gradients,
    expected: &Gradients,
    tolerance: f32,
) {
    let found = params_and_grads(module, found);
    let expected = params_and_grads(module, expected);
    for (i, ((_, f), (_, e))) in found.into_iter().zip(expected).enumerate() {
        match (f, e) {
            (Some(f), Some(e)) => assert_close(f, e, tolerance, &format!("gradient {i}")),
            (None, None) => {}
            (f, e) => panic!(
                "gradient {i}: found {}, expected {}",
                f.is_some(),
                e.is_some()
            ),
        }
    }
}
