//! CPU time of the calling thread or of the whole process; shared by the benches, which
//! include this file by path.

use std::time::Duration;

/// CPU time the calling thread has used, where the platform tells (Unix).
pub fn thread_cpu() -> Option<Duration> {
    #[cfg(unix)]
    {
        cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
    }
    #[cfg(not(unix))]
    None
}

/// CPU time the whole process has used (all its threads, the GPU driver's included), where
/// the platform tells (Unix).
pub fn process_cpu() -> Option<Duration> {
    #[cfg(unix)]
    {
        cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
    }
    #[cfg(not(unix))]
    None
}

/// The time of CPU clock `clock`.
#[cfg(unix)]
fn cpu_clock(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write.
    let ok = unsafe { libc::clock_gettime(clock, &mut ts) } == 0;
    ok.then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}
