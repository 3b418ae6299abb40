//! The benches' median, their arguments, their lists of numbers from the environment and the
//! CUDA device's memory in use; included by path.

use std::time::Duration;

/// The median of `times` (the upper one of an even count).
///
/// # Panics
///
/// If `times` is empty.
pub fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// A comma-separated list of numbers from the environment variable `name`, if set.
///
/// # Panics
///
/// If the variable holds anything but such a list.
pub fn list_from_env(name: &str) -> Option<Vec<usize>> {
    let text = std::env::var(name).ok()?;
    let parsed: Result<Vec<usize>, _> = text.split(',').map(|n| n.trim().parse()).collect();
    Some(
        parsed.unwrap_or_else(|_| {
            panic!("{name} is a comma-separated list of numbers, not {text:?}")
        }),
    )
}

/// The command line's arguments that are not flags (`cargo bench` adds `--bench`).
pub fn positional_args() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect()
}

/// Bytes in use on the first CUDA device (CubeCL's memory pools), when it can tell.
#[cfg(feature = "cuda")]
#[allow(dead_code)] // not every bench that includes this file reads memory
pub fn cuda_memory() -> Option<u64> {
    use cubecl::Runtime;
    let client = cubecl::cuda::CudaRuntime::client(&Default::default());
    client.memory_usage().ok().map(|m| m.bytes_in_use)
}
