//! A small convolutional step's gradients in `CubeBackend` f16 against f32, with no
//! `DataParallel`: the second fault this reproduction shows (the parent module's docs).

use super::*;

/// The gradients of one training step of a small convolutional net (a 3x3 convolution, GELU,
/// average pooling, a linear head: the shapes of the `backends` test `overlap`'s `ConvNet`,
/// batches of 7 and 5 rows) on `B`, with no wrapper: the convolution's weight and bias, the
/// head's weight and bias and the input's gradient.
fn conv_gradients<B: burn::tensor::backend::AutodiffBackend>(rows: usize) -> Vec<Vec<f32>> {
    use burn::tensor::activation::gelu;
    use burn::tensor::module::{adaptive_avg_pool2d, conv2d};
    use burn::tensor::ops::ConvOptions;
    let weight = tensor::<B, 4>(&numbers(108, 11), [4, 3, 3, 3]).require_grad();
    let bias = tensor::<B, 1>(&numbers(4, 12), [4]).require_grad();
    let head = tensor::<B, 2>(&numbers(48, 13), [16, 3]).require_grad();
    let head_bias = tensor::<B, 1>(&numbers(3, 14), [3]).require_grad();
    let input = tensor::<B, 4>(&numbers(rows * 108, 15), [rows, 3, 6, 6]).require_grad();
    let options = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    let hidden = conv2d(input.clone(), weight.clone(), Some(bias.clone()), options);
    let pooled = adaptive_avg_pool2d(gelu(hidden), [2, 2]).flatten::<2>(1, 3);
    let output = linear(pooled, head.clone(), Some(head_bias.clone()));
    let probe = tensor::<B, 2>(&numbers(rows * 3, 16), [rows, 3]);
    let grads = (output * probe).sum().backward();
    let grad = |g: Option<Vec<f32>>| g.expect("a gradient");
    let read = |t: burn::tensor::Tensor<B::InnerBackend, 1>| {
        t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
    };
    vec![
        grad(weight.grad(&grads).map(|g| read(g.flatten(0, 3)))),
        grad(bias.grad(&grads).map(read)),
        grad(head.grad(&grads).map(|g| read(g.flatten(0, 1)))),
        grad(head_bias.grad(&grads).map(read)),
        grad(input.grad(&grads).map(|g| read(g.flatten(0, 3)))),
    ]
}

/// The convolutional step's gradients in `CubeBackend` f16, five times in a row for each
/// batch size, against f32 on the CPU, on one thread and then on three threads at once (each
/// thread a CubeCL stream of its own).
///
/// On empty CubeCL caches this fails in about half of the processes (`benches/RESULTS.md`,
/// "`CubeBackend` f16's gradients on fresh caches"): there, every 7-row step's gradients are wrong (by up to a quarter of their
/// size, some `NaN`), on one thread as on three, in every run of the process, while the 5-
/// and 3-row steps are right; in the other processes all are right. So a kernel chosen by CubeCL 0.10's autotune
/// for a shape of the 7-row step computes wrong values in f16, with no `DataParallel`
/// involved; which kernel is chosen depends on the tuning's timings, and a kept cache keeps
/// the choice. Ignored, since it passes or fails by the caches it meets; run it in fresh
/// processes on empty caches (`benches/journal/2026-12-04.md`).
#[test]
#[ignore = "CubeCL 0.10's f16 autotune can choose a kernel that is wrong for a 7-row step; run with --include-ignored on empty caches"]
fn cube_half_conv_gradients_match_f32() {
    type Half = Autodiff<Unfused>;
    let mut failures = Vec::new();
    let names = [
        "conv weight",
        "conv bias",
        "head weight",
        "head bias",
        "input",
    ];
    let check = |thread: &str, rows: usize, run: usize, actual: Vec<Vec<f32>>| {
        let expected = conv_gradients::<Autodiff<Reference>>(rows);
        let mut failures = Vec::new();
        for ((name, a), e) in names.iter().zip(&actual).zip(&expected) {
            let nan = a.iter().filter(|v| !v.is_finite()).count();
            let case = format!(
                "conv gradients, {thread}, {rows} rows, run {run}: {name} ({nan} not finite)"
            );
            compare(case, a, e, &mut failures);
        }
        failures
    };
    for run in 0..5 {
        for rows in [7, 5] {
            failures.extend(check("one thread", rows, run, conv_gradients::<Half>(rows)));
        }
    }
    let threads: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                (0..5)
                    .flat_map(|run| [7, 5, 3].map(|rows| (rows, run, conv_gradients::<Half>(rows))))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (thread, handle) in threads.into_iter().enumerate() {
        for (rows, run, actual) in handle.join().expect("a thread") {
            failures.extend(check(&format!("thread {thread} of 3"), rows, run, actual));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
