//! The benchmarks' three models (an MLP, a ResNet-18 and a small transformer encoder), their
//! sizes on CUDA and on the CPU, and their random inputs, shared by `train_step` and
//! `strategies` (`step_time` uses the MLP).

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{
    BatchNorm, BatchNormConfig, Embedding, EmbeddingConfig, Linear, LinearConfig, PaddingConfig2d,
    Relu,
};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};

/// The models' inputs: features, images or token ids.
#[derive(Clone, Debug)]
pub enum Input<B: Backend> {
    Features(Tensor<B, 2>),
    Images(Tensor<B, 4>),
    Tokens(Tensor<B, 2, Int>),
}

/// Model sizes; the benchmark's on CUDA, smaller on CPU.
#[derive(Clone, Copy)]
pub struct Sizes {
    pub mlp: [usize; 4],
    pub image: usize,
    pub resnet_width: usize,
    pub seq: usize,
    pub d_model: usize,
    pub layers: usize,
}

pub const CLASSES: usize = 10;
pub const VOCAB: usize = 1000;

/// The benchmark's model sizes (on CUDA).
// Not every bench that includes this file runs on CUDA (`host_work` never does).
#[allow(dead_code)]
pub const CUDA_SIZES: Sizes = Sizes {
    mlp: [1024, 4096, 4096, CLASSES],
    image: 64,
    resnet_width: 64,
    seq: 128,
    d_model: 256,
    layers: 4,
};

/// Smaller sizes for a CPU run.
#[cfg_attr(feature = "cuda", allow(dead_code))]
pub const CPU_SIZES: Sizes = Sizes {
    mlp: [64, 256, 256, CLASSES],
    image: 32,
    resnet_width: 8,
    seq: 16,
    d_model: 32,
    layers: 2,
};

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    layers: Vec<Linear<B>>,
    relu: Relu,
}

impl<B: Backend> Mlp<B> {
    pub fn new(widths: &[usize], device: &B::Device) -> Self {
        let layers = widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(device))
            .collect();
        Self {
            layers,
            relu: Relu::new(),
        }
    }

    pub fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
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

/// A ResNet basic block: two 3x3 convolutions with batch norm, and a 1x1 projection on the
/// shortcut where the shape changes. Without batch norm (`None`) in the diagnostic variant.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    conv1: Conv2d<B>,
    bn1: Option<BatchNorm<B>>,
    conv2: Conv2d<B>,
    bn2: Option<BatchNorm<B>>,
    shortcut: Option<(Conv2d<B>, Option<BatchNorm<B>>)>,
    relu: Relu,
}

/// `x` through `bn`, if there is one.
fn normed<B: Backend>(bn: &Option<BatchNorm<B>>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    match bn {
        Some(bn) => bn.forward(x),
        None => x,
    }
}

fn conv<B: Backend>(from: usize, to: usize, k: usize, stride: usize, d: &B::Device) -> Conv2d<B> {
    Conv2dConfig::new([from, to], [k, k])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(k / 2, k / 2, k / 2, k / 2))
        .with_bias(false)
        .init(d)
}

impl<B: Backend> Block<B> {
    pub fn new(from: usize, to: usize, stride: usize, norm: bool, device: &B::Device) -> Self {
        let bn = || norm.then(|| BatchNormConfig::new(to).init(device));
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

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let y = self
            .relu
            .forward(normed(&self.bn1, self.conv1.forward(x.clone())));
        let y = normed(&self.bn2, self.conv2.forward(y));
        let skip = match &self.shortcut {
            Some((conv, bn)) => normed(bn, conv.forward(x)),
            None => x,
        };
        self.relu.forward(y + skip)
    }
}

/// ResNet-18: a 7x7 stem, four stages of two basic blocks, global pooling and a classifier.
#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    stem: Conv2d<B>,
    bn: Option<BatchNorm<B>>,
    pool: MaxPool2d,
    blocks: Vec<Block<B>>,
    avg: AdaptiveAvgPool2d,
    fc: Linear<B>,
    relu: Relu,
}

impl<B: Backend> ResNet<B> {
    pub fn new(width: usize, norm: bool, device: &B::Device) -> Self {
        let mut blocks = Vec::new();
        let mut from = width;
        for (stage, mult) in [1, 2, 4, 8].into_iter().enumerate() {
            let to = width * mult;
            let stride = if stage == 0 { 1 } else { 2 };
            blocks.push(Block::new(from, to, stride, norm, device));
            blocks.push(Block::new(to, to, 1, norm, device));
            from = to;
        }
        Self {
            stem: conv(3, width, 7, 2, device),
            bn: norm.then(|| BatchNormConfig::new(width).init(device)),
            pool: MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(),
            blocks,
            avg: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            fc: LinearConfig::new(from, CLASSES).init(device),
            relu: Relu::new(),
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = self
            .pool
            .forward(self.relu.forward(normed(&self.bn, self.stem.forward(x))));
        for block in &self.blocks {
            x = block.forward(x);
        }
        self.fc.forward(self.avg.forward(x).flatten(1, 3))
    }
}

/// A post-norm transformer encoder over token embeddings, mean-pooled into a classifier.
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    embedding: Embedding<B>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: Backend> Encoder<B> {
    pub fn new(d_model: usize, layers: usize, device: &B::Device) -> Self {
        Self {
            embedding: EmbeddingConfig::new(VOCAB, d_model).init(device),
            encoder: TransformerEncoderConfig::new(d_model, 4 * d_model, 8, layers)
                .with_dropout(0.0)
                .init(device),
            head: LinearConfig::new(d_model, CLASSES).init(device),
        }
    }

    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let x = self.embedding.forward(tokens);
        let x = self.encoder.forward(TransformerEncoderInput::new(x));
        self.head.forward(x.mean_dim(1).squeeze_dim(1))
    }
}

/// One of the three models.
// One value per configuration: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Model<B: Backend> {
    Mlp(Mlp<B>),
    ResNet(ResNet<B>),
    Encoder(Encoder<B>),
}

impl<B: Backend> Model<B> {
    pub fn new(name: &str, sizes: Sizes, device: &B::Device) -> Self {
        match name {
            "mlp" => Model::Mlp(Mlp::new(&sizes.mlp, device)),
            "resnet18" => Model::ResNet(ResNet::new(sizes.resnet_width, true, device)),
            // Diagnostic: the same network without batch norm (no running states).
            "resnet18-nobn" => Model::ResNet(ResNet::new(sizes.resnet_width, false, device)),
            _ => Model::Encoder(Encoder::new(sizes.d_model, sizes.layers, device)),
        }
    }

    pub fn forward(&self, input: Input<B>) -> Tensor<B, 2> {
        match (self, input) {
            (Model::Mlp(m), Input::Features(x)) => m.forward(x),
            (Model::ResNet(m), Input::Images(x)) => m.forward(x),
            (Model::Encoder(m), Input::Tokens(x)) => m.forward(x),
            _ => unreachable!("input matches the model"),
        }
    }
}

pub fn input<B: Backend>(name: &str, sizes: Sizes, batch: usize, device: &B::Device) -> Input<B> {
    let normal = Distribution::Normal(0.0, 1.0);
    match name {
        "mlp" => Input::Features(Tensor::random([batch, sizes.mlp[0]], normal, device)),
        "resnet18" | "resnet18-nobn" => Input::Images(Tensor::random(
            [batch, 3, sizes.image, sizes.image],
            normal,
            device,
        )),
        _ => Input::Tokens(Tensor::random(
            [batch, sizes.seq],
            Distribution::Uniform(0.0, VOCAB as f64),
            device,
        )),
    }
}

/// `Input` scatters along the batch like the tensor it holds.
impl<B: burn_dataparallel::ConcatBackend> burn_dataparallel::Scatter<B> for Input<B> {
    fn batch_size(
        &self,
        dim: usize,
    ) -> Result<Option<usize>, burn_dataparallel::DataParallelError> {
        use burn_dataparallel::Scatter;
        match self {
            Input::Features(x) => Scatter::batch_size(x, dim),
            Input::Images(x) => Scatter::batch_size(x, dim),
            Input::Tokens(x) => Scatter::batch_size(x, dim),
        }
    }

    fn scatter(self, shards: &burn_dataparallel::Shards<B>) -> Vec<Self> {
        use burn_dataparallel::Scatter;
        match self {
            Input::Features(x) => Scatter::scatter(x, shards)
                .into_iter()
                .map(Input::Features)
                .collect(),
            Input::Images(x) => Scatter::scatter(x, shards)
                .into_iter()
                .map(Input::Images)
                .collect(),
            Input::Tokens(x) => Scatter::scatter(x, shards)
                .into_iter()
                .map(Input::Tokens)
                .collect(),
        }
    }

    /// Every variant is one tensor split by its own `Scatter`: the forward's fast path
    /// applies (without this, every bench using `Input` would run the exact path).
    fn scatters_every_tensor(&self) -> bool {
        use burn_dataparallel::Scatter;
        match self {
            Input::Features(x) => Scatter::<B>::scatters_every_tensor(x),
            Input::Images(x) => Scatter::<B>::scatters_every_tensor(x),
            Input::Tokens(x) => Scatter::<B>::scatters_every_tensor(x),
        }
    }
}
