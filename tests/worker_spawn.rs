//! The wrapper's threads: worker threads that cannot be started give a typed error, not a
//! panic, and gradient accumulation over many forwards leaves no thread behind.
//!
//! In a test binary of its own, its tests one at a time: on Linux one lowers the process's
//! address-space limit so that no new thread stack fits, and one counts the process's threads
//! (`/proc/self/status`). Elsewhere there is no such limit to lower (macOS does not enforce
//! `RLIMIT_AS`, Windows has none) and no `/proc`: the error's own test and the accumulation's
//! gradients still run there, without the thread count.

mod common;

use std::sync::Mutex;

use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Distribution, Tensor};
use burn_dataparallel::{DataParallel, DataParallelError};

/// Held by each test: none starts threads while another counts them or limits them.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The number after `field` (`Threads:`, `VmSize:`) in `/proc/self/status`, on Linux.
fn status(field: &str) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = field;
        None
    }
}

/// The process's thread count, where the platform tells it.
fn threads() -> Option<usize> {
    status("Threads:").map(|n| n as usize)
}

/// Waits up to ten seconds for the thread count to fall to `limit`; the count then.
fn settle(limit: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = threads().unwrap_or(0);
        if now <= limit || std::time::Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Three steps of 64 forwards through three replicas before each backward: the gradients are
/// the bare model's, and after each step the process has the threads it had before the
/// wrapper was made plus its three lanes, one per entry of the device list.
#[test]
fn accumulation_leaves_no_thread_behind() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Under the tests' watchdog: a backward that never returns fails in bounded time (its
    // thread is counted in the baseline, taken inside the body).
    common::within("accumulation_leaves_no_thread_behind", accumulation_steps);
}

fn accumulation_steps() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    let model: Linear<B> = LinearConfig::new(4, 2).init(&device);
    let input = || Tensor::<B, 2>::random([7, 4], Distribution::Normal(0.0, 1.0), &device);
    // A bare step first: whatever the backend starts for itself is there before the count.
    let _ = model.forward(input()).sum().backward();
    let before = threads();
    let dp = DataParallel::new(model.clone(), vec![device; 3]).unwrap();
    for step in 0..3 {
        let mut wrapped = Tensor::<B, 1>::zeros([1], &device);
        let mut bare = Tensor::<B, 1>::zeros([1], &device);
        for _ in 0..64 {
            let x = input();
            let y = dp.forward_with(x.clone(), |m, x| m.forward(x));
            wrapped = wrapped + y.powi_scalar(2).sum();
            bare = bare + model.forward(x).powi_scalar(2).sum();
        }
        let (grads, expected) = (wrapped.backward(), bare.backward());
        let got = model.weight.val().grad(&grads).expect("a gradient");
        let want = model.weight.val().grad(&expected).expect("a gradient");
        let scale = want.clone().abs().max().into_scalar() + 1.0;
        let difference = (got - want).abs().max().into_scalar();
        assert!(
            difference <= 1e-4 * scale,
            "step {step}: gradients differ by {difference}"
        );
        if let Some(before) = before {
            let limit = before + 3;
            let now = settle(limit);
            assert!(
                now <= limit,
                "step {step}: {now} threads, {before} before the wrapper and its 3 lanes"
            );
        }
    }
}

#[test]
fn worker_spawn_error_says_what_failed() {
    let error = DataParallelError::WorkerSpawn {
        message: "Resource temporarily unavailable".into(),
    };
    let text = error.to_string();
    assert!(text.starts_with("the replica worker threads could not be started"));
    assert!(text.contains("Resource temporarily unavailable"));
}

#[cfg(target_os = "linux")]
mod linux {
    use burn::backend::Flex;
    use burn::nn::Relu;
    use burn_dataparallel::{DataParallel, DataParallelError};

    use super::{ONE_AT_A_TIME, status};

    fn address_space_limit() -> libc::rlimit {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) }, 0);
        limit
    }

    fn virtual_memory_bytes() -> u64 {
        status("VmSize:").expect("VmSize in /proc/self/status") * 1024
    }

    #[test]
    fn workers_that_cannot_start_are_an_error() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let original = address_space_limit();
        let tight = libc::rlimit {
            rlim_cur: virtual_memory_bytes() + (1 << 20),
            rlim_max: original.rlim_max,
        };
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &tight) }, 0);
        // More lanes than glibc keeps stacks of ended threads for (40 MiB): some need new
        // memory, whatever the other test left behind.
        let result = DataParallel::<Flex, Relu>::new(Relu::new(), vec![Default::default(); 256]);
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &original) }, 0);

        match result {
            Err(error @ DataParallelError::WorkerSpawn { .. }) => {
                assert!(
                    error
                        .to_string()
                        .starts_with("the replica worker threads could not be started")
                );
            }
            other => panic!("expected WorkerSpawn, got {other:?}"),
        }
        // With the limit restored, the same wrapper starts.
        assert!(DataParallel::<Flex, Relu>::new(Relu::new(), vec![Default::default(); 16]).is_ok());
    }
}
