//! Comparisons with a single-device run: tolerances, closeness of values, of every
//! parameter's gradient and of outputs.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use burn_dataparallel::{DataParallel, DataParallelBackend, Scatter};

use super::probe;

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
/// mantissa, unit roundoff u = 4.9e-4; `cubek-matmul-0.2.0/src/definition/blueprint.rs`), and
/// autotune picks a kernel per shape, so a shard and the whole batch can go through different
/// precisions. Each product rounds both its operands (up to 2u of every term), and a gradient
/// goes through a chain of them: the tests' deepest compare gradients three or four products
/// deep (two wrappers in a row, the backward's own product), up to about 8u = 3.9e-3 of the
/// terms' magnitudes, hence 5e-3. Measured on an H200: up to 9e-4 after three Adam steps on
/// kept caches; 2.7e-3 on fresh caches in `graphs::second_wrapper_ignores_part_serial`
/// (every element off by 1e-5 to 8e-4, 2026-12-03). The faults this suite has caught on CUDA
/// were 1.5 % to 32 % off (a lost or stale shard, a few elements a whole gradient off), and a
/// lost or doubled replica's contribution is of the gradient's own size: all still fail.
pub const TF32_TOLERANCE: f32 = 5e-3;

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
    forward: fn(&M, I) -> Tensor<B, D>,
) where
    B: DataParallelBackend,
    M: Module<B>,
    I: Scatter<B> + Send + Clone,
{
    let expected = forward(bare, input.clone());
    let actual = dp.forward_with(input, forward);
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
