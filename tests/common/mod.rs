//! Models, reference comparisons and the backend list shared by the integration tests.
#![allow(dead_code)]

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig};
use burn::nn::{
    BatchNorm, BatchNormConfig, Dropout, DropoutConfig, Gelu, Linear, LinearConfig, PaddingConfig2d,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor, TensorData};
use burn_dataparallel::DataParallelBackend;
use burn_dataparallel::{DataParallel, Forward, Scatter};

#[cfg(feature = "cubecl")]
pub mod adapter;
#[cfg(feature = "cubecl")]
mod distinct;
mod spread;
#[cfg(feature = "cubecl")]
pub mod wgpu_devices;

#[cfg(feature = "cubecl")]
#[allow(unused_imports)]
pub use distinct::*;

/// The CPU backend every test runs on.
pub type FlexAd = burn::backend::Autodiff<burn::backend::Flex>;

/// The second CPU backend every test runs on.
pub type NdArrayAd = burn::backend::Autodiff<burn::backend::NdArray>;

/// The default CUDA backend (fusion on top of CubeCL).
#[cfg(feature = "cuda")]
pub type CudaAd = burn::backend::Autodiff<burn::backend::Cuda>;

/// CubeCL's CUDA backend without fusion, in half precision.
#[cfg(feature = "cuda")]
pub type CubeHalfAd = burn::backend::Autodiff<
    burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, burn::tensor::f16, i32, u8>,
>;

/// CubeCL's CUDA backend without fusion.
#[cfg(feature = "cuda")]
pub type CubeAd =
    burn::backend::Autodiff<burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>;

/// Instantiates generic test bodies for every backend: the two CPU backends always,
/// `CubeBackend` on wgpu with its replicas on distinct devices (with the `cubecl` feature, a
/// default), the CUDA backends with the `cuda` feature (f32 with and without fusion, f16
/// without).
///
/// `backend_tests! { name => body(args); }` defines `flex::name`, `ndarray::name`,
/// `wgpu_distinct::name` (replicas alternating between two wgpu devices, tensors moved
/// through host memory: [`on_distinct_wgpu_devices`]), `cuda_fusion::name`, `cuda_cube::name`
/// and `cuda_cube_half::name` (the wrapper refuses Burn 0.21's `Fusion` in f16,
/// `DataParallelError::FusionHalfPrecision`), each calling `body::<Backend>(args)`.
/// Attributes written before `name` apply to the Flex variant only.
///
/// `name => body(args), moves_nothing = "reason";` marks a test that moves nothing between
/// devices by design (one replica, a batch of one row, an error before the first transfer,
/// no wrapper at all): under `wgpu_distinct` it runs on the distinct devices' plan like the
/// others, and checks that nothing crossed devices instead of that something did.
///
/// `name => body(args), fusion_fails = "reason";` marks a known fault of Burn 0.21's Fusion
/// backend: `cuda_fusion::name` is ignored with that reason (listed as ignored in every run,
/// run with `--ignored`; `scripts/gpu-check.sh` runs them to see whether they still fail), the
/// other backends run it as usual.
///
/// Every body runs under [`within`]: a test that hangs fails after a bounded time.
#[macro_export]
macro_rules! backend_tests {
    // One CUDA backend's module: its tolerance is set on the test thread first.
    (@cuda $module:ident, $tolerance:ident, $backend:ident;
        $($name:ident => $body:ident ( $($arg:expr),* ) $([$reason:literal])?;)*) => {
        #[cfg(feature = "cuda")]
        mod $module {
            use super::*;
            $(#[test] $(#[ignore = $reason])? fn $name() {
                $crate::common::within(stringify!($name), || {
                    $crate::common::set_tolerance($crate::common::$tolerance);
                    $body::<$crate::common::$backend>($($arg),*)
                })
            })*
        }
    };
    ($($(#[$flex:meta])* $name:ident => $body:ident ( $($arg:expr),* )
        $(, fusion_fails = $reason:literal)? $(, moves_nothing = $nothing:literal)?;)*) => {
        mod flex {
            use super::*;
            $(#[test] $(#[$flex])* fn $name() {
                $crate::common::within(stringify!($name), || {
                    $body::<$crate::common::FlexAd>($($arg),*)
                })
            })*
        }
        mod ndarray {
            use super::*;
            $(#[test] fn $name() {
                $crate::common::within(stringify!($name), || {
                    $body::<$crate::common::NdArrayAd>($($arg),*)
                })
            })*
        }
        #[cfg(feature = "cubecl")]
        mod wgpu_distinct {
            use super::*;
            $(#[test] fn $name() {
                let moves_nothing: Option<&str> = None $(.or(Some($nothing)))?;
                let _ = $crate::common::on_distinct_wgpu_devices(
                    stringify!($name),
                    moves_nothing,
                    || $body::<$crate::common::WgpuCubeAd>($($arg),*),
                );
            })*
        }
        $crate::backend_tests!(@cuda cuda_fusion, TF32_TOLERANCE, CudaAd;
            $($name => $body($($arg),*) $([$reason])?;)*);
        $crate::backend_tests!(@cuda cuda_cube, TF32_TOLERANCE, CubeAd;
            $($name => $body($($arg),*);)*);
        $crate::backend_tests!(@cuda cuda_cube_half, HALF_TOLERANCE, CubeHalfAd;
            $($name => $body($($arg),*);)*);
    };
}

/// Runs `body` on a thread of its own and fails the test if it has not finished within
/// `DATAPARALLEL_TEST_TIMEOUT` seconds (120 by default): a hang becomes a failure naming the
/// test instead of a CI run that never ends. Panics of `body` come through unchanged.
pub fn within<T: Send + 'static>(name: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    within_for(name, 120, body)
}

/// [`within`], with `default` seconds where `DATAPARALLEL_TEST_TIMEOUT` is not set.
pub fn within_for<T: Send + 'static>(
    name: &str,
    default: u64,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let limit = std::env::var("DATAPARALLEL_TEST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            let _ = sender.send(result);
        })
        .expect("a test thread");
    match receiver.recv_timeout(std::time::Duration::from_secs(limit)) {
        Ok(Ok(value)) => value,
        Ok(Err(payload)) => std::panic::resume_unwind(payload),
        Err(_) => panic!("{name} did not finish within {limit} s: it hangs"),
    }
}

/// The rounds a stress test runs: `rounds`, or a tenth of them (at least 20) with replicas on
/// distinct wgpu devices, where lavapipe moves every tensor through host memory and each
/// round costs tens of milliseconds.
pub fn stress_rounds(rounds: usize) -> usize {
    #[cfg(feature = "cubecl")]
    if distinct::distinct_plan() {
        return (rounds / 10).max(20);
    }
    rounds
}

/// `n` entries of the backend's default device: several replicas on one device exercise every
/// code path of the pipeline.
///
/// With `DATAPARALLEL_TEST_DEVICES=distinct`, replica `i` goes to device `i` modulo the
/// backend's device count instead (the first is the default device), so that the same tests
/// run on several GPUs: outputs and gradients must still equal the single-device run.
///
/// Tests under [`on_distinct_wgpu_devices`] get that thread's plan of distinct devices instead.
pub fn devices<B: Backend>(n: usize) -> Vec<B::Device> {
    #[cfg(feature = "cubecl")]
    if let Some(devices) = distinct::planned::<B>(n) {
        return devices;
    }
    match std::env::var("DATAPARALLEL_TEST_DEVICES").as_deref() {
        Ok("distinct") => spread::spread::<B>(n),
        _ => vec![B::Device::default(); n],
    }
}

/// A two-layer perceptron.
///
/// The test models use GELU, not ReLU: their gradients are compared with a single-device run,
/// and ReLU's gradient jumps at zero. On CUDA the shards' and the whole batch's products round
/// differently (TF32, see [`TF32_TOLERANCE`]), so a pre-activation within about 1e-3 of zero
/// can be positive in one run and negative in the other; that one position then moves a whole
/// output channel's weight gradient by a few percent (seen as `conv_net_seven_over_three`
/// failing in one channel's 27 elements in 2 of 17 runs on an H200, the other 81 exact). A
/// smooth activation keeps the gradient within rounding of the reference, while a lost or
/// doubled replica contribution still differs by orders of magnitude more.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub hidden: Linear<B>,
    pub activation: Gelu,
    pub output: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    pub fn new(inputs: usize, hidden: usize, outputs: usize, device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(inputs, hidden).init(device),
            activation: Gelu::new(),
            output: LinearConfig::new(hidden, outputs).init(device),
        }
    }

    pub fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
        self.output
            .forward(self.activation.forward(self.hidden.forward(input)))
    }
}

impl<B: burn_dataparallel::ConcatBackend> Forward<B> for Mlp<B> {
    type Input = Tensor<B, 2>;
    type Output = Tensor<B, 2>;

    fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
        self.forward(input)
    }
}

/// A small convolutional classifier for `[batch, 3, 6, 6]` images.
#[derive(Module, Debug)]
pub struct ConvNet<B: Backend> {
    pub conv: Conv2d<B>,
    pub activation: Gelu,
    pub pool: AdaptiveAvgPool2d,
    pub head: Linear<B>,
}

impl<B: Backend> ConvNet<B> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            conv: Conv2dConfig::new([3, 4], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            activation: Gelu::new(),
            pool: AdaptiveAvgPool2dConfig::new([2, 2]).init(),
            head: LinearConfig::new(16, 3).init(device),
        }
    }

    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let features = self
            .pool
            .forward(self.activation.forward(self.conv.forward(images)));
        self.head.forward(features.flatten(1, 3))
    }
}

/// A perceptron with batch normalization and dropout.
#[derive(Module, Debug)]
pub struct BnNet<B: Backend> {
    pub hidden: Linear<B>,
    pub norm: BatchNorm<B>,
    pub activation: Gelu,
    pub dropout: Dropout,
    pub output: Linear<B>,
}

impl<B: Backend> BnNet<B> {
    pub fn new(dropout: f64, device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(8, 16).init(device),
            norm: BatchNormConfig::new(16).init(device),
            activation: Gelu::new(),
            dropout: DropoutConfig::new(dropout).init(),
            output: LinearConfig::new(16, 4).init(device),
        }
    }

    pub fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.norm.forward(self.hidden.forward(input));
        self.output
            .forward(self.dropout.forward(self.activation.forward(hidden)))
    }
}

/// A tensor of uniform random values in `[-1, 1)`.
pub fn random<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device)
}

/// A fixed, position-dependent weighting: `sum(output * probe(output))` gives every output
/// element a different gradient.
pub fn probe<B: Backend, const D: usize>(like: &Tensor<B, D>) -> Tensor<B, D> {
    let shape = like.shape();
    let n = shape.num_elements() as i64;
    Tensor::<B, 1, burn::tensor::Int>::arange(0..n, &like.device())
        .float()
        .mul_scalar(0.37)
        .sin()
        .reshape(shape)
}

/// Values of a tensor as `f32`.
pub fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    data_values(tensor.into_data())
}

pub fn data_values(data: TensorData) -> Vec<f32> {
    data.convert::<f32>().to_vec::<f32>().expect("f32 values")
}

/// Largest elementwise difference, relative to the largest magnitude in `expected`.
pub fn relative_error(actual: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(actual.len(), expected.len(), "lengths differ");
    let scale = expected.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    max_difference(actual, expected) / scale
}

/// The largest elementwise difference; infinite where one side is NaN or infinite and the
/// other is not the same (`f32::max` would skip a NaN and call a NaN result close).
fn max_difference(actual: &[f32], expected: &[f32]) -> f32 {
    actual.iter().zip(expected).fold(0f32, |m, (a, b)| {
        let difference = match a == b {
            true => 0.0,
            false => (a - b).abs(),
        };
        m.max(match difference.is_finite() {
            true => difference,
            false => f32::INFINITY,
        })
    })
}

/// Relative tolerance for comparisons with a single-device run in f32 on the CPU.
pub const CPU_TOLERANCE: f32 = 1e-5;

/// Relative tolerance on CUDA. CubeCL's tensor-core matmuls read f32 inputs as TF32 (10-bit
/// mantissa, unit roundoff 4.9e-4; `cubek-matmul-0.2.0/src/definition/blueprint.rs`), and
/// autotune picks a kernel per shape, so a shard and the whole batch can go through different
/// precisions. Measured on an H200: up to 9e-4 after three Adam steps.
pub const TF32_TOLERANCE: f32 = 2e-3;

/// Relative tolerance in half precision (f16: 10-bit mantissa like TF32, but every
/// intermediate result is also stored rounded, and the shards' sums run in a different order
/// than the whole batch's).
pub const HALF_TOLERANCE: f32 = 1e-2;

/// The Adam every test trains with: Burn's defaults but `epsilon = 1e-2`.
///
/// Adam moves a parameter by `lr * m / (sqrt(v) + epsilon)`; a gradient error `d` in an
/// element changes that step by up to `lr * d / epsilon`. With Burn's default `epsilon = 1e-5`
/// and `lr = 2e-2` that is 2,000 times the error: a rounding difference of 1e-4 in a near-zero
/// gradient element (the shards' sums run in another order than the whole batch's, and on
/// CUDA through TF32) becomes a full step of `lr` in either direction, so the parameters after
/// a few epochs differ by several percent with nothing wrong (measured on an H200: 4-15 %
/// after two or three Learner epochs in 6 of 20 runs; on the CPU 2e-4 in 2 of 366 runs). With
/// `epsilon = 1e-2` the gain is at most `lr / 1e-2` (1 to 5 for the tests' rates), so the
/// parameters stay within a few rounding errors of the reference times the number of steps,
/// while Adam's state (moments, bias correction by step count) still drives every step and a
/// lost or doubled replica contribution, an error of the gradient's own size, still moves the
/// parameters by about `lr` per step.
pub fn adam() -> burn::optim::AdamConfig {
    burn::optim::AdamConfig::new().with_epsilon(1e-2)
}

/// Relative tolerance for parameters after several [`adam`] steps on CUDA: TF32's error in a
/// gradient (about 1e-3 of its largest element) times Adam's gain with [`adam`]'s epsilon
/// (`lr / epsilon`) times the steps, at worst 2.4e-2 among the tests (12 Learner steps at
/// `lr = 2e-2`; 3 steps at `lr = 5e-2` give 1.5e-2).
pub const TF32_ADAM_TOLERANCE: f32 = 3e-2;

/// Widens the tolerance to [`TF32_ADAM_TOLERANCE`] on CUDA (where the tolerance is TF32's);
/// CPU tolerances stay as they are.
pub fn relax_for_adam() {
    TOLERANCE.with(|t| {
        if t.get() >= TF32_TOLERANCE {
            t.set(t.get().max(TF32_ADAM_TOLERANCE))
        }
    });
}

thread_local! {
    static TOLERANCE: std::cell::Cell<f32> = const { std::cell::Cell::new(CPU_TOLERANCE) };
}

/// The relative tolerance of [`assert_close`] on the current test thread.
pub fn tolerance() -> f32 {
    TOLERANCE.with(|t| t.get())
}

/// Sets the relative tolerance of [`assert_close`] for the current test thread.
pub fn set_tolerance(tolerance: f32) {
    TOLERANCE.with(|t| t.set(tolerance));
}

/// Asserts `|actual - expected| <= tol * max|expected| + tol / 10` elementwise.
///
/// The absolute part covers float rounding of sums whose terms cancel: the reduction order over
/// the batch differs between replicas and the single-device run (and varies between runs), and
/// a convolution bias gradient over 216 positions then differs by about 1e-6 on the CPU while
/// its result is small. A missing or doubled replica contribution differs by orders of
/// magnitude more.
pub fn assert_close(actual: &[f32], expected: &[f32], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    let tolerance = TOLERANCE.with(|t| t.get());
    let scale = expected.iter().fold(0f32, |m, x| m.max(x.abs()));
    let difference = max_difference(actual, expected);
    assert!(
        difference <= tolerance * (scale + 0.1),
        "{what}: difference {difference:e} > {tolerance:e} * ({scale:e} + 0.1) \
         (relative error {:e})\nactual:   {actual:?}\nexpected: {expected:?}",
        relative_error(actual, expected)
    );
}

/// Every trained float parameter's gradient, by parameter id, in visiting order.
pub fn param_grads<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> Vec<(ParamId, Vec<f32>)> {
    struct Collect<'a, B: AutodiffBackend> {
        grads: &'a B::Gradients,
        out: Vec<(ParamId, Vec<f32>)>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let tensor = param.val();
            if !tensor.is_require_grad() {
                return; // running statistics, not trained
            }
            let grad = tensor
                .grad(self.grads)
                .expect("every parameter has a gradient");
            self.out.push((param.id, data_values(grad.into_data())));
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
pub fn param_values<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(values(param.val()));
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Every trainable float parameter's gradient, `None` where it has none, by id in visiting
/// order.
pub fn maybe_param_grads<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> Vec<(ParamId, Option<Vec<f32>>)> {
    struct Collect<'a, B: AutodiffBackend> {
        grads: &'a B::Gradients,
        out: Vec<(ParamId, Option<Vec<f32>>)>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let tensor = param.val();
            if tensor.is_require_grad() {
                let grad = tensor.grad(self.grads).map(|g| data_values(g.into_data()));
                self.out.push((param.id, grad));
            }
        }
    }
    let mut collect = Collect {
        grads,
        out: Vec::new(),
    };
    module.visit(&mut collect);
    collect.out
}

/// Asserts that the same parameters have gradients and that those gradients are close.
pub fn assert_maybe_grads_close(
    actual: &[(ParamId, Option<Vec<f32>>)],
    expected: &[(ParamId, Option<Vec<f32>>)],
) {
    assert_eq!(actual.len(), expected.len(), "parameter count");
    for ((id, a), (id_ref, e)) in actual.iter().zip(expected) {
        assert_eq!(id, id_ref, "parameter order");
        match (a, e) {
            (Some(a), Some(e)) => assert_close(a, e, &format!("gradient of parameter {id}")),
            (None, None) => {}
            _ => panic!(
                "parameter {id}: gradient {} through the wrapper, {} for the bare model",
                if a.is_some() { "present" } else { "absent" },
                if e.is_some() { "present" } else { "absent" },
            ),
        }
    }
}

pub fn assert_grads_close(actual: &[(ParamId, Vec<f32>)], expected: &[(ParamId, Vec<f32>)]) {
    assert_eq!(actual.len(), expected.len(), "parameter count");
    for ((id, a), (id_ref, e)) in actual.iter().zip(expected) {
        assert_eq!(id, id_ref, "parameter order");
        assert_close(a, e, &format!("gradient of parameter {id}"));
    }
}

/// Runs `forward` through `dp` and, as the reference, on `bare` (which shares `dp`'s
/// parameters) on the whole input; asserts the outputs and every parameter gradient of
/// `sum(output * probe)` agree.
pub fn assert_matches_bare<B, M, I, const D: usize>(
    dp: &DataParallel<B, M>,
    bare: &M,
    input: I,
    forward: impl Fn(&M, I) -> Tensor<B, D> + Sync,
) where
    B: DataParallelBackend,
    M: Module<B>,
    I: Scatter<B> + Send + Clone,
{
    let expected = forward(bare, input.clone());
    let actual = dp.forward_with(input, &forward);
    assert_eq!(actual.dims(), expected.dims(), "output shape");
    assert_output_and_grads_close(dp.module(), actual, bare, expected);
}

/// Asserts that `actual` (an output of `module`) is close to `expected` (of `reference`), and
/// that every parameter gradient of `sum(output * probe)` agrees between the two modules.
pub fn assert_output_and_grads_close<B, M, const D: usize>(
    module: &M,
    actual: Tensor<B, D>,
    reference: &M,
    expected: Tensor<B, D>,
) where
    B: AutodiffBackend,
    M: Module<B>,
{
    assert_close(&values(actual.clone()), &values(expected.clone()), "output");
    let weights = probe(&expected);
    let expected_grads = (expected * weights.clone()).sum().backward();
    let actual_grads = (actual * weights).sum().backward();
    assert_grads_close(
        &param_grads(module, &actual_grads),
        &param_grads(reference, &expected_grads),
    );
}
