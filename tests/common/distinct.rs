//! The generic tests on distinct devices without a GPU: CubeCL's `CubeBackend` on the wgpu
//! runtime, with the replicas cycling through [`wgpu_devices`]: by default
//! `WgpuDevice::DefaultDevice` and `WgpuDevice::Cpu`. Those are two Burn devices with a CubeCL
//! server each (over Mesa's lavapipe in CI, both on the one CPU adapter), between which Burn
//! 0.21 cannot copy, so the wrapper moves every tensor through host memory: parameters are
//! copied to the other device, running states kept per device and folded back, shards
//! scattered, outputs gathered and gradients reduced across devices, as on several GPUs.

use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, Once};

use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, WgpuRuntime};
use burn::tensor::backend::{Backend, Device, DeviceId};

use super::adapter::skip_without_wgpu;
use dataparallel_dev::wgpu_devices;

/// `CubeBackend` on wgpu: the replicas' backwards run at once, as on CUDA's `CubeBackend`.
pub type WgpuCubeAd = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;

/// Relative tolerance on lavapipe: f32 throughout (no TF32), but CubeCL's kernels sum in
/// another order than the CPU backends, over shards and the whole batch alike.
pub const WGPU_TOLERANCE: f32 = 1e-4;

thread_local! {
    /// The devices [`super::devices`] cycles through on this thread, when set.
    static PLAN: RefCell<Option<Vec<DeviceId>>> = const { RefCell::new(None) };
}

/// `n` devices from this thread's plan (entry `i` is the plan's `i` modulo its length), or
/// `None` without a plan.
pub(crate) fn planned<B: Backend>(n: usize) -> Option<Vec<B::Device>> {
    PLAN.with(|plan| {
        let plan = plan.borrow();
        let ids = plan.as_ref()?;
        Some(
            (0..n)
                .map(|i| B::Device::from_id(ids[i % ids.len()]))
                .collect(),
        )
    })
}

/// Whether this thread's tests put their replicas on distinct devices.
pub fn distinct_plan() -> bool {
    PLAN.with(|plan| plan.borrow().is_some())
}

/// Holds the wgpu tests of a process to one at a time: on two cores, lavapipe compiling
/// several tests' kernels at once makes single tests pass their watchdog, and the check of
/// [`on_distinct_wgpu_devices`] reads a process-wide count.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `test` must be skipped for want of a wgpu adapter. First keeps CubeCL's autotune
/// to its minimal level for this process: lavapipe compiles every candidate kernel with LLVM,
/// and the full level spends minutes per matmul shape tuning them.
pub fn skip_wgpu(test: &str) -> bool {
    static MINIMAL: Once = Once::new();
    MINIMAL.call_once(|| {
        if std::env::var_os("CUBECL_AUTOTUNE_LEVEL").is_none() {
            // SAFETY: called before any CubeCL use in this process (every wgpu test calls
            // this first, and the others wait for it here), while no other thread reads the
            // environment.
            unsafe { std::env::set_var("CUBECL_AUTOTUNE_LEVEL", "minimal") };
        }
    });
    skip_without_wgpu(test)
}

/// Runs a generic test body with its replicas on distinct wgpu devices ([`wgpu_devices`],
/// through [`super::devices`]), under the tests' watchdog, one such test at a time, and
/// fails it unless some bytes really crossed devices while it ran (the crate's
/// [`bytes_moved`](burn_dataparallel::bytes_moved)): a test that silently kept every replica
/// on one device would otherwise pass here without checking anything new. `moves_nothing`
/// (the reason) skips that check for a test whose replicas share one device by design.
pub fn on_distinct_wgpu_devices<T: Send + 'static>(
    name: &'static str,
    moves_nothing: Option<&str>,
    body: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    if skip_wgpu(name) {
        return None;
    }
    let _one = one_at_a_time();
    let before = burn_dataparallel::bytes_moved();
    // Lavapipe compiles each new kernel with LLVM on the CPU: a test meeting many new
    // shapes takes over a minute on two cores.
    let value = super::within_for(name, 300, move || {
        super::set_tolerance(WGPU_TOLERANCE);
        PLAN.with(|plan| {
            *plan.borrow_mut() = Some(wgpu_devices().iter().map(Device::to_id).collect())
        });
        body()
    });
    let moved = burn_dataparallel::bytes_moved() - before;
    if let Some(reason) = moves_nothing {
        assert_eq!(
            moved, 0,
            "{name}: bytes crossed devices, but the test says: {reason}"
        );
        return Some(value);
    }
    assert!(
        moved > 0,
        "{name}: no bytes crossed between the devices {:?}: the distinct-device path did not run",
        wgpu_devices()
    );
    Some(value)
}
