//! Running the replicas at the same time on persistent per-device worker threads.
//!
//! Every device slot (an entry of the device list) has one *lane*: a long-lived thread that
//! runs that slot's replica forwards, one after the other, and, when it is idle, the
//! replica's backward. Burn keeps per-thread state (the pending updates of `RunningState`),
//! which fresh threads would leak and leave unsynchronised, so slot `i`'s forwards always run
//! on the same OS thread.
//!
//! Every job runs on the CubeCL stream of the thread that hands it over
//! ([`StreamId::executes`], as Burn's `Fusion` does for its queues): the lanes are separate
//! threads for Burn's per-thread state, never separate streams, because CubeCL 0.10 does not
//! protect memory one stream reads from another in every case (`upstream/cross_stream/`
//! reproduces it). Replicas on distinct devices still run at the
//! same time, each device's stream being its own.
//!
//! A replica's backward ends with Burn's graph cleanup, which waits for every autodiff graph,
//! the caller's included; while the caller's backward goes on, the lane that ran it stays
//! occupied. A second backward for the same slot within one caller's backward (several
//! forwards before one backward, as in gradient accumulation, or the wrapper applied to its
//! own output) then runs on a *spare* thread of its own, which ends with that backward. The
//! wrapper keeps one thread per entry of its device list, and no more: after a backward, the
//! process has the threads it had before, however many forwards it took.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use burn::tensor::StreamId;

use crate::backend::ReplicaRuntime;
use crate::backend::comm::ReduceBucket;
use crate::balance::Measured;
use crate::error::{BoxError, DataParallelError};
use crate::profile::Sink;

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

/// The lanes of every device slot.
#[derive(Debug)]
pub(crate) struct Workers {
    slots: Vec<Mutex<Lane>>,
}

#[derive(Debug)]
struct Lane {
    jobs: Sender<Job>,
    /// Jobs queued or running.
    pending: Arc<AtomicUsize>,
}

impl Lane {
    fn start(slot: usize) -> std::io::Result<Self> {
        let (jobs, queue) = channel::<Job>();
        let pending = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name(format!("dataparallel-{slot}"))
            .spawn(move || {
                IN_REPLICA.with(|flag| flag.set(true));
                for job in queue {
                    let _ = catch_unwind(AssertUnwindSafe(job));
                }
            })?;
        Ok(Self { jobs, pending })
    }

    /// Queues `job`, whose place in `pending` the caller has already taken; `job` gives it
    /// back when it is done (it holds the lane's [`Busy`]).
    fn send(&self, job: Job) {
        if let Err(returned) = self.jobs.send(job) {
            // The lane's thread is gone (it never exits while the lane exists): run the job
            // here rather than lose it.
            (returned.0)();
        }
    }

    /// Takes a place in the lane's queue, given back when the returned guard is dropped.
    fn busy(&self) -> Busy {
        self.pending.fetch_add(1, Ordering::SeqCst);
        Busy(self.pending.clone())
    }

    /// Queues `job` behind the lane's work, holding a place in its queue while it runs.
    fn queue(&self, job: Job) {
        let busy = self.busy();
        self.send(Box::new(move || {
            let _busy = busy;
            job();
        }));
    }
}

/// Runs `job` on a thread of its own that ends with it, for a slot whose lane is occupied;
/// gives `job` back when no thread can be started.
fn spare(slot: usize, job: Job) -> Result<(), Job> {
    let (sender, receiver) = channel::<Job>();
    let started = std::thread::Builder::new()
        .name(format!("dataparallel-{slot}-spare"))
        .spawn(move || {
            IN_REPLICA.with(|flag| flag.set(true));
            if let Ok(job) = receiver.recv() {
                let _ = catch_unwind(AssertUnwindSafe(job));
            }
        });
    match started {
        Ok(_) => sender.send(job).map_err(|returned| returned.0),
        Err(_) => Err(job),
    }
}

/// A job's place in its lane's queue, given back when the job (run or not) is dropped: the
/// lane is idle as soon as its last job has released what it holds, before anyone waiting on
/// that job goes on.
struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Workers {
    /// Starts one lane per slot.
    pub(crate) fn new(slots: usize) -> Result<Self, DataParallelError> {
        let slots = (0..slots)
            .map(|slot| {
                Lane::start(slot)
                    .map(Mutex::new)
                    .map_err(|error| DataParallelError::WorkerSpawn {
                        message: error.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { slots })
    }

    /// Runs `f(replica, input)` for every job, job `j` on the first lane of slot `jobs[j].0`,
    /// all at once, and returns the results in job order.
    ///
    /// Every job has run to completion (or to its panic) when this returns.
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
        let results: Results<O> = Arc::new(Mutex::new((0..jobs.len()).map(|_| None).collect()));
        // Every replica's forward queues on this thread's stream (module docs).
        let stream = StreamId::current();
        let outstanding: Outstanding = Arc::new((Mutex::new(jobs.len()), Condvar::new()));
        {
            // Waits for every job even if this thread unwinds while queueing them.
            let _wait = Wait(outstanding.clone());
            for (index, (slot, replica, input)) in jobs.into_iter().enumerate() {
                let lane = self.slots[slot].lock().unwrap_or_else(|e| e.into_inner());
                let results = results.clone();
                let done = CountDown(outstanding.clone());
                let busy = lane.busy();
                let job: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
                    // Dropped last: everything the job borrows is released, and the lane is
                    // idle again, before it counts.
                    let _done = done;
                    let _busy = busy;
                    stream.executes(|| {
                        let result = run(&replica, input, f);
                        drop(replica);
                        results.lock().unwrap_or_else(|e| e.into_inner())[index] = Some(result);
                        drop(results);
                    });
                });
                // SAFETY: the job borrows `f` and values of this call only, and this call does
                // not return before every job's `CountDown` has been dropped (`Wait` above,
                // also on unwinding), which happens after the job has run, or when it is
                // dropped unrun.
                let job: Job = unsafe { std::mem::transmute(job) };
                lane.send(job);
            }
        }
        let mut results = results.lock().unwrap_or_else(|e| e.into_inner());
        results
            .iter_mut()
            .map(|result| result.take().unwrap_or(Err(Failure::Lost)))
            .collect()
    }

    /// Starts `job` on `slot`'s lane when it is idle, otherwise on a spare thread that ends
    /// with the job, and returns at once. The job queues its work on the calling thread's
    /// stream.
    pub(crate) fn spawn(&self, slot: usize, job: Job) {
        let stream = StreamId::current();
        let job: Job = Box::new(move || stream.executes(job));
        let lane = self.slots[slot].lock().unwrap_or_else(|e| e.into_inner());
        // Places are only taken under this lock, so an idle lane stays idle until `queue`.
        if lane.pending.load(Ordering::SeqCst) == 0 {
            return lane.queue(job);
        }
        drop(lane);
        if let Err(job) = spare(slot, job) {
            // No thread to be had: queue it behind the lane's work.
            self.slots[slot]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .queue(job);
        }
    }
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
            Failure::Lost => DataParallelError::ReplicaPanicked {
                replica: slot,
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

/// The workers and the step's profile, as the services the per-replica backward uses.
pub(crate) struct Runtime {
    pub(crate) workers: Arc<Workers>,
    pub(crate) sink: Option<Arc<Sink>>,
    /// The replicas' times, for the adaptive split.
    pub(crate) measured: Option<Arc<Measured>>,
}

impl ReplicaRuntime for Runtime {
    fn spawn(&self, slot: usize, job: Box<dyn FnOnce() + Send>) {
        self.workers.spawn(slot, job);
    }

    fn profiling(&self) -> bool {
        self.sink.is_some()
    }

    fn times_backwards(&self) -> bool {
        self.sink.is_some() || self.measured.is_some()
    }

    fn record_backward(&self, replica: usize, elapsed: Duration) {
        if let Some(sink) = &self.sink {
            sink.replica_backward(replica, elapsed);
        }
        if let Some(measured) = &self.measured {
            measured.add(replica, elapsed);
        }
    }

    fn record_transfer(&self, bytes: u64, elapsed: Duration) {
        if let Some(sink) = &self.sink {
            sink.reduced(bytes, elapsed);
        }
    }

    fn record_hub(&self, wait: Duration, reduce: Duration) {
        if let Some(sink) = &self.sink {
            let mut profile = sink.lock();
            profile.backward_wait += wait;
            profile.backward_reduce += reduce;
        }
    }

    fn record_bucket(&self, bucket: ReduceBucket) {
        if let Some(sink) = &self.sink {
            sink.lock().reduce_buckets.push(bucket);
        }
    }
}
