//! The benches' median and their lists of numbers from the environment; included by path.

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
