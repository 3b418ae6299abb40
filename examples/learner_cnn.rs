//! Trains a small CNN with burn-train's `Learner` through `DataParallel` on the devices of the
//! command line, then moves the checkpoint between the wrapper and the bare model.
//!
//! ```sh
//! cargo run --example learner_cnn                                      # CPU, 2 replicas
//! cargo run --example learner_cnn -- --devices cpu,cpu,cpu,cpu         # CPU, 4 replicas
//! cargo run --features cuda --example learner_cnn -- --devices cuda:0,cuda:1
//! cargo run --features wgpu --example learner_cnn -- --devices vulkan:0,vulkan:1
//! ```
//!
//! The images are generated (no download): 12x12 RGB noise with a faint 4x4 square in one of
//! four corners, the label being the corner. The model's own code is what any Burn model has
//! (`forward`, `TrainStep`, `InferenceStep`); the wrapper adds one `Forward` impl naming the
//! step's forward, and `impl_scatter!` for the batch.

use std::collections::HashMap;
use std::time::Instant;

use burn::data::dataloader::{DataLoaderBuilder, batcher::Batcher};
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::AdamConfig;
use burn::record::{CompactRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn::train::metric::{AccuracyMetric, LossMetric, MetricDefinition, MetricId, NumericEntry};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_dataparallel::{ConcatBackend, DataParallel, DataParallelBackend, Forward, impl_scatter};

#[macro_use]
#[path = "common/devices.rs"]
mod devices;

// ---- The model, as any Burn user writes it. ----

#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    activation: Relu,
    pool: AdaptiveAvgPool2d,
    head: Linear<B>,
}

impl<B: Backend> Cnn<B> {
    pub fn new(device: &B::Device) -> Self {
        let conv = |from, to| {
            Conv2dConfig::new([from, to], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        Self {
            conv1: conv(3, 8),
            conv2: conv(8, 16),
            activation: Relu::new(),
            pool: AdaptiveAvgPool2dConfig::new([2, 2]).init(),
            head: LinearConfig::new(64, 4).init(device),
        }
    }

    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.activation.forward(self.conv1.forward(images));
        let x = self.activation.forward(self.conv2.forward(x));
        self.head.forward(self.pool.forward(x).flatten(1, 3))
    }

    pub fn forward_classification(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        let output = self.forward(batch.images);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, output, batch.targets)
    }
}

impl<B: AutodiffBackend> TrainStep for Cnn<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.forward_classification(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Cnn<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(batch)
    }
}

// ---- What DataParallel needs in addition. ----

/// The forward each replica runs on its shard of the batch.
impl<B: ConcatBackend> Forward<B> for Cnn<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn forward(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(batch)
    }
}

#[derive(Debug, Clone)]
pub struct ImageBatch<B: Backend> {
    images: Tensor<B, 4>,
    targets: Tensor<B, 1, Int>,
}
impl_scatter!(ImageBatch<B> { images, targets });

// ---- Generated data. ----

#[derive(Debug, Clone)]
struct Item {
    pixels: Vec<f32>,
    label: i64,
}

fn dataset(count: usize, seed: u64) -> Vec<Item> {
    let mut state = seed;
    let mut noise = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..count)
        .map(|i| {
            let label = (i % 4) as i64;
            let (top, left) = (4 * (label as usize / 2) + 2, 4 * (label as usize % 2) + 2);
            let pixels = (0..3 * 144)
                .map(|p| {
                    let (y, x) = ((p % 144) / 12, p % 12);
                    let lit = (top..top + 4).contains(&y) && (left..left + 4).contains(&x);
                    noise() + if lit { 0.25 } else { 0.0 }
                })
                .collect();
            Item { pixels, label }
        })
        .collect()
}

#[derive(Clone)]
struct ImageBatcher;

impl<B: Backend> Batcher<B, Item, ImageBatch<B>> for ImageBatcher {
    fn batch(&self, items: Vec<Item>, device: &B::Device) -> ImageBatch<B> {
        let n = items.len();
        let pixels: Vec<f32> = items.iter().flat_map(|i| i.pixels.clone()).collect();
        let labels: Vec<i64> = items.iter().map(|i| i.label).collect();
        ImageBatch {
            images: Tensor::from_data(TensorData::new(pixels, [n, 3, 12, 12]), device),
            targets: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

// ---- A one-line-per-epoch progress display. ----

/// Epoch means of the numeric metrics, one line per epoch.
#[derive(Default)]
struct EpochLines {
    names: HashMap<MetricId, String>,
    /// Per split: (metric name, sum of batch values, batch count), in registration order.
    train: Vec<(String, f64, usize)>,
    valid: Vec<(String, f64, usize)>,
    epoch: usize,
}

impl EpochLines {
    fn record(
        names: &HashMap<MetricId, String>,
        into: &mut Vec<(String, f64, usize)>,
        state: MetricState,
    ) {
        if let MetricState::Numeric(entry, value) = state {
            let value = match value {
                NumericEntry::Value(v) => v,
                NumericEntry::Aggregated {
                    aggregated_value, ..
                } => aggregated_value,
            };
            let name = names.get(&entry.metric_id).cloned().unwrap_or_default();
            match into.iter_mut().find(|(n, _, _)| *n == name) {
                Some(slot) => {
                    slot.1 += value;
                    slot.2 += 1;
                }
                None => into.push((name, value, 1)),
            }
        }
    }

    fn line(values: &mut Vec<(String, f64, usize)>) -> String {
        let line = values
            .iter()
            .map(|(name, sum, count)| format!("{name} {:.3}", sum / *count as f64))
            .collect::<Vec<_>>()
            .join(", ");
        values.clear();
        line
    }
}

impl MetricsRendererTraining for EpochLines {
    fn update_train(&mut self, state: MetricState) {
        Self::record(&self.names, &mut self.train, state);
    }

    fn update_valid(&mut self, state: MetricState) {
        Self::record(&self.names, &mut self.valid, state);
    }

    fn render_train(&mut self, _item: TrainingProgress, _progress: Vec<ProgressType>) {}

    fn render_valid(&mut self, item: TrainingProgress, _progress: Vec<ProgressType>) {
        let progress = item.progress.unwrap_or(item.global_progress);
        if progress.items_processed < progress.items_total {
            return;
        }
        self.epoch += 1;
        println!(
            "epoch {}: train [{}]  valid [{}]",
            self.epoch,
            Self::line(&mut self.train),
            Self::line(&mut self.valid)
        );
    }
}

impl MetricsRendererEvaluation for EpochLines {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn render_test(&mut self, _item: EvaluationProgress, _progress: Vec<ProgressType>) {}
}

impl MetricsRenderer for EpochLines {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}

// ---- Training, then checkpoints. ----

fn accuracy<B: Backend>(output: ClassificationOutput<B>) -> f64 {
    let n = output.targets.dims()[0] as f64;
    let predicted = output.output.argmax(1).squeeze_dim::<1>(1);
    let correct = predicted.equal(output.targets).int().sum().into_scalar();
    100.0 * correct.elem::<f64>() / n
}

fn run<B: DataParallelBackend>(devices: Vec<B::Device>) {
    // The parameters live on the first device, where the data loaders put the batches.
    let device = devices[0].clone();
    let train = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(64)
        .shuffle(42)
        .set_device(device.clone())
        .build(InMemDataset::new(dataset(TRAIN_ITEMS, 1)));
    let valid = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(128)
        .set_device(device.clone())
        .build(InMemDataset::new(dataset(512, 2)));

    // The one changed line: the model handed to the Learner is wrapped.
    let model = DataParallel::new(Cnn::<B>::new(&device), devices.clone()).expect("devices");
    println!("{model}");
    println!("training on {} replicas: {devices:?}", devices.len());
    // Compile and tune every replica's kernels for the training batch shape up front.
    let sample = ImageBatcher.batch(dataset(64, 4), &device);
    let warm = model
        .warm_up(sample, |m, batch| Forward::forward(m, batch).loss)
        .expect("warm-up");
    println!("warm-up (first step's kernels): {:.2?}", warm.total());

    let artifacts = std::env::temp_dir().join("burn-dataparallel-learner-cnn");
    let started = Instant::now();
    let trained = SupervisedTraining::new(&artifacts, train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .metric_train_numeric(AccuracyMetric::new())
        .metric_valid_numeric(AccuracyMetric::new())
        .with_application_logger(None)
        .renderer(EpochLines::default())
        .num_epochs(EPOCHS)
        .launch(Learner::new(model, AdamConfig::new().init(), 2e-3))
        .model;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "trained in {seconds:.1} s: {:.0} training samples/s (validation included)",
        (EPOCHS * TRAIN_ITEMS) as f64 / seconds
    );

    let check = ImageBatcher.batch(dataset(512, 3), &device);
    let through_wrapper = accuracy(InferenceStep::step(&trained, check.clone()));
    println!("accuracy on fresh images, through the wrapper: {through_wrapper:.1} %");

    // A checkpoint saved through the wrapper is the bare model's checkpoint...
    let recorder = CompactRecorder::new();
    let path = artifacts.join("cnn");
    trained.clone().save_file(&path, &recorder).expect("save");
    let bare = Cnn::<B::InnerBackend>::new(&device)
        .load_file(&path, &recorder, &device)
        .expect("load into the bare model");
    let bare_accuracy = accuracy(bare.forward_classification(check.clone()));
    println!("accuracy of the bare model loaded from it: {bare_accuracy:.1} %");

    // ...and the bare model's checkpoint loads into a wrapper.
    let record = recorder
        .load(path, &device)
        .expect("the same file as a record");
    let rewrapped = DataParallel::new(Cnn::<B::InnerBackend>::new(&device), devices)
        .expect("devices")
        .load_record(record);
    let rewrapped_accuracy = accuracy(InferenceStep::step(&rewrapped, check));
    println!("accuracy of a new wrapper loaded from it: {rewrapped_accuracy:.1} %");
}

/// Training items per epoch, and epochs.
const TRAIN_ITEMS: usize = 2048;
const EPOCHS: usize = 5;

fn main() {
    on_devices!(run);
}
