//! The Learner's progress, timed: samples per second over the epochs after the first.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::train::logger::TrainingProgressLogger;

use crate::learner::EPOCHS;

/// Times the training items as the Learner reports them: `(epoch, when, items so far)`.
#[derive(Clone, Default)]
pub struct Clock {
    marks: Arc<Mutex<Vec<(usize, Instant, usize)>>>,
    epoch: Arc<Mutex<(usize, bool)>>,
}

impl Clock {
    /// Items per second over every epoch after the first, from each epoch's first reported
    /// item to its last.
    pub fn samples_per_s(&self) -> f64 {
        let marks = self.marks.lock().unwrap();
        let (mut items, mut seconds) = (0usize, 0f64);
        for epoch in 1..EPOCHS {
            let of: Vec<_> = marks.iter().filter(|m| m.0 == epoch).collect();
            if let (Some(first), Some(last)) = (of.first(), of.last()) {
                items += last.2 - first.2;
                seconds += (last.1 - first.1).as_secs_f64();
            }
        }
        assert!(items > 0, "no timed epoch: more steps needed");
        items as f64 / seconds
    }
}

impl TrainingProgressLogger for Clock {
    fn start(&mut self, _: usize, _: usize, _: Option<usize>, _: Option<&str>) {}
    fn update_epoch(&mut self, _epoch: usize) {}
    fn start_split(&mut self, split: &str, _total_items: usize) {
        let mut epoch = self.epoch.lock().unwrap();
        epoch.1 = split.eq_ignore_ascii_case("train");
    }
    fn update_split(&mut self, items_processed: usize) {
        let epoch = self.epoch.lock().unwrap();
        if epoch.1 {
            self.marks
                .lock()
                .unwrap()
                .push((epoch.0, Instant::now(), items_processed));
        }
    }
    fn end_split(&mut self) {
        let mut epoch = self.epoch.lock().unwrap();
        if epoch.1 {
            epoch.0 += 1;
            epoch.1 = false;
        }
    }
    fn end(&mut self) {}
    fn log_event_training(&mut self, _event: String) {}
}
