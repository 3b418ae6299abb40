//! The concat/split kernels against Burn's own `cat` and `narrow`, on odd shapes, every rank
//! from 1 to 5 and every dim, 1 to 16 inputs, non-contiguous inputs and several dtypes, and
//! their gradients under autodiff.
//!
//! Runs on the CPU backends, on CubeCL's wgpu runtime (plain and with fusion; Mesa's lavapipe
//! in CI; skipped, with a line saying so, where no Vulkan driver is installed) and, with the
//! `cuda` feature, on CUDA.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, FloatDType, Int, IntDType, Tensor, TensorData};
use burn_dataparallel::ConcatBackend;
use burn_dataparallel::backend::{coalesce, concat, split, uncoalesce};

#[path = "common/adapter.rs"]
mod adapter;

type WgpuCube = burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;
type WgpuFusion = burn::backend::Wgpu;
#[cfg(feature = "cuda")]
type CudaCube = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

macro_rules! kernel_tests {
    ($($name:ident => $body:ident;)*) => {
        kernel_tests!(@backend flex, burn::backend::Flex; $($name => $body;)*);
        kernel_tests!(@backend ndarray, burn::backend::NdArray; $($name => $body;)*);
        kernel_tests!(@backend wgpu_cube, WgpuCube; $($name => $body;)*);
        kernel_tests!(@backend wgpu_fusion, WgpuFusion; $($name => $body;)*);
        #[cfg(feature = "cuda")]
        kernel_tests!(@backend cuda_cube, CudaCube; $($name => $body;)*);
        #[cfg(feature = "cuda")]
        kernel_tests!(@backend cuda_fusion, burn::backend::Cuda; $($name => $body;)*);
    };
    (@backend $module:ident, $backend:ty; $($name:ident => $body:ident;)*) => {
        mod $module {
            use super::*;
            $(#[test] fn $name() {
                let test = concat!(stringify!($module), "::", stringify!($name));
                if stringify!($module).starts_with("wgpu") && adapter::skip_without_wgpu(test) {
                    return;
                }
                $body::<$backend>()
            })*
        }
    };
}

/// A tensor of distinct values (`seed + 0.5 * index`), so that any misplaced element shows.
fn distinct<B: Backend, const D: usize>(shape: [usize; D], seed: f32) -> Tensor<B, D> {
    let count = shape.iter().product::<usize>();
    let values: Vec<f32> = (0..count).map(|i| seed + 0.5 * i as f32).collect();
    Tensor::from_data(TensorData::new(values, shape), &Default::default())
}

fn assert_same<B: Backend, const D: usize>(
    actual: Tensor<B, D>,
    expected: Tensor<B, D>,
    what: &str,
) {
    assert_eq!(actual.dims(), expected.dims(), "{what}: shape");
    let (a, e) = (actual.into_data(), expected.into_data());
    assert_eq!(a.dtype, e.dtype, "{what}: dtype");
    assert_eq!(
        a.convert::<f32>().to_vec::<f32>().unwrap(),
        e.convert::<f32>().to_vec::<f32>().unwrap(),
        "{what}: values"
    );
}

/// Our concat and split against `cat` and `narrow` on the given inputs.
fn check<B: ConcatBackend, const D: usize>(inputs: Vec<Tensor<B, D>>, dim: usize, what: &str) {
    let expected = Tensor::cat(inputs.clone(), dim);
    let sizes: Vec<usize> = inputs.iter().map(|t| t.dims()[dim]).collect();
    assert_same(
        concat(inputs.clone(), dim),
        expected.clone(),
        &format!("concat {what}"),
    );
    let pieces = split(expected, &sizes, dim);
    assert_eq!(pieces.len(), inputs.len());
    for (i, (piece, input)) in pieces.into_iter().zip(inputs).enumerate() {
        assert_same(piece, input, &format!("split {what}, piece {i}"));
    }
}

/// `[1, 137]`-like shapes, 1 to 16 inputs of unequal sizes, along both dims.
fn odd_shapes_and_input_counts<B: ConcatBackend>() {
    for count in 1..=16usize {
        let rows = (0..count)
            .map(|i| distinct::<B, 2>([1 + (i * 5) % 7, 137], i as f32))
            .collect();
        check(rows, 0, &format!("{count} inputs along dim 0"));
        let columns = (0..count)
            .map(|i| distinct::<B, 2>([1, 137 + 3 * i], i as f32))
            .collect();
        check(columns, 1, &format!("{count} inputs along dim 1"));
    }
}

fn rank<B: ConcatBackend, const D: usize>() {
    let base = [3, 2, 5, 4, 3];
    for dim in 0..D {
        let inputs = (1..=3)
            .map(|size| {
                let mut shape: [usize; D] = core::array::from_fn(|d| base[d]);
                shape[dim] = size;
                distinct::<B, D>(shape, size as f32 * 100.0)
            })
            .collect();
        check(inputs, dim, &format!("rank {D}, dim {dim}"));
    }
}

fn ranks_one_to_five_along_every_dim<B: ConcatBackend>() {
    rank::<B, 1>();
    rank::<B, 2>();
    rank::<B, 3>();
    rank::<B, 4>();
    rank::<B, 5>();
}

/// Transposed and narrowed (strided) inputs concatenate like contiguous ones; a split of a
/// strided tensor gives the same pieces.
fn non_contiguous_inputs<B: ConcatBackend>() {
    let transposed = distinct::<B, 2>([7, 5], 0.0).transpose();
    let narrowed = distinct::<B, 2>([7, 9], 50.0).narrow(1, 2, 4).transpose();
    let contiguous = distinct::<B, 2>([3, 7], 90.0);
    check(
        vec![transposed.clone(), narrowed, contiguous],
        0,
        "strided inputs",
    );
    check(
        vec![transposed.clone(), transposed],
        1,
        "strided inputs along dim 1",
    );
}

fn every_dtype<B: ConcatBackend>() {
    let device = Default::default();
    for dtype in [FloatDType::F32, FloatDType::F16, FloatDType::BF16] {
        if !B::supports_dtype(&device, DType::from(dtype)) {
            continue;
        }
        let inputs = (0..3)
            .map(|i| distinct::<B, 2>([2 + i, 33], i as f32).cast(dtype))
            .collect();
        check(inputs, 0, &format!("{dtype:?} along dim 0"));
        let inputs = (0..3)
            .map(|i| distinct::<B, 2>([4, 9 + 2 * i], i as f32).cast(dtype))
            .collect();
        check(inputs, 1, &format!("{dtype:?} along dim 1"));
    }
    if B::supports_dtype(&device, DType::I32) {
        let ints: Vec<Tensor<B, 2, Int>> = (0..3)
            .map(|i| {
                Tensor::<B, 1, Int>::arange(0..(5 * (i + 2)) as i64, &device)
                    .reshape([i + 2, 5])
                    .cast(IntDType::I32)
            })
            .collect();
        let expected = Tensor::cat(ints.clone(), 0);
        assert_eq!(
            concat(ints.clone(), 0).into_data(),
            expected.clone().into_data()
        );
        for (piece, input) in split(expected, &[2, 3, 4], 0).into_iter().zip(ints) {
            assert_eq!(piece.into_data(), input.into_data());
        }
    }
}

/// Coalescing many flat tensors and cutting them back is the identity.
fn coalesce_round_trips<B: ConcatBackend>() {
    let tensors: Vec<Tensor<B, 1>> = [1usize, 137, 64, 3, 4096, 5]
        .iter()
        .enumerate()
        .map(|(i, &n)| distinct::<B, 1>([n], i as f32 * 1000.0))
        .collect();
    let counts: Vec<usize> = tensors.iter().map(|t| t.dims()[0]).collect();
    let buffer = coalesce(tensors.clone());
    assert_eq!(buffer.dims(), [counts.iter().sum::<usize>()]);
    for (back, original) in uncoalesce(buffer, &counts).into_iter().zip(tensors) {
        assert_same(back, original, "coalesced round trip");
    }
}

kernel_tests! {
    odd_shapes => odd_shapes_and_input_counts;
    ranks => ranks_one_to_five_along_every_dim;
    non_contiguous => non_contiguous_inputs;
    dtypes => every_dtype;
    coalesce => coalesce_round_trips;
}

/// Gradients through concat and split equal those through `cat` and `narrow`.
fn gradients_match_stock_ops<B: AutodiffBackend + ConcatBackend>() {
    let inputs: Vec<Tensor<B, 2>> = (0..5)
        .map(|i| distinct::<B, 2>([2 + i, 6], i as f32).require_grad())
        .collect();
    let weights = distinct::<B, 2>([20, 6], -3.0).sin();
    let grads = |output: Tensor<B, 2>| {
        let g = (output * weights.clone()).sum().backward();
        inputs
            .iter()
            .map(|t| t.grad(&g).expect("gradient").into_data())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        grads(concat(inputs.clone(), 0)),
        grads(Tensor::cat(inputs.clone(), 0))
    );

    let whole = distinct::<B, 2>([6, 20], 1.0).require_grad();
    let weights: Vec<Tensor<B, 2>> = [3usize, 9, 8]
        .iter()
        .map(|&n| distinct::<B, 2>([6, n], n as f32).cos())
        .collect();
    let grad_of = |pieces: Vec<Tensor<B, 2>>| {
        let loss = pieces
            .into_iter()
            .zip(&weights)
            .map(|(p, w)| (p * w.clone()).sum())
            .reduce(|a, b| a + b)
            .unwrap();
        whole.grad(&loss.backward()).expect("gradient").into_data()
    };
    let ours = grad_of(split(whole.clone(), &[3, 9, 8], 1));
    let stock = grad_of(whole.clone().split_with_sizes(vec![3, 9, 8], 1));
    assert_eq!(ours, stock);
}

mod autodiff {
    use super::*;
    use burn::backend::Autodiff;

    #[test]
    fn flex() {
        gradients_match_stock_ops::<Autodiff<burn::backend::Flex>>();
    }

    #[test]
    fn wgpu_cube() {
        if !adapter::skip_without_wgpu("autodiff::wgpu_cube") {
            gradients_match_stock_ops::<Autodiff<WgpuCube>>();
        }
    }

    #[test]
    fn wgpu_fusion() {
        if !adapter::skip_without_wgpu("autodiff::wgpu_fusion") {
            gradients_match_stock_ops::<Autodiff<WgpuFusion>>();
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_fusion() {
        gradients_match_stock_ops::<Autodiff<burn::backend::Cuda>>();
    }
}
