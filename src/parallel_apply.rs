//! Running the replicas at the same time on persistent worker threads, one *lane* per entry
//! of the device list.
//!
//! Burn keeps per-thread state (the pending updates of a `RunningState`, which batch norm's
//! running statistics are), which fresh threads every step would leak and leave
//! unsynchronised, so the replica of entry `i` always runs on the same OS thread.
//!
//! Burn 0.22.1's autodiff loses a step now and then when a thread records into a graph that
//! another thread is merging away (each parameter starts a graph of its own, and an
//! operation on tensors of two graphs merges them; `upstream/autodiff_graph_race.rs`
//! reproduces it without this crate). So the replicas run at once only where their
//! operations cannot merge graphs while they record, else one after the other:
//! - a forward's replicas share the module's parameters: `step.rs` first merges every
//!   parameter's graph into one (`replicate::merge_graphs`), and the input must carry no
//!   gradients ([`Scatter::carries_gradients`](crate::Scatter::carries_gradients)) and the
//!   forward capture nothing;
//! - burn-train's replicas have parameters of their own (forked): their input must carry no
//!   gradients.
//!
//! On GPUs the launches are asynchronous, so the devices' work overlaps either way; what
//! runs in turn is the host's recording of the operations.
//!
//! Every job queues its work on the CubeCL stream of the thread that hands it over
//! ([`StreamId::executes`], as Burn's Fusion does for its queues): the lanes are separate
//! threads for Burn's per-thread state, never separate streams. CubeCL 0.11 still lets a
//! stream read a buffer another stream wrote after their last wait (a parameter the optimizer
//! updated in place, an input written before the hand-off): `upstream/cross_stream.rs`
//! (`late`) reproduces it. Devices keep streams of their own, so distinct devices still run
//! at the same time; replicas that share a GPU take turns, since their operations would
//! interleave in that one stream, and under Fusion every step would fuse and compile new
//! blocks (`benches/RESULTS.md` has what it cost). Replicas sharing a CPU backend (Flex,
//! NdArray), which runs operations as they are recorded, still record at once.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};

use burn::tensor::{Device, StreamId};

use crate::devices::runs_as_recorded;
use crate::error::{BoxError, DataParallelError};

/// A job for a lane; the lane catches its panics.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// Where the jobs of one [`Workers::apply`] call leave their results.
type Results<O> = Arc<Mutex<Vec<Option<Result<O, Failure>>>>>;

thread_local! {
    static IN_REPLICA: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is one of the replicas' lanes: a forward of a wrapper started
/// there (a wrapper inside a replica) runs its module directly.
pub(crate) fn in_replica() -> bool {
    IN_REPLICA.with(Cell::get)
}

/// The lanes of every entry of a device list.
#[derive(Debug)]
pub(crate) struct Workers {
    lanes: Vec<Mutex<Sender<Job>>>,
}

/// Starts the lane of entry `replica`.
fn start(replica: usize) -> std::io::Result<Sender<Job>> {
    let (jobs, queue) = channel::<Job>();
    std::thread::Builder::new()
        .name(format!("dataparallel-{replica}"))
        .spawn(move || {
            IN_REPLICA.with(|flag| flag.set(true));
            for job in queue {
                let _ = catch_unwind(AssertUnwindSafe(job));
            }
        })?;
    Ok(jobs)
}

impl Workers {
    /// Starts one lane per entry of the device list.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::WorkerSpawn`] when a thread cannot be started.
    pub(crate) fn new(entries: usize) -> Result<Self, DataParallelError> {
        let lanes = (0..entries)
            .map(|replica| {
                start(replica)
                    .map(Mutex::new)
                    .map_err(|error| DataParallelError::WorkerSpawn {
                        message: error.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { lanes })
    }

    /// Runs `f(replica, input)` for every job, job `j` on the lane of entry `jobs[j].0`,
    /// the jobs of round 0 at once, then those of round 1, and so on (`rounds[j]` is job
    /// `j`'s: [`rounds`]), and returns the results in job order.
    ///
    /// Every job has run to completion (or to its panic) when this returns.
    pub(crate) fn apply<M, I, O, F>(
        &self,
        jobs: Vec<(usize, M, I)>,
        rounds: &[usize],
        f: &F,
    ) -> Vec<Result<O, Failure>>
    where
        M: Send,
        I: Send,
        O: Send,
        F: Fn(&M, I) -> Result<O, BoxError> + Sync,
    {
        let last = rounds.iter().copied().max().unwrap_or(0);
        if last == 0 {
            return self.at_once(jobs, f);
        }
        let mut results: Vec<_> = (0..jobs.len()).map(|_| None).collect();
        let mut jobs: Vec<_> = jobs.into_iter().map(Some).collect();
        for round in 0..=last {
            let indices: Vec<usize> = (0..jobs.len()).filter(|&j| rounds[j] == round).collect();
            let batch = (indices.iter()).filter_map(|&j| jobs[j].take()).collect();
            for (j, result) in indices.into_iter().zip(self.at_once(batch, f)) {
                results[j] = Some(result);
            }
        }
        (results.into_iter())
            .map(|result| result.unwrap_or(Err(Failure::Lost)))
            .collect()
    }

    /// Runs `f(replica, input)` for every job at once, job `j` on the lane of entry
    /// `jobs[j].0`, and returns the results in job order.
    fn at_once<M, I, O, F>(&self, jobs: Vec<(usize, M, I)>, f: &F) -> Vec<Result<O, Failure>>
    where
        M: Send,
        I: Send,
        O: Send,
        F: Fn(&M, I) -> Result<O, BoxError> + Sync,
    {
        let results: Results<O> = Arc::new(Mutex::new((0..jobs.len()).map(|_| None).collect()));
        // Every replica's work queues on this thread's stream (module docs).
        let stream = StreamId::current();
        let outstanding: Outstanding = Arc::new((Mutex::new(0), Condvar::new()));
        // Waits for every job, also if this thread unwinds while queueing them.
        let every_job = Wait(outstanding.clone());
        for (index, (entry, replica, input)) in jobs.into_iter().enumerate() {
            *outstanding.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            let results = results.clone();
            let done = CountDown(outstanding.clone());
            let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                // Dropped last: everything the job borrows is released before it counts.
                let _done = done;
                stream.executes(|| {
                    let result = run(&replica, input, f);
                    drop(replica);
                    results.lock().unwrap_or_else(|e| e.into_inner())[index] = Some(result);
                });
            });
            // SAFETY: the job borrows `f` and values of this call only, and this call does not
            // return before every job's `CountDown` has been dropped (`every_job` above, also
            // on unwinding), which happens after the job has run, or when it is dropped unrun.
            let job: Job = unsafe { std::mem::transmute(job) };
            let lane = self.lanes[entry].lock().unwrap_or_else(|e| e.into_inner());
            if let Err(returned) = lane.send(job) {
                // The lane's thread is gone (it never exits while the lane exists): run the
                // job here rather than lose it.
                drop(lane);
                (returned.0)();
            }
        }
        drop(every_job);
        let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
        results
            .iter_mut()
            .map(|result| result.take().unwrap_or(Err(Failure::Lost)))
            .collect()
    }
}

/// The round of each job of a step whose jobs run on `devices`, for [`Workers::apply`]:
/// where `at_once`, every job in round 0 except that the jobs of one GPU take turns (round
/// `r` holds its `r`-th; module docs); else each job a round of its own, one after the other.
pub(crate) fn rounds(devices: &[Device], at_once: bool) -> Vec<usize> {
    if !at_once {
        return (0..devices.len()).collect();
    }
    let turns: Vec<Option<&Device>> = (devices.iter())
        .map(|device| (!runs_as_recorded(device)).then_some(device))
        .collect();
    turn_rounds(&turns)
}

/// Round `r` holds the `r`-th job of every device that takes turns (`Some`); jobs of
/// devices that need none (`None`) are all in round 0.
fn turn_rounds<T: PartialEq>(devices: &[Option<T>]) -> Vec<usize> {
    (0..devices.len())
        .map(|j| match &devices[j] {
            None => 0,
            Some(_) => devices[..j].iter().filter(|d| **d == devices[j]).count(),
        })
        .collect()
}

/// The number of jobs of one [`Workers::apply`] call still outstanding.
type Outstanding = Arc<(Mutex<usize>, Condvar)>;

/// Held by one job: counts it done when dropped, whether the job ran or was dropped unrun.
struct CountDown(Outstanding);

impl Drop for CountDown {
    fn drop(&mut self) {
        let (count, changed) = &*self.0;
        *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        changed.notify_all();
    }
}

/// Waits, when dropped, until no job is outstanding.
struct Wait(Outstanding);

impl Drop for Wait {
    fn drop(&mut self) {
        let (count, changed) = &*self.0;
        let mut count = count.lock().unwrap_or_else(|e| e.into_inner());
        while *count > 0 {
            count = changed.wait(count).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Why one replica produced no output.
pub(crate) enum Failure {
    /// The forward panicked with this payload.
    Panicked(Box<dyn std::any::Any + Send>),
    /// The forward returned this error.
    Failed(BoxError),
    /// The job never ran.
    Lost,
}

impl Failure {
    /// The typed error for this failure of the replica of entry `replica` on `device`.
    pub(crate) fn into_error(self, replica: usize, device: String) -> DataParallelError {
        match self {
            Failure::Panicked(payload) => {
                DataParallelError::replica_panicked(replica, device, payload)
            }
            Failure::Failed(source) => DataParallelError::ReplicaFailed {
                replica,
                device,
                source,
            },
            Failure::Lost => DataParallelError::ReplicaPanicked {
                replica,
                device,
                message: "the replica's worker thread did not run it".into(),
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn each_device_s_jobs_are_rounds_apart() {
        let rounds_of = |keys: &[Option<u8>]| turn_rounds(keys);
        assert_eq!(
            rounds_of(&[Some(0), Some(0), Some(1), Some(1), Some(0)]),
            [0, 1, 0, 1, 2]
        );
        assert_eq!(rounds_of(&[Some(0), Some(1), Some(2)]), [0, 0, 0]);
        assert_eq!(
            rounds_of(&[None, None, Some(0), None, Some(0)]),
            [0, 0, 0, 0, 1]
        );
        assert_eq!(rounds_of(&[]), [] as [usize; 0]);
    }

    /// In turn, a round each; replicas sharing the CPU, all at once.
    #[cfg(feature = "flex")]
    #[test]
    fn cpu_replicas_need_no_turns() {
        let cpu = vec![Device::flex(); 3];
        assert_eq!(rounds(&cpu, false), [0, 1, 2]);
        assert_eq!(rounds(&cpu, true), [0, 0, 0]);
    }

    /// Jobs of different rounds never overlap; the results come back in job order.
    #[test]
    fn rounds_run_one_after_the_other() {
        let rounds = [0, 1, 0, 1];
        let workers = Workers::new(rounds.len()).unwrap();
        let jobs = (0..rounds.len()).map(|j| (j, (), j)).collect();
        let spans = Mutex::new(Vec::new());
        let f = |_: &(), j: usize| {
            let start = Instant::now();
            std::thread::sleep(Duration::from_millis(20));
            spans.lock().unwrap().push((j, start, Instant::now()));
            Ok(j * 10)
        };
        let results = workers.apply(jobs, &rounds, &f);
        let values: Vec<usize> = results.into_iter().map(|r| r.ok().unwrap()).collect();
        assert_eq!(values, [0, 10, 20, 30]);
        let spans = spans.into_inner().unwrap();
        for (i, (j, start, end)) in spans.iter().enumerate() {
            for (k, other_start, other_end) in &spans[i + 1..] {
                if rounds[*j] != rounds[*k] {
                    assert!(
                        end <= other_start || other_end <= start,
                        "jobs {j} and {k} of different rounds overlapped"
                    );
                }
            }
        }
    }
}
