//! Trains a small classifier with `DataParallel` in a plain Burn training loop.
//!
//! ```sh
//! cargo run --release --example train_mlp            # CPU, 2 replicas
//! cargo run --release --example train_mlp -- 4       # CPU, 4 replicas
//! cargo run --release --features cuda --example train_mlp -- 4   # CUDA, 4 replicas on GPU 0
//! ```
//!
//! The data is generated: points around four centres in 16 dimensions, labelled by their
//! centre. The loss falls and the accuracy rises within a few epochs.

use std::time::Instant;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, ElementConversion, Int, Tensor};
use burn_dataparallel::{DataParallel, DataParallelBackend, Mean};

#[derive(Module, Debug)]
struct Classifier<B: Backend> {
    hidden: Linear<B>,
    activation: Relu,
    output: Linear<B>,
}

impl<B: Backend> Classifier<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(16, 64).init(device),
            activation: Relu::new(),
            output: LinearConfig::new(64, 4).init(device),
        }
    }

    fn forward(&self, points: Tensor<B, 2>) -> Tensor<B, 2> {
        self.output
            .forward(self.activation.forward(self.hidden.forward(points)))
    }

    /// The cross-entropy of a batch of points and their labels.
    fn loss(&self, (points, labels): (Tensor<B, 2>, Tensor<B, 1, Int>)) -> Tensor<B, 1> {
        let logits = self.forward(points);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels)
    }
}

/// `count` points around four random centres, with their centre's index as label.
fn dataset<B: Backend>(count: usize, device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    B::seed(device, 7);
    let centres = Tensor::<B, 2>::random([4, 16], Distribution::Uniform(-2.0, 2.0), device);
    let labels = Tensor::<B, 1, Int>::random([count], Distribution::Uniform(0.0, 4.0), device);
    let noise = Tensor::<B, 2>::random([count, 16], Distribution::Normal(0.0, 1.0), device);
    (centres.select(0, labels.clone()) + noise, labels)
}

fn train<B: DataParallelBackend>(device: B::Device, replicas: usize) {
    let (points, labels) = dataset::<B>(4096, &device);
    let mut model = DataParallel::new(
        Classifier::<B>::new(&device),
        vec![device.clone(); replicas],
    )
    .expect("valid settings");
    let mut optim = AdamConfig::new().init();
    let batch_size = 256;
    let started = Instant::now();

    println!("training on {replicas} replicas of {device:?}");
    // Compile and tune every replica's kernels for the batch shape before training.
    let sample = (
        points.clone().slice(0..batch_size),
        labels.clone().slice(0..batch_size),
    );
    let warm = model.warm_up(sample, Classifier::loss).expect("warm-up");
    println!(
        "warm-up: {:.2?} (forward {:.2?}, backward {:.2?}), shards {:?}",
        warm.total(),
        warm.forward,
        warm.backward,
        warm.shard_sizes
    );
    for epoch in 1..=5 {
        let mut total = 0.0;
        let batches = points.dims()[0] / batch_size;
        for batch in 0..batches {
            let range = batch * batch_size..(batch + 1) * batch_size;
            let input = (
                points.clone().slice(range.clone()),
                labels.clone().slice(range),
            );
            let Mean(loss) = model.forward_with(input, |model, batch| Mean(model.loss(batch)));
            total += loss.clone().into_scalar().elem::<f64>();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-2, model, grads);
            if epoch == 1 && batch == 0 {
                println!("time to first step: {:.2?}", started.elapsed());
            }
        }
        println!("epoch {epoch}: mean loss {:.4}", total / batches as f64);
    }

    let predictions = model.forward_with(points.clone(), |model, x| {
        model.forward(x).argmax(1).squeeze_dim(1)
    });
    let correct = predictions
        .equal(labels)
        .int()
        .sum()
        .into_scalar()
        .elem::<f64>();
    println!(
        "accuracy: {:.1} %",
        100.0 * correct / points.dims()[0] as f64
    );
}

fn main() {
    let replicas: usize = std::env::args()
        .nth(1)
        .map(|arg| arg.parse().expect("the argument is a replica count"))
        .unwrap_or(2);

    #[cfg(feature = "cuda")]
    train::<burn::backend::Autodiff<burn::backend::Cuda>>(Default::default(), replicas);
    #[cfg(not(feature = "cuda"))]
    train::<burn::backend::Autodiff<burn::backend::Flex>>(Default::default(), replicas);
}
