//! The bench model under burn-train's `Learner`: its batch, its `TrainStep` (which notes when
//! each step starts and the device memory after the forward) and `InferenceStep`, and the
//! random batches of its data loader. Included by `benches/strategies.rs`.

use std::sync::{LazyLock, Mutex};
use std::time::Instant;

use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};
use burn::train::{ClassificationOutput, InferenceStep, TrainOutput, TrainStep};
use burn_dataparallel::impl_scatter;

use crate::models::{CLASSES, Input, Model, Sizes, input};

/// One batch: the model's input and its class targets.
#[derive(Clone, Debug)]
pub struct Batch<B: Backend> {
    pub input: Input<B>,
    pub targets: Tensor<B, 1, Int>,
}
impl_scatter!(Batch<B> { input, targets });

impl<B: Backend> Model<B> {
    pub fn classify(&self, batch: Batch<B>) -> ClassificationOutput<B> {
        let output = self.forward(batch.input);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, output, batch.targets)
    }
}

/// When each call of the model's `TrainStep` started, and the most device memory in use seen
/// after a forward.
pub static STARTS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
pub static PEAK: Mutex<Option<u64>> = Mutex::new(None);
pub static MEMORY: Mutex<MemoryProbe> = Mutex::new(no_memory);

/// `STRATEGIES_FREE=1`: steps do not wait for the device before noting their start (read
/// once, not at every step).
static FREE_RUNNING: LazyLock<bool> =
    LazyLock::new(|| std::env::var("STRATEGIES_FREE").as_deref() == Ok("1"));

/// Device memory in use, where the backend can tell.
pub type MemoryProbe = fn() -> Option<u64>;

pub fn no_memory() -> Option<u64> {
    None
}

impl<B: AutodiffBackend> TrainStep for Model<B> {
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: Batch<B>) -> TrainOutput<ClassificationOutput<B>> {
        if !*FREE_RUNNING {
            B::sync(&batch.targets.device()).expect("sync");
        }
        STARTS.lock().unwrap().push(Instant::now());
        let item = self.classify(batch);
        let memory = (*MEMORY.lock().unwrap())();
        let mut peak = PEAK.lock().unwrap();
        *peak = (*peak).max(memory);
        drop(peak);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Model<B> {
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: Batch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

/// Random batches for one model: an item is only a seed, the batch is drawn on the device.
#[derive(Clone)]
pub struct Random {
    pub model: String,
    pub sizes: Sizes,
}

impl<B: Backend> Batcher<B, u64, Batch<B>> for Random {
    fn batch(&self, items: Vec<u64>, device: &B::Device) -> Batch<B> {
        let n = items.len();
        Batch {
            input: input::<B>(&self.model, self.sizes, n, device),
            targets: Tensor::random([n], Distribution::Uniform(0.0, CLASSES as f64), device),
        }
    }
}
