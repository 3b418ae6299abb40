//! Models, reference comparisons (`compare.rs`) and the backend list (`backends.rs`) shared by
//! the integration tests.
#![allow(dead_code)]

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig};
use burn::nn::{
    BatchNorm, BatchNormConfig, Dropout, DropoutConfig, Gelu, Linear, LinearConfig, PaddingConfig2d,
};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_dataparallel::Forward;

#[cfg(feature = "cubecl")]
pub mod adapter;
#[macro_use]
mod backends;
mod compare;
#[cfg(feature = "cubecl")]
mod distinct;

pub use backends::*;
pub use compare::*;
#[cfg(feature = "cubecl")]
#[allow(unused_imports)]
pub use distinct::*;

/// A two-layer perceptron.
///
/// The test models use GELU, not ReLU: their gradients are compared with a single-device run,
/// and ReLU's gradient jumps at zero. On CUDA the shards' and the whole batch's products round
/// differently (TF32, see [`TF32_TOLERANCE`]), so a pre-activation within about 1e-3 of zero
/// can be positive in one run and negative in the other; that one position then moves a whole
/// output channel's weight gradient by a few percent (seen as `conv_net_seven_over_three`
/// failing in one channel's 27 elements in 2 of 17 runs on an H200, the other 81 exact). A
/// smooth activation keeps the gradient within rounding of the reference, while a lost or
/// doubled replica contribution still differs by orders of magnitude more.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub hidden: Linear<B>,
    pub activation: Gelu,
    pub output: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    pub fn new(inputs: usize, hidden: usize, outputs: usize, device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(inputs, hidden).init(device),
            activation: Gelu::new(),
            output: LinearConfig::new(hidden, outputs).init(device),
        }
    }

    pub fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
        self.output
            .forward(self.activation.forward(self.hidden.forward(input)))
    }
}

impl<B: burn_dataparallel::ConcatBackend> Forward<B> for Mlp<B> {
    type Input = Tensor<B, 2>;
    type Output = Tensor<B, 2>;

    fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
        self.forward(input)
    }
}

/// A small convolutional classifier for `[batch, 3, 6, 6]` images.
#[derive(Module, Debug)]
pub struct ConvNet<B: Backend> {
    pub conv: Conv2d<B>,
    pub activation: Gelu,
    pub pool: AdaptiveAvgPool2d,
    pub head: Linear<B>,
}

impl<B: Backend> ConvNet<B> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            conv: Conv2dConfig::new([3, 4], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            activation: Gelu::new(),
            pool: AdaptiveAvgPool2dConfig::new([2, 2]).init(),
            head: LinearConfig::new(16, 3).init(device),
        }
    }

    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let features = self
            .pool
            .forward(self.activation.forward(self.conv.forward(images)));
        self.head.forward(features.flatten(1, 3))
    }
}

/// A perceptron with batch normalization and dropout.
#[derive(Module, Debug)]
pub struct BnNet<B: Backend> {
    pub hidden: Linear<B>,
    pub norm: BatchNorm<B>,
    pub activation: Gelu,
    pub dropout: Dropout,
    pub output: Linear<B>,
}

impl<B: Backend> BnNet<B> {
    pub fn new(dropout: f64, device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(8, 16).init(device),
            norm: BatchNormConfig::new(16).init(device),
            activation: Gelu::new(),
            dropout: DropoutConfig::new(dropout).init(),
            output: LinearConfig::new(16, 4).init(device),
        }
    }

    pub fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.norm.forward(self.hidden.forward(input));
        self.output
            .forward(self.dropout.forward(self.activation.forward(hidden)))
    }
}

/// A tensor of uniform random values in `[-1, 1)`.
pub fn random<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Uniform(-1.0, 1.0), device)
}

/// A fixed, position-dependent weighting: `sum(output * probe(output))` gives every output
/// element a different gradient.
pub fn probe<B: Backend, const D: usize>(like: &Tensor<B, D>) -> Tensor<B, D> {
    let shape = like.shape();
    let n = shape.num_elements() as i64;
    Tensor::<B, 1, burn::tensor::Int>::arange(0..n, &like.device())
        .float()
        .mul_scalar(0.37)
        .sin()
        .reshape(shape)
}

/// Where forwards note the threads they ran on: the forwards capture nothing, so each call
/// passes a token of its own ([`thread_token`]) in its input (tests run at the same time in
/// one process).
static THREADS: std::sync::Mutex<Vec<(u64, std::thread::ThreadId)>> =
    std::sync::Mutex::new(Vec::new());

/// A token no other call of this process has.
pub fn thread_token() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Notes that a forward of call `token` ran on this thread.
pub fn note_thread(token: u64) {
    let mut threads = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    threads.push((token, std::thread::current().id()));
}

/// The threads call `token`'s forwards ran on, in the order noted.
pub fn threads_of(token: u64) -> Vec<std::thread::ThreadId> {
    let threads = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    (threads.iter())
        .filter(|(t, _)| *t == token)
        .map(|(_, id)| *id)
        .collect()
}
