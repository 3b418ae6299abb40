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

/// Live heap bytes after steps 100, 550 and 1000 of training a batch-norm model with
/// `replicas` replicas on fresh batches of ten sizes.
fn live_bytes_at_steps_100_550_and_1000(replicas: usize) -> [isize; 3] {
    type B = FlexAd;
    let device = Default::default();
    let mut dp = DataParallel::new(BnNet::<B>::new(0.0, &device), devices::<B>(replicas)).unwrap();
    let mut optim = SgdConfig::new().init();
    let mut live_at = Vec::new();
    for step in 0..1000 {
        let batch = 2 * replicas + step % 10;
        let (x, y) = (
            random::<B, 2>([batch, 8], &device),
            random::<B, 2>([batch, 4], &device),
        );
        let Mean(loss) = dp.forward_with((x, y), |m, (x, y)| {
            Mean((m.forward(x) - y).powi_scalar(2).mean())
        });
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = optim.step(0.01, dp, grads);
        if step == 99 || step == 549 || step == 999 {
            live_at.push(LIVE.load(Ordering::Relaxed));
        }
    }
    [live_at[0], live_at[1], live_at[2]]
}

/// The live-byte counter is process-wide: tests measuring it run one at a time.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn assert_no_growth(replicas: usize) {
    let _alone = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let [at_100, at_550, at_1000] = live_bytes_at_steps_100_550_and_1000(replicas);
    // A leak grows in both halves; a container that reaches its final capacity late (one
    // resize of a hash map of graphs or threads' queues, seen as up to 72 KiB once) grows in
    // one of them only.
    let growth = (at_550 - at_100).min(at_1000 - at_550);
    assert!(
        growth < 24 * 1024,
        "live heap grew by at least {growth} bytes in each half: step 100 {at_100}, \
         step 550 {at_550}, step 1000 {at_1000}"
    );
}

#[test]
fn a_thousand_steps_with_two_replicas_do_not_grow_memory() {
    assert_no_growth(2);
}

/// Four worker threads build autodiff graphs at once: without the single graph that
/// `replicate` prepares, Burn 0.21's graph locator orphaned graph state here (about 1 KiB per
/// step) while losing gradients.
#[test]
fn a_thousand_steps_with_four_replicas_do_not_grow_memory() {
    assert_no_growth(4);
}
