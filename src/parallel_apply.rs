//! Running the replicas at the same time on persistent per-device worker threads.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::{BoxError, DataParallelError};

/// One long-lived worker thread per device slot.
///
/// Threads are created once and reused by every forward: Burn keeps per-thread state (the
/// pending updates of `RunningState`, CubeCL's per-thread streams), which fresh threads would
/// leak and leave unsynchronised. Slot `i` always runs on the same OS thread.
#[derive(Debug)]
pub(crate) struct Workers {
    pool: ThreadPool,
}

impl Workers {
    /// Starts `slots` worker threads.
    pub(crate) fn new(slots: usize) -> Result<Self, DataParallelError> {
        let pool = ThreadPoolBuilder::new()
            .num_threads(slots)
            .thread_name(|slot| format!("dataparallel-{slot}"))
            .build()?;
        Ok(Self { pool })
    }

    /// Number of worker threads.
    pub(crate) fn slots(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f(replica, input)` for every job, job `j` on the worker of slot `jobs[j].0`, all at
    /// once, and returns the results in job order.
    ///
    /// Every job runs to completion (or to its panic) before this returns.
    pub(crate) fn apply<M, I, O, F>(
        &self,
        jobs: Vec<(usize, M, I)>,
        f: &F,
    ) -> Vec<Result<O, Failure>>
    where
        M: Send,
        I: Send,
        O: Send,
        F: Fn(&M, I) -> Result<O, BoxError> + Sync,
    {
        let mut by_slot: Vec<Mutex<Option<(usize, M, I)>>> =
            (0..self.slots()).map(|_| Mutex::new(None)).collect();
        for (job, (slot, replica, input)) in jobs.into_iter().enumerate() {
            *by_slot[slot].get_mut().unwrap_or_else(|e| e.into_inner()) =
                Some((job, replica, input));
        }
        let mut done: Vec<(usize, Result<O, Failure>)> = self
            .pool
            .broadcast(|context| {
                let taken = by_slot[context.index()]
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                taken.map(|(job, replica, input)| (job, run(&replica, input, f)))
            })
            .into_iter()
            .flatten()
            .collect();
        done.sort_by_key(|(job, _)| *job);
        done.into_iter().map(|(_, result)| result).collect()
    }
}

/// A job for one worker slot that runs without the caller waiting for it.
pub(crate) type Detached = Box<dyn FnOnce() + Send>;

/// Runs detached jobs on worker slots; see [`Workers::spawn_each`].
pub(crate) type Spawner = std::sync::Arc<dyn Fn(Vec<(usize, Detached)>) + Send + Sync>;

impl Workers {
    /// Starts every job on the worker of its slot and returns at once; each job reports its
    /// own completion (the caller waits on what the jobs send, not on the jobs).
    ///
    /// Used by the per-replica backward: a replica's backward ends with Burn's graph cleanup,
    /// which waits for the calling thread's own backward to finish, so the calling thread must
    /// be able to go on as soon as the replica's gradients are out.
    pub(crate) fn spawn_each(&self, jobs: Vec<(usize, Detached)>) {
        let by_slot: Vec<Mutex<Option<Detached>>> =
            (0..self.slots()).map(|_| Mutex::new(None)).collect();
        for (slot, job) in jobs {
            *by_slot[slot].lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        }
        self.pool.spawn_broadcast(move |context| {
            let job = by_slot[context.index()]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(job) = job {
                job();
            }
        });
    }
}

/// Why one replica produced no output.
pub(crate) enum Failure {
    /// The forward panicked with this payload.
    Panicked(Box<dyn std::any::Any + Send>),
    /// The forward returned this error.
    Failed(BoxError),
}

impl Failure {
    /// The typed error for this failure of the replica in `slot` on `device`.
    pub(crate) fn into_error(self, slot: usize, device: String) -> DataParallelError {
        match self {
            Failure::Panicked(payload) => {
                DataParallelError::replica_panicked(slot, device, payload)
            }
            Failure::Failed(source) => DataParallelError::ReplicaFailed {
                replica: slot,
                device,
                source,
            },
        }
    }
}

/// Runs one replica's forward on the current thread, catching a panic.
pub(crate) fn run<M, I, O, F>(replica: &M, input: I, f: &F) -> Result<O, Failure>
where
    F: Fn(&M, I) -> Result<O, BoxError>,
{
    match catch_unwind(AssertUnwindSafe(|| f(replica, input))) {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(error)) => Err(Failure::Failed(error)),
        Err(payload) => Err(Failure::Panicked(payload)),
    }
}
