//! A thousand training steps through the wrapper do not grow memory.
//!
//! Alone in its own test binary: a counting global allocator measures live heap bytes, which
//! is the CPU backend's device memory as well.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn_dataparallel::{DataParallel, Mean};
use common::*;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The floor of live heap bytes over steps 100–199, 500–599 and 900–999 of training a
/// batch-norm model with `replicas` replicas on fresh batches of ten sizes, `forwards`
/// forwards (their losses summed) before each backward.
///
/// One sample after a step varies by up to ~170 KiB between steps (worker threads free their
/// graphs and buffers on their own time), so a single sample per point cannot tell a leak from
/// that noise; the least value over a hundred steps is the floor the heap returns to, steady
/// within about 10 KiB over five runs here when nothing leaks.
fn live_floor_over_three_windows(replicas: usize, forwards: usize) -> [isize; 3] {
    type B = FlexAd;
    let device = Default::default();
    let mut dp = DataParallel::new(BnNet::<B>::new(0.0, &device), devices::<B>(replicas)).unwrap();
    let mut optim = SgdConfig::new().init();
    let mut floors = [isize::MAX; 3];
    for step in 0..1000 {
        let batch = 2 * replicas + step % 10;
        let (x, y) = (
            random::<B, 2>([batch, 8], &device),
            random::<B, 2>([batch, 4], &device),
        );
        let losses: Vec<_> = (0..forwards)
            .map(|_| {
                let Mean(loss) = dp.forward_with((x.clone(), y.clone()), |m, (x, y)| {
                    Mean((m.forward(x) - y).powi_scalar(2).mean())
                });
                loss
            })
            .collect();
        let loss = losses.into_iter().reduce(|a, b| a + b).expect("a forward");
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = optim.step(0.01, dp, grads);
        let window = match step {
            100..200 => 0,
            500..600 => 1,
            900..1000 => 2,
            _ => continue,
        };
        floors[window] = floors[window].min(LIVE.load(Ordering::Relaxed));
    }
    floors
}

/// The live-byte counter is process-wide: tests measuring it run one at a time.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn assert_no_growth(replicas: usize, forwards: usize) {
    let _alone = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let [early, middle, late] = live_floor_over_three_windows(replicas, forwards);
    // A leak raises the floor in both halves (a kibibyte a step is 400 KiB a half); a
    // container that reaches its final capacity late (one resize of a hash map of graphs or
    // threads' queues, seen as up to 72 KiB once) raises it in one of them only.
    let growth = (middle - early).min(late - middle);
    assert!(
        growth < 24 * 1024,
        "the live heap's floor grew by at least {growth} bytes in each half: steps 100-199 \
         {early}, steps 500-599 {middle}, steps 900-999 {late}"
    );
}

#[test]
fn a_thousand_steps_with_two_replicas_do_not_grow_memory() {
    assert_no_growth(2, 1);
}

/// Two forwards before every backward: the second forward's replica backwards run on the
/// lanes kept for a slot whose first lane is still occupied.
#[test]
fn a_thousand_steps_of_two_forwards_each_do_not_grow_memory() {
    assert_no_growth(2, 2);
}

/// Four worker threads build autodiff graphs at once: without the single graph that
/// `replicate` prepares, Burn 0.21's graph locator orphaned graph state here (about 1 KiB per
/// step) while losing gradients.
#[test]
fn a_thousand_steps_with_four_replicas_do_not_grow_memory() {
    assert_no_growth(4, 1);
}
