//! Worker threads that cannot be started give a typed error, not a panic.
//!
//! Alone in its own test binary: on Linux it lowers the process's address-space limit so that
//! no new thread stack fits, then restores it. Elsewhere there is no such limit to lower
//! (macOS does not enforce `RLIMIT_AS`, Windows has none, and neither has `/proc`), and only
//! the error's own test runs.

use burn_dataparallel::DataParallelError;

/// What a failed thread start becomes, on every platform: the operating system's reason
/// behind the crate's own sentence.
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

    fn address_space_limit() -> libc::rlimit {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) }, 0);
        limit
    }

    fn virtual_memory_bytes() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    }

    #[test]
    fn workers_that_cannot_start_are_an_error() {
        let original = address_space_limit();
        let tight = libc::rlimit {
            rlim_cur: virtual_memory_bytes() + (1 << 20),
            rlim_max: original.rlim_max,
        };
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &tight) }, 0);
        let result = DataParallel::<Flex, Relu>::new(Relu::new(), vec![Default::default(); 16]);
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
