//! What decides a gap under the Learner: one profiled `TrainStep` of the wrapper after its
//! run, and the gradient sum's rate against a plain copy between the devices it spans.

use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use burn::train::TrainStep;
use burn_dataparallel::DataParallel;

use crate::median;
use crate::models::{Batch, Net};

/// Profiled steps; the last one's profile is printed.
const STEPS: usize = 3;

/// Prints `profile ...` (the wrapper's stages in one `TrainStep`) and `reduce ...` (the
/// gradient sum's rate: one gradient set moved and added per replica after the first, against
/// the copy rate from each other device to the output device).
pub fn print(dp: &DataParallel<Net>, rows: usize, features: usize, devices: &[Device]) {
    let output = &devices[0];
    dp.set_profiling(true);
    for _ in 0..STEPS {
        let batch = Batch::random(rows, features, output);
        let _ = dp.step(batch);
    }
    dp.set_profiling(false);
    let Some(profile) = dp.profile() else {
        return;
    };
    println!("profile {profile}");
    let bytes = dp.num_params() * size_of::<f32>();
    let summed = bytes * (devices.len() - 1);
    let reduce = rate(summed, profile.combine);
    // Each other device once: replicas cycle over the devices (`cuda:0,cuda:1,cuda:0,...`).
    let mut others: Vec<&Device> = Vec::new();
    for device in devices.iter().filter(|d| *d != output) {
        if !others.contains(&device) {
            others.push(device);
        }
    }
    let copies: Vec<String> = others
        .iter()
        .map(|device| {
            format!(
                "{device:?} {:.2} GB/s",
                rate(bytes, copy(bytes, device, output))
            )
        })
        .collect();
    let copies = match copies.is_empty() {
        true => "none (every replica on the output device)".to_string(),
        false => copies.join(", "),
    };
    println!(
        "reduce {:.1} MB of gradients in {:.3} ms: {reduce:.2} GB/s; copies to the output device: {copies}",
        summed as f64 / 1e6,
        profile.combine.as_secs_f64() * 1e3,
    );
}

/// Bytes per second in GB/s.
fn rate(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9
}

/// The median of five copies of `bytes` from `from` to `to`, each waited for.
fn copy(bytes: usize, from: &Device, to: &Device) -> Duration {
    let tensor = Tensor::<1>::ones([bytes / size_of::<f32>()], from);
    from.sync().expect("the device runs");
    let times = (0..5)
        .map(|_| {
            let start = Instant::now();
            let moved = tensor.clone().to_device(to);
            to.sync().expect("the device runs");
            drop(moved);
            start.elapsed()
        })
        .collect();
    median(times)
}
