//! A replica's backward that really hangs: the caller's backward ends after the configured
//! bound with a panic saying where that backward stands, and without a bound it would wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorPrimitive};
use burn_dataparallel::DataParallelConfig;

use crate::captured::panic_text;
use crate::common::*;

type B = Autodiff<Flex>;

/// A gate the identity's backward waits at until it opens.
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    reached: AtomicBool,
}

/// The gate of this file's one test: a static, as the forward captures nothing.
static GATE: Gate = Gate {
    open: Mutex::new(false),
    opened: Condvar::new(),
    reached: AtomicBool::new(false),
};

impl Gate {
    fn wait(&self) {
        self.reached.store(true, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// The identity, whose backward waits at the gate, then passes the gradient on.
#[derive(Debug)]
struct Held;

impl Backward<Flex, 1> for Held {
    type State = GateRef;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        ops.state.0.wait();
        let grad = grads.consume::<Flex>(&ops.node);
        if let [Some(parent)] = ops.parents {
            grads.register::<Flex>(parent.id, grad);
        }
    }
}

/// The gate, as the backward step's state (which Burn wants `Debug`).
#[derive(Clone, Copy)]
struct GateRef(&'static Gate);

impl std::fmt::Debug for GateRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GateRef")
    }
}

fn held(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let x = x.into_primitive().tensor();
    let value = x.primitive.clone();
    let out = match Held
        .prepare::<NoCheckpointing>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(GateRef(&GATE), value),
        OpsKind::UnTracked(prep) => prep.finish(value),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Three replicas, each output through the held identity: the replicas' backwards stop at the
/// gate, and the caller's backward panics after the 1 s bound, naming the running backward.
/// Opening the gate afterwards lets the replicas' threads finish.
#[test]
fn a_hanging_replica_backward_ends_the_callers_backward() {
    within(
        "a_hanging_replica_backward_ends_the_callers_backward",
        || {
            let device = Default::default();
            let dp = DataParallelConfig::new()
                .with_backward_timeout_secs(Some(1))
                .init(Mlp::<B>::new(8, 16, 4, &device), vec![device; 3])
                .unwrap();
            let gate = &GATE;
            let output =
                dp.forward_with(random::<B, 2>([7, 8], &device), |m, x| held(m.forward(x)));
            let started = Instant::now();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                output.sum().backward();
            }));
            let waited = started.elapsed();
            gate.open();
            assert!(
                gate.reached.load(Ordering::SeqCst),
                "a replica's backward reached the gate"
            );
            let payload = result.expect_err("the caller's backward gives up");
            let message = panic_text(payload.as_ref());
            assert!(message.contains("without finishing"), "message: {message}");
            assert!(
                message.contains("backward_timeout_secs"),
                "message: {message}"
            );
            assert!(
                waited >= Duration::from_secs(1) && waited < Duration::from_secs(20),
                "gave up after {waited:?}, with a bound of 1 s"
            );
        },
    );
}

/// The tests' watchdog gives a body that keeps its process computing more time than the
/// limit (a fresh CubeCL cache compiling), and fails one that waits for ever in bounded time.
#[test]
fn the_watchdog_tells_computing_from_hanging() {
    let spin = || {
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_secs(3) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        x
    };
    let started = Instant::now();
    within_for("computing", 1, spin);
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "ran to its end"
    );

    let started = Instant::now();
    let hung = std::panic::catch_unwind(|| {
        within_for("hanging", 1, || std::thread::sleep(Duration::from_secs(60)))
    });
    let message = panic_text(hung.expect_err("fails").as_ref());
    assert!(message.contains("did not finish"), "message: {message}");
    // Idle: at the limit; while other tests compute beside it: at five times the limit.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
