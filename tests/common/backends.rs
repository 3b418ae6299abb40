//! The backends every generic test runs on, the macro that instantiates the tests for each,
//! the watchdog that bounds them, and the devices their replicas go to.

use burn::tensor::backend::Backend;

/// The CPU backend every test runs on.
pub type FlexAd = burn::backend::Autodiff<burn::backend::Flex>;

/// The second CPU backend every test runs on.
pub type NdArrayAd = burn::backend::Autodiff<burn::backend::NdArray>;

/// The default CUDA backend (fusion on top of CubeCL).
#[cfg(feature = "cuda")]
pub type CudaAd = burn::backend::Autodiff<burn::backend::Cuda>;

/// CubeCL's CUDA backend without fusion, in half precision.
#[cfg(feature = "cuda")]
pub type CubeHalfAd = burn::backend::Autodiff<
    burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, burn::tensor::f16, i32, u8>,
>;

/// CubeCL's CUDA backend without fusion.
#[cfg(feature = "cuda")]
pub type CubeAd =
    burn::backend::Autodiff<burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>;

/// Instantiates generic test bodies for every backend: the two CPU backends always,
/// `CubeBackend` on wgpu with its replicas on distinct devices (with the `cubecl` feature, a
/// default), the CUDA backends with the `cuda` feature (f32 with and without fusion, f16
/// without).
///
/// `backend_tests! { name => body(args); }` defines `flex::name`, `ndarray::name`,
/// `wgpu_distinct::name` (replicas alternating between two wgpu devices, tensors moved
/// through host memory: [`on_distinct_wgpu_devices`]), `cuda_fusion::name`, `cuda_cube::name`
/// and `cuda_cube_half::name` (the wrapper refuses Burn 0.21's `Fusion` in f16,
/// `DataParallelError::FusionHalfPrecision`), each calling `body::<Backend>(args)`.
/// Attributes written before `name` apply to the Flex variant only.
///
/// `name => body(args), moves_nothing = "reason";` marks a test that moves nothing between
/// devices by design (one replica, a batch of one row, an error before the first transfer,
/// no wrapper at all): under `wgpu_distinct` it runs on the distinct devices' plan like the
/// others, and checks that nothing crossed devices instead of that something did.
///
/// `name => body(args), fusion_fails = "reason";` marks a known fault of Burn 0.21's Fusion
/// backend: `cuda_fusion::name` is ignored with that reason (listed as ignored in every run,
/// run with `--ignored`; `scripts/gpu-check.sh` runs them to see whether they still fail), the
/// other backends run it as usual.
///
/// Every body runs under [`within`]: a test that hangs fails after a bounded time.
#[macro_export]
macro_rules! backend_tests {
    // One CUDA backend's module: its tolerance is set on the test thread first.
    (@cuda $module:ident, $tolerance:ident, $backend:ident;
        $($name:ident => $body:ident ( $($arg:expr),* ) $([$reason:literal])?;)*) => {
        #[cfg(feature = "cuda")]
        mod $module {
            use super::*;
            $(#[test] $(#[ignore = $reason])? fn $name() {
                $crate::common::within(stringify!($name), || {
                    $crate::common::set_tolerance($crate::common::$tolerance);
                    $body::<$crate::common::$backend>($($arg),*)
                })
            })*
        }
    };
    ($($(#[$flex:meta])* $name:ident => $body:ident ( $($arg:expr),* )
        $(, fusion_fails = $reason:literal)? $(, moves_nothing = $nothing:literal)?;)*) => {
        mod flex {
            use super::*;
            $(#[test] $(#[$flex])* fn $name() {
                $crate::common::within(stringify!($name), || {
                    $body::<$crate::common::FlexAd>($($arg),*)
                })
            })*
        }
        mod ndarray {
            use super::*;
            $(#[test] fn $name() {
                $crate::common::within(stringify!($name), || {
                    $body::<$crate::common::NdArrayAd>($($arg),*)
                })
            })*
        }
        #[cfg(feature = "cubecl")]
        mod wgpu_distinct {
            use super::*;
            $(#[test] fn $name() {
                let moves_nothing: Option<&str> = None $(.or(Some($nothing)))?;
                let _ = $crate::common::on_distinct_wgpu_devices(
                    stringify!($name),
                    moves_nothing,
                    || $body::<$crate::common::WgpuCubeAd>($($arg),*),
                );
            })*
        }
        $crate::backend_tests!(@cuda cuda_fusion, TF32_TOLERANCE, CudaAd;
            $($name => $body($($arg),*) $([$reason])?;)*);
        $crate::backend_tests!(@cuda cuda_cube, TF32_TOLERANCE, CubeAd;
            $($name => $body($($arg),*);)*);
        $crate::backend_tests!(@cuda cuda_cube_half, HALF_TOLERANCE, CubeHalfAd;
            $($name => $body($($arg),*);)*);
    };
}

/// Runs `body` on a thread of its own and fails the test if it has not finished within
/// `DATAPARALLEL_TEST_TIMEOUT` seconds (120 by default): a hang becomes a failure naming the
/// test instead of a CI run that never ends. Panics of `body` come through unchanged.
///
/// A test still running at the limit while its process computes (CubeCL compiling kernels on
/// a fresh cache takes minutes, on threads of its own) gets more time, up to five times the
/// limit; one whose process sat idle (under a tenth of the time computing) since the watchdog
/// last looked fails at once as a hang. Either way it ends in bounded time, and the message
/// says which it was.
pub fn within<T: Send + 'static>(name: &str, body: impl FnOnce() -> T + Send + 'static) -> T {
    within_for(name, 120, body)
}

/// How often, at most, the watchdog of [`within`] looks at the process past the limit, and
/// the share of that time the process must have computed to count as computing, not hung.
const WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const BUSY_SHARE: f64 = 0.1;

/// The CPU time this process has used, user and system, where the platform tells.
fn process_cpu() -> Option<std::time::Duration> {
    #[cfg(unix)]
    {
        // SAFETY: `getrusage` fills the zeroed struct it is given and reads nothing else.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return None;
        }
        let time =
            |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        Some(time(usage.ru_utime) + time(usage.ru_stime))
    }
    #[cfg(not(unix))]
    None
}

/// [`within`], with `default` seconds where `DATAPARALLEL_TEST_TIMEOUT` is not set.
pub fn within_for<T: Send + 'static>(
    name: &str,
    default: u64,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let limit = std::env::var("DATAPARALLEL_TEST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
            let _ = sender.send(result);
        })
        .expect("a test thread");
    let started = std::time::Instant::now();
    let limit = std::time::Duration::from_secs(limit);
    let mut wait = limit;
    loop {
        let cpu = process_cpu();
        match receiver.recv_timeout(wait) {
            Ok(Ok(value)) => return value,
            Ok(Err(payload)) => std::panic::resume_unwind(payload),
            Err(_) => {}
        }
        let elapsed = started.elapsed();
        let used = (cpu.zip(process_cpu())).map(|(before, now)| now.saturating_sub(before));
        let computing = used.is_some_and(|used| used >= wait.mul_f64(BUSY_SHARE));
        if computing && elapsed < 5 * limit {
            wait = WATCH_INTERVAL.min(limit);
            continue;
        }
        let used = used.map_or("unknown".into(), |used| format!("{used:.1?}"));
        match computing {
            true => panic!(
                "{name} did not finish within {elapsed:.0?} although its process kept \
                 computing ({used} of CPU in the last {wait:?}): too slow, not hung (a fresh \
                 CubeCL cache compiles kernels for minutes; raise DATAPARALLEL_TEST_TIMEOUT)"
            ),
            false => panic!(
                "{name} did not finish within {elapsed:.0?}, its process idle ({used} of CPU \
                 in the last {wait:?}): it hangs"
            ),
        }
    }
}

/// The rounds a stress test runs: `rounds`, or a tenth of them (at least 20) with replicas on
/// distinct wgpu devices, where lavapipe moves every tensor through host memory and each
/// round costs tens of milliseconds.
pub fn stress_rounds(rounds: usize) -> usize {
    #[cfg(feature = "cubecl")]
    if super::distinct::distinct_plan() {
        return (rounds / 10).max(20);
    }
    rounds
}

/// `n` entries of the backend's default device: several replicas on one device exercise every
/// code path of the pipeline.
///
/// With `DATAPARALLEL_TEST_DEVICES=distinct`, replica `i` goes to device `i` modulo the
/// backend's device count instead (the first is the default device), so that the same tests
/// run on several GPUs: outputs and gradients must still equal the single-device run.
///
/// Tests under [`on_distinct_wgpu_devices`] get that thread's plan of distinct devices instead.
pub fn devices<B: Backend>(n: usize) -> Vec<B::Device> {
    #[cfg(feature = "cubecl")]
    if let Some(devices) = super::distinct::planned::<B>(n) {
        return devices;
    }
    match std::env::var("DATAPARALLEL_TEST_DEVICES").as_deref() {
        Ok("distinct") => dataparallel_dev::spread::<B>(n),
        _ => vec![B::Device::default(); n],
    }
}
