//! The host-staged bench's transfer table (`host_staged transfer`): the parameters' move
//! between two wgpu devices, each way of doing it timed apart.

use std::time::{Duration, Instant};

use burn::backend::wgpu::WgpuDevice;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

use crate::Inner;
use crate::measure::median;
use crate::models::Mlp;

/// The parameters' move alone, from the first device to the second, each way of doing it
/// timed apart: the median of 10 after 2 untimed, each waiting for its device, with the
/// fastest and slowest of the 10; GB/s counts the bytes once. The write is also timed in
/// pieces of 1 to 64 MiB (each its own `from_data`, joined on the device), cut from the host
/// data beforehand, to tell a cost per write (a staging buffer allocated for each) from a
/// cost per byte (the copy into it).
pub fn transfers(widths: &[usize], devices: &[WgpuDevice]) {
    let (from, to) = (&devices[0], &devices[1]);
    let model = Mlp::<Inner>::new(widths, from);
    let count = burn::module::Module::num_params(&model);
    let bytes = 4 * count;
    let flat = Tensor::<Inner, 1>::random([count], Distribution::Default, from);
    Inner::sync(from).expect("sync");
    let data = flat.clone().into_data();
    let values = data.as_slice::<f32>().expect("f32 data").to_vec();
    let time = |f: &mut dyn FnMut()| {
        for _ in 0..2 {
            f();
        }
        let mut times: Vec<Duration> = (0..10)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed()
            })
            .collect();
        times.sort();
        (median(times.clone()), times[0], times[times.len() - 1])
    };
    let mut rows: Vec<(String, (Duration, Duration, Duration))> = vec![
        (
            "read to host (`into_data`)".into(),
            time(&mut || drop(flat.clone().into_data())),
        ),
        (
            "write from host (`from_data`)".into(),
            time(&mut || {
                let _ = Tensor::<Inner, 1>::from_data(data.clone(), to);
                Inner::sync(to).expect("sync");
            }),
        ),
    ];
    for mib in [1, 4, 16, 64] {
        let piece = mib * (1 << 20) / 4;
        let pieces: Vec<burn::tensor::TensorData> = values
            .chunks(piece)
            .map(|chunk| burn::tensor::TensorData::new(chunk.to_vec(), [chunk.len()]))
            .collect();
        rows.push((
            format!(
                "write in {} pieces of {mib} MiB, joined there",
                pieces.len()
            ),
            time(&mut || {
                let parts = (pieces.iter().cloned())
                    .map(|piece| Tensor::<Inner, 1>::from_data(piece, to))
                    .collect();
                let _ = Tensor::cat(parts, 0);
                Inner::sync(to).expect("sync");
            }),
        ));
    }
    let per_piece = (1 << 20) / 4;
    rows.push((
        format!(
            "read in {} pieces of 1 MiB, one transaction",
            count.div_ceil(per_piece)
        ),
        time(&mut || {
            let read = (0..count).step_by(per_piece).fold(
                burn::tensor::Transaction::default(),
                |read, start| {
                    read.register(flat.clone().slice(start..(start + per_piece).min(count)))
                },
            );
            drop(read.execute());
        }),
    ));
    rows.extend([
        (
            "read, then write (the plain copy)".into(),
            time(&mut || {
                let _ = Tensor::<Inner, 1>::from_data(flat.clone().into_data(), to);
                Inner::sync(to).expect("sync");
            }),
        ),
        (
            "the crate's move (`backend::move_to`)".into(),
            time(&mut || {
                let _ = burn_dataparallel::backend::move_to(flat.clone(), to);
                Inner::sync(to).expect("sync");
            }),
        ),
        (
            "the replicate stage (`replicate`, 25 MiB buckets)".into(),
            time(&mut || {
                let _ = burn_dataparallel::replicate(&model, std::slice::from_ref(to));
                Inner::sync(to).expect("sync");
            }),
        ),
    ]);
    println!("{bytes} bytes ({count} f32 parameters) from {from:?} to {to:?}");
    println!("| what | time (median of 10) | fastest-slowest | GB/s (median) |");
    println!("|---|---|---|---|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (what, (took, fastest, slowest)) in rows {
        let rate = bytes as f64 / took.as_secs_f64() / 1e9;
        println!(
            "| {what} | {:.2} ms | {:.2}-{:.2} ms | {rate:.2} |",
            ms(took),
            ms(fastest),
            ms(slowest)
        );
    }
}
