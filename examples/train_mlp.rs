//! Trains a small classifier with `DataParallel` in a plain Burn training loop, on the devices
//! of the command line.
//!
//! ```sh
//! cargo run --example train_mlp                                        # CPU, 2 replicas
//! cargo run --example train_mlp -- --devices cpu,cpu,cpu,cpu           # CPU, 4 replicas
//! cargo run --release --features cuda --example train_mlp -- --devices cuda:0,cuda:1
//! cargo run --release --features cuda --example train_mlp -- --devices cuda:0,cpu
//! ```
//!
//! The data is generated: points around four centres in 16 dimensions, labelled by their
//! centre. The loss falls and the accuracy rises within a few epochs; each epoch prints the
//! samples trained per second.

use std::time::Instant;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Distribution, Int, Tensor};
use burn_dataparallel::{DataParallel, DeviceList, Mean};
use clap::Parser;

/// Trains a small classifier on generated data with DataParallel.
#[derive(Parser)]
struct Args {
    /// The devices, one per replica: `cpu`, `cuda:N`, `wgpu:N`, `ws://HOST:PORT` (a Burn
    /// remote server; `cuda`, `wgpu` and `remote` need the features of the same names),
    /// comma-separated; kinds may be mixed.
    #[arg(long, default_value = "cpu,cpu")]
    devices: DeviceList,
    /// Rows per batch, split over the devices.
    #[arg(long, default_value_t = 1024)]
    batch_size: usize,
    /// Passes over the data.
    #[arg(long, default_value_t = 5)]
    epochs: usize,
}

#[derive(Module, Debug)]
struct Classifier {
    hidden: Linear,
    activation: Relu,
    output: Linear,
}

impl Classifier {
    fn new(device: &Device) -> Self {
        Self {
            hidden: LinearConfig::new(16, 256).init(device),
            activation: Relu::new(),
            output: LinearConfig::new(256, 4).init(device),
        }
    }

    fn forward(&self, points: Tensor<2>) -> Tensor<2> {
        self.output
            .forward(self.activation.forward(self.hidden.forward(points)))
    }

    /// The cross-entropy of a batch of points and their labels.
    fn loss(&self, (points, labels): (Tensor<2>, Tensor<1, Int>)) -> Tensor<1> {
        let logits = self.forward(points);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels)
    }
}

/// `count` points around four random centres, with their centre's index as label.
fn dataset(count: usize, device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
    device.seed(7);
    let centres = Tensor::<2>::random([4, 16], Distribution::Uniform(-2.0, 2.0), device);
    let labels = Tensor::<1, Int>::random([count], Distribution::Uniform(0.0, 4.0), device);
    let noise = Tensor::<2>::random([count, 16], Distribution::Normal(0.0, 1.0), device);
    (centres.select(0, labels.clone()) + noise, labels)
}

fn main() {
    let args = Args::parse();
    let devices = args.devices.autodiff().into_vec();
    // The parameters live on the first device, where the data is made and outputs gathered.
    let device = devices[0].clone();
    let (points, labels) = dataset(16384, &device);
    println!("training on {} replicas: {devices:?}", devices.len());
    let mut model = DataParallel::new(Classifier::new(&device), devices).expect("devices");
    let mut optim = AdamConfig::new().init();
    let batch_size = args.batch_size;
    let started = Instant::now();

    // Compile and tune every replica's kernels for the batch shape before training.
    let sample = (
        points.clone().slice(0..batch_size),
        labels.clone().slice(0..batch_size),
    );
    let warm = model.warm_up(sample, Classifier::loss).expect("warm-up");
    println!(
        "warm-up: {:.2?}, shards {:?}",
        warm.total(),
        warm.shard_sizes
    );
    for epoch in 1..=args.epochs {
        let epoch_start = Instant::now();
        let mut total = Tensor::<1>::zeros([1], &device);
        let batches = points.dims()[0] / batch_size;
        for batch in 0..batches {
            let range = batch * batch_size..(batch + 1) * batch_size;
            let input = (
                points.clone().slice(range.clone()),
                labels.clone().slice(range),
            );
            let Mean(loss) = model.forward_with(input, |model, batch| Mean(model.loss(batch)));
            total = total + loss.clone().detach();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-2, model, grads);
        }
        // Reading the loss waits for the epoch's work.
        let mean = total.into_scalar::<f64>() / batches as f64;
        let seconds = epoch_start.elapsed().as_secs_f64();
        println!(
            "epoch {epoch}: mean loss {mean:.4}, {:.0} samples/s",
            (batches * batch_size) as f64 / seconds
        );
    }
    println!("trained in {:.2?}", started.elapsed());

    let predictions = model.forward_with(points.clone(), |model, x| {
        model.forward(x).argmax(1).squeeze_dim(1)
    });
    let correct = predictions.equal(labels).int().sum().into_scalar::<f64>();
    println!(
        "accuracy: {:.1} %",
        100.0 * correct / points.dims()[0] as f64
    );
}
