//! Resources do not grow with steps: one worker thread per entry of the device list, however
//! many forwards and backwards, gradient accumulation included. A process of its own, so that
//! no other test's threads are counted.

#[path = "common/mod.rs"]
mod common;

use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Distribution, Tensor};
use burn_dataparallel::{DataParallel, Mean};

/// The process's threads (Linux).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |tasks| tasks.count())
}

#[test]
#[cfg(target_os = "linux")]
fn threads_stay_one_per_device_entry_over_many_steps() {
    common::within(|| {
        let device = Device::flex().autodiff();
        let before = threads();
        let model: Linear = LinearConfig::new(8, 2).init(&device);
        let mut dp = DataParallel::new(model, common::flex(3)).unwrap();
        assert_eq!(threads(), before + 3, "one lane per entry");
        let mut optim = SgdConfig::new().init();
        let loss = |m: &Linear, x: Tensor<2>| Mean(m.forward(x).powi_scalar(2).mean());
        for step in 0..60 {
            let x = Tensor::<2>::random([7, 8], Distribution::Default, &device);
            // Every third step accumulates three forwards before one backward.
            let losses: Vec<Tensor<1>> = (0..1 + 2 * usize::from(step % 3 == 0))
                .map(|_| dp.forward_with(x.clone(), loss).0)
                .collect();
            let total = losses.into_iter().reduce(|a, b| a + b).unwrap();
            let grads = GradientsParams::from_grads(total.backward(), &dp);
            dp = optim.step(0.01, dp, grads);
            assert_eq!(threads(), before + 3, "step {step}");
        }
        drop(dp);
        // The lanes end with the last copy of the wrapper.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while threads() != before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(threads(), before, "after the wrapper is dropped");
    });
}
