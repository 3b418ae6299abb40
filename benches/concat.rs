//! Concatenation bandwidth: this crate's one-launch `concat` against Burn's `Tensor::cat` and
//! an elementwise copy of the output's size (the ceiling), on CubeBackend and Fusion CUDA.
//!
//! ```sh
//! cargo bench --features cuda --bench concat    # CUDA
//! cargo bench --bench concat                     # CPU smoke run (small shapes)
//! ```
//!
//! Measured with criterion (warm-up, samples and their statistics, throughput in bytes read
//! and written, twice the output): a sample runs the operation criterion's number of times
//! from a synchronised device and synchronises once at the end; the small case also runs
//! one operation then a synchronisation (the latency the host sees). The device-timed small
//! case (CubeCL's profiler, CUDA only) prints its own line. Criterion's options follow
//! `--`, e.g. `cargo bench --bench concat -- 'ours: concat'` to filter.

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorData};
use burn_dataparallel::ConcatBackend;
use burn_dataparallel::backend::{concat, split};
use criterion::{Criterion, Throughput};

// The median (of the device-timed case); the lists from the environment go unused here.
#[allow(dead_code)]
#[path = "common/measure.rs"]
mod measure;
#[cfg(feature = "cuda")]
use measure::median;

struct Case {
    name: &'static str,
    parts: usize,
    shape: [usize; 2],
    dtype: FloatDType,
}

/// The time of `iters` runs of `op` from a synchronised device to the device having run
/// them all (`per_op`: synchronising after every run, the latency the host sees).
fn timed<B: Backend>(
    device: &B::Device,
    iters: u64,
    per_op: bool,
    op: &mut impl FnMut(),
) -> Duration {
    B::sync(device).expect("sync");
    let start = Instant::now();
    for _ in 0..iters {
        op();
        if per_op {
            B::sync(device).expect("sync");
        }
    }
    B::sync(device).expect("sync");
    start.elapsed()
}

fn bench<B: ConcatBackend>(c: &mut Criterion, backend: &str, cases: &[Case]) {
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
        let bytes = 2 * whole.shape().num_elements() as u64 * whole.dtype().size() as u64;
        let mut group = c.benchmark_group(format!("{backend} {}", case.name));
        // Bytes read and written: twice the output.
        group.throughput(Throughput::Bytes(bytes));
        let mut run = |method: &str, per_op: bool, mut op: Box<dyn FnMut() + '_>| {
            group.bench_function(method, |b| {
                b.iter_custom(|iters| timed::<B>(&device, iters, per_op, &mut op))
            });
        };
        run(
            "ours: concat",
            false,
            Box::new(|| drop(concat(parts.clone(), 0))),
        );
        run(
            "Burn: Tensor::cat",
            false,
            Box::new(|| drop(Tensor::cat(parts.clone(), 0))),
        );
        run(
            "copy ceiling (x + 0)",
            false,
            Box::new(|| drop(whole.clone().add_scalar(0.0))),
        );
        let sizes = vec![rows; case.parts];
        run(
            "ours: split, dim 0 (views)",
            false,
            Box::new(|| drop(split(whole.clone(), &sizes, 0))),
        );
        let columns = Tensor::cat(parts.clone(), 1);
        let widths = vec![cols; case.parts];
        run(
            "ours: split, dim 1 (contiguous pieces)",
            false,
            Box::new(|| drop(split(columns.clone(), &widths, 1))),
        );
        if rows * cols * case.parts <= 1 << 20 {
            run(
                "ours: concat, 1 op + sync",
                true,
                Box::new(|| drop(concat(parts.clone(), 0))),
            );
            run(
                "Burn: Tensor::cat, 1 op + sync",
                true,
                Box::new(|| drop(Tensor::cat(parts.clone(), 0))),
            );
        }
        group.finish();
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
    // Short samples: 7 methods x 4 cases x 2 backends on CUDA within a call's time limit.
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
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
        bench::<Cube>(&mut c, "CubeBackend<Cuda>", &cases);
        bench::<burn::backend::Cuda>(&mut c, "Cuda (Fusion)", &cases);
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
        bench::<burn::backend::Flex>(&mut c, "Flex (CPU)", &cases);
        bench::<burn::backend::Wgpu>(&mut c, "Wgpu (lavapipe, fusion)", &cases);
    }
    c.final_summary();
}
