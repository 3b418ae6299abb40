//! Concatenation bandwidth: this crate's one-launch `concat` against Burn's `Tensor::cat` and
//! an elementwise copy of the output's size (the ceiling), on CubeBackend and Fusion CUDA.
//!
//! ```sh
//! cargo bench --features cuda --bench concat    # CUDA
//! cargo bench --bench concat                     # CPU smoke run (small shapes)
//! ```
//!
//! Each measurement is the median of 7 samples; a sample runs the operation 10 times and
//! synchronises the device once, and counts the bytes read and written (twice the output).
//! The small case also reports one operation followed by a synchronisation (latency as the
//! host sees it).

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorData};
use burn_dataparallel::ConcatBackend;
use burn_dataparallel::backend::{concat, split};

// The median; the lists from the environment go unused here.
#[allow(dead_code)]
#[path = "common/measure.rs"]
mod measure;
use measure::median;

struct Case {
    name: &'static str,
    parts: usize,
    shape: [usize; 2],
    dtype: FloatDType,
}

/// Median time of one `op`, from samples of `repeat` ops and one synchronisation.
fn time<B: Backend>(device: &B::Device, repeat: usize, mut op: impl FnMut()) -> Duration {
    for _ in 0..3 {
        op();
    }
    B::sync(device).expect("sync");
    let samples = (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..repeat {
                op();
            }
            B::sync(device).expect("sync");
            start.elapsed() / repeat as u32
        })
        .collect();
    median(samples)
}

fn bench<B: ConcatBackend>(backend: &str, cases: &[Case]) {
    let device = B::Device::default();
    for case in cases {
        if !B::supports_dtype(&device, case.dtype.into()) {
            continue;
        }
        let [rows, cols] = case.shape;
        let parts: Vec<Tensor<B, 2>> = (0..case.parts)
            .map(|i| {
                let values = vec![i as f32; rows * cols];
                Tensor::<B, 2>::from_data(TensorData::new(values, [rows, cols]), &device)
                    .cast(case.dtype)
            })
            .collect();
        let whole = Tensor::cat(parts.clone(), 0);
        let bytes = 2.0 * whole.shape().num_elements() as f64 * whole.dtype().size() as f64;
        let report = |method: &str, t: Duration| {
            println!(
                "| {backend} | {} | {method} | {:.3} ms | {:.2} TB/s |",
                case.name,
                t.as_secs_f64() * 1e3,
                bytes / t.as_secs_f64() / 1e12
            );
        };
        report(
            "ours: concat",
            time::<B>(&device, 10, || drop(concat(parts.clone(), 0))),
        );
        report(
            "Burn: Tensor::cat",
            time::<B>(&device, 10, || drop(Tensor::cat(parts.clone(), 0))),
        );
        report(
            "copy ceiling (x + 0)",
            time::<B>(&device, 10, || drop(whole.clone().add_scalar(0.0))),
        );
        let sizes = vec![rows; case.parts];
        report(
            "ours: split, dim 0 (views)",
            time::<B>(&device, 10, || drop(split(whole.clone(), &sizes, 0))),
        );
        let columns = Tensor::cat(parts.clone(), 1);
        let widths = vec![cols; case.parts];
        report(
            "ours: split, dim 1 (contiguous pieces)",
            time::<B>(&device, 10, || drop(split(columns.clone(), &widths, 1))),
        );
        if rows * cols * case.parts <= 1 << 20 {
            report(
                "ours: concat, 1 op + sync",
                time::<B>(&device, 1, || drop(concat(parts.clone(), 0))),
            );
            report(
                "Burn: Tensor::cat, 1 op + sync",
                time::<B>(&device, 1, || drop(Tensor::cat(parts.clone(), 0))),
            );
        }
    }
}

/// Device time of one concatenation of 4x[64,1024] f32 on CubeBackend, from CubeCL's profiler
/// (events recorded on the stream before and after), median of 21: the measurement that
/// compares with `torch.cat` timed by CUDA events.
#[cfg(feature = "cuda")]
fn device_timed_small() {
    type Cube = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    let device = Default::default();
    let parts: Vec<Tensor<Cube, 2>> = (0..4)
        .map(|i| {
            Tensor::from_data(
                TensorData::new(vec![i as f32; 64 * 1024], [64, 1024]),
                &device,
            )
        })
        .collect();
    let client = parts[0].clone().into_primitive().tensor().client;
    let measure = |method: &str, op: &(dyn Fn(Vec<Tensor<Cube, 2>>) -> Tensor<Cube, 2> + Sync)| {
        let samples = (0..24)
            .map(|_| {
                let inputs = parts.clone();
                let (output, duration) = client
                    .profile(move || op_send(op, inputs), method)
                    .expect("profile");
                drop(output);
                cubecl::future::block_on(duration.resolve()).duration()
            })
            .skip(3)
            .collect();
        println!(
            "| CubeBackend<Cuda> | 4x[64,1024] f32 | {method}, device time | {:.4} ms | |",
            median(samples).as_secs_f64() * 1e3
        );
    };
    measure("ours: concat", &|p| concat(p, 0));
    measure("Burn: Tensor::cat", &|p| Tensor::cat(p, 0));
}

#[cfg(feature = "cuda")]
fn op_send<T>(op: &(dyn Fn(Vec<T>) -> T + Sync), inputs: Vec<T>) -> T {
    op(inputs)
}

fn main() {
    println!("| backend | case | method | time | bandwidth (read + write) |");
    println!("|---|---|---|---|---|");
    #[cfg(feature = "cuda")]
    {
        let cases = [
            Case {
                name: "4x[16384,4096] f32",
                parts: 4,
                shape: [16384, 4096],
                dtype: FloatDType::F32,
            },
            Case {
                name: "8x[8192,4096] f32",
                parts: 8,
                shape: [8192, 4096],
                dtype: FloatDType::F32,
            },
            Case {
                name: "4x[16384,4096] bf16",
                parts: 4,
                shape: [16384, 4096],
                dtype: FloatDType::BF16,
            },
            Case {
                name: "4x[64,1024] f32",
                parts: 4,
                shape: [64, 1024],
                dtype: FloatDType::F32,
            },
        ];
        type Cube = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
        bench::<Cube>("CubeBackend<Cuda>", &cases);
        bench::<burn::backend::Cuda>("Cuda (Fusion)", &cases);
        device_timed_small();
    }
    #[cfg(not(feature = "cuda"))]
    {
        let cases = [
            Case {
                name: "4x[512,256] f32",
                parts: 4,
                shape: [512, 256],
                dtype: FloatDType::F32,
            },
            Case {
                name: "4x[64,1024] f32",
                parts: 4,
                shape: [64, 1024],
                dtype: FloatDType::F32,
            },
        ];
        bench::<burn::backend::Flex>("Flex (CPU)", &cases);
        bench::<burn::backend::Wgpu>("Wgpu (lavapipe, fusion)", &cases);
    }
}
