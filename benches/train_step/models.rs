//! The bench's two models (a launch-bound MLP and a ResNet-18), their sizes on a GPU and on
//! the CPU, their batches, the classifier step burn-train's `Learner` runs, and the step of
//! the benches' own loops.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Distribution, Int, Tensor};
use burn::train::{ClassificationOutput, InferenceStep, TrainOutput, TrainStep};
use burn_dataparallel::{DataParallel, Mean, impl_scatter};

pub const CLASSES: usize = 10;

/// Model sizes: the benchmark's on a GPU, smaller ones for a CPU run.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub mlp: [usize; 4],
    pub image: usize,
    pub resnet_width: usize,
}

pub const GPU_SIZES: Sizes = Sizes {
    mlp: [1024, 4096, 4096, CLASSES],
    image: 64,
    resnet_width: 64,
};

pub const CPU_SIZES: Sizes = Sizes {
    mlp: [64, 256, 256, CLASSES],
    image: 32,
    resnet_width: 8,
};

#[derive(Module, Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
    relu: Relu,
}

impl Mlp {
    fn new(widths: &[usize], device: &Device) -> Self {
        let layers = widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(device))
            .collect();
        Self {
            layers,
            relu: Relu::new(),
        }
    }

    fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i < last {
                x = self.relu.forward(x);
            }
        }
        x
    }
}

fn conv(from: usize, to: usize, k: usize, stride: usize, device: &Device) -> Conv2d {
    Conv2dConfig::new([from, to], [k, k])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(k / 2, k / 2, k / 2, k / 2))
        .with_bias(false)
        .init(device)
}

/// A ResNet basic block: two 3x3 convolutions with batch norm, a 1x1 projection on the
/// shortcut where the shape changes.
#[derive(Module, Debug)]
pub struct Block {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    shortcut: Option<(Conv2d, BatchNorm)>,
    relu: Relu,
}

impl Block {
    fn new(from: usize, to: usize, stride: usize, device: &Device) -> Self {
        let bn = || BatchNormConfig::new(to).init(device);
        let shortcut =
            (stride != 1 || from != to).then(|| (conv(from, to, 1, stride, device), bn()));
        Self {
            conv1: conv(from, to, 3, stride, device),
            bn1: bn(),
            conv2: conv(to, to, 3, 1, device),
            bn2: bn(),
            shortcut,
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let y = self
            .relu
            .forward(self.bn1.forward(self.conv1.forward(x.clone())));
        let y = self.bn2.forward(self.conv2.forward(y));
        let skip = match &self.shortcut {
            Some((conv, bn)) => bn.forward(conv.forward(x)),
            None => x,
        };
        self.relu.forward(y + skip)
    }
}

/// ResNet-18: a 7x7 stem, four stages of two basic blocks, global pooling and a classifier.
#[derive(Module, Debug)]
pub struct ResNet {
    stem: Conv2d,
    bn: BatchNorm,
    pool: MaxPool2d,
    blocks: Vec<Block>,
    avg: AdaptiveAvgPool2d,
    fc: Linear,
    relu: Relu,
    image: usize,
}

impl ResNet {
    fn new(width: usize, image: usize, device: &Device) -> Self {
        let mut blocks = Vec::new();
        let mut from = width;
        for (stage, mult) in [1, 2, 4, 8].into_iter().enumerate() {
            let to = width * mult;
            blocks.push(Block::new(from, to, if stage == 0 { 1 } else { 2 }, device));
            blocks.push(Block::new(to, to, 1, device));
            from = to;
        }
        Self {
            stem: conv(3, width, 7, 2, device),
            bn: BatchNormConfig::new(width).init(device),
            pool: MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(),
            blocks,
            avg: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            fc: LinearConfig::new(from, CLASSES).init(device),
            relu: Relu::new(),
            image,
        }
    }

    /// `x` holds each image flattened: `[batch, 3 * image * image]`.
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let [batch, _] = x.dims();
        let x = x.reshape([batch, 3, self.image, self.image]);
        let mut x = self
            .pool
            .forward(self.relu.forward(self.bn.forward(self.stem.forward(x))));
        for block in &self.blocks {
            x = block.forward(x);
        }
        self.fc.forward(self.avg.forward(x).flatten(1, 3))
    }
}

/// One of the two models, as a classifier with burn-train's steps.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Net {
    Mlp(Mlp),
    ResNet(ResNet),
}

/// The models the bench knows.
pub const MODELS: [&str; 2] = ["mlp", "resnet18"];

impl Net {
    /// # Panics
    ///
    /// For a name not in [`MODELS`].
    pub fn new(name: &str, sizes: Sizes, device: &Device) -> Self {
        match name {
            "mlp" => Net::Mlp(Mlp::new(&sizes.mlp, device)),
            "resnet18" => Net::ResNet(ResNet::new(sizes.resnet_width, sizes.image, device)),
            other => panic!("no model {other:?}; the bench knows {MODELS:?}"),
        }
    }

    /// The width of one input row.
    pub fn features(name: &str, sizes: Sizes) -> usize {
        match name {
            "mlp" => sizes.mlp[0],
            _ => 3 * sizes.image * sizes.image,
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Net::Mlp(m) => m.forward(x),
            Net::ResNet(m) => m.forward(x),
        }
    }

    pub fn classify(&self, batch: Batch) -> ClassificationOutput {
        let output = self.forward(batch.inputs);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), batch.targets.clone());
        ClassificationOutput {
            loss,
            output,
            targets: batch.targets,
        }
    }
}

/// A batch of inputs (one row per item) and their classes.
#[derive(Clone, Debug)]
pub struct Batch {
    pub inputs: Tensor<2>,
    pub targets: Tensor<1, Int>,
}

impl_scatter!(Batch { inputs, targets });

impl Batch {
    /// `rows` random items of `features` values on `device`.
    pub fn random(rows: usize, features: usize, device: &Device) -> Self {
        Self {
            inputs: Tensor::random([rows, features], Distribution::Normal(0.0, 1.0), device),
            targets: Tensor::random([rows], Distribution::Uniform(0.0, CLASSES as f64), device),
        }
    }
}

impl TrainStep for Net {
    type Input = Batch;
    type Output = ClassificationOutput;

    fn step(&self, batch: Batch) -> TrainOutput<ClassificationOutput> {
        let item = self.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl InferenceStep for Net {
    type Input = Batch;
    type Output = ClassificationOutput;

    fn step(&self, batch: Batch) -> ClassificationOutput {
        self.classify(batch)
    }
}

/// A model as a bench trains it: bare, or in the wrapper.
#[allow(clippy::large_enum_variant)] // one value a configuration
pub enum Trained {
    Bare(Net),
    Wrapped(DataParallel<Net>),
}

impl Trained {
    /// One SGD step on `batch`, queued (the caller waits for it as its devices allow).
    pub fn step(self, batch: &Batch, optim: &mut ModuleOptimizer) -> Self {
        match self {
            Trained::Bare(net) => {
                let loss = net.classify(batch.clone()).loss;
                let grads = GradientsParams::from_grads(loss.backward(), &net);
                Trained::Bare(optim.step(0.01, net, grads))
            }
            Trained::Wrapped(dp) => Trained::Wrapped(wrapped_step(dp, batch.clone(), optim).0),
        }
    }
}

/// One SGD step of the wrapper in the README's loop: the stepped wrapper, and the loss.
pub fn wrapped_step(
    dp: DataParallel<Net>,
    batch: Batch,
    optim: &mut ModuleOptimizer,
) -> (DataParallel<Net>, Tensor<1>) {
    let Mean(loss) = dp.forward_with(batch, |net, batch| Mean(net.classify(batch).loss));
    let grads = GradientsParams::from_grads(loss.backward(), &dp);
    (optim.step(0.01, dp, grads), loss)
}
