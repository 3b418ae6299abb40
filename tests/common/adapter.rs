//! Whether CubeCL's wgpu runtime finds a GPU adapter here, for the tests that run on it.
//!
//! A machine with only the Rust toolchain has no Vulkan driver: those tests then say in one
//! line each that they were skipped and what to install, and pass. CI installs Mesa's lavapipe
//! (a Vulkan driver on the CPU) and sets `DATAPARALLEL_REQUIRE_WGPU=1`, under which a missing
//! adapter fails them instead.

use std::io::Write;
use std::sync::OnceLock;

use burn::backend::Wgpu;
use burn::backend::wgpu::WgpuDevice;
use burn::tensor::Tensor;

/// Whether a tiny tensor operation runs on the default wgpu device (probed once per process,
/// on a thread of its own: CubeCL panics there when it finds no adapter).
fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::thread::spawn(|| {
            let ones = Tensor::<Wgpu, 1>::ones([1], &WgpuDevice::DefaultDevice);
            ones.into_data().to_vec::<f32>().is_ok()
        })
        .join()
        .unwrap_or(false)
    })
}

/// Whether `test` must be skipped for want of a wgpu adapter; says so on stderr (past the test
/// harness's capture, so that it shows for a passing test too).
///
/// # Panics
///
/// Without an adapter when `DATAPARALLEL_REQUIRE_WGPU=1`.
pub fn skip_without_wgpu(test: &str) -> bool {
    if available() {
        return false;
    }
    let hint = "no Vulkan adapter for CubeCL's wgpu runtime; install Mesa's lavapipe \
                (Debian/Ubuntu: apt-get install mesa-vulkan-drivers libvulkan1)";
    if std::env::var("DATAPARALLEL_REQUIRE_WGPU").as_deref() == Ok("1") {
        panic!("{test}: {hint} (DATAPARALLEL_REQUIRE_WGPU=1)");
    }
    let _ = writeln!(std::io::stderr().lock(), "skipped {test}: {hint}");
    true
}
