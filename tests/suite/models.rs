//! The models the tests train.

use burn::module::{Module, Param};
use burn::nn::activation::Activation;
use burn::nn::{Linear, LinearConfig, Relu, Tanh};
use burn::tensor::{Device, Distribution, Tensor};
use burn_dataparallel::Forward;

/// A two-layer perceptron.
#[derive(Module, Debug)]
pub struct Mlp {
    first: Linear,
    activation: Activation,
    second: Linear,
}

impl Mlp {
    /// With a ReLU between the layers.
    pub fn new(device: &Device) -> Self {
        Self::with(Relu::new().into(), device)
    }

    /// With a tanh between the layers: no kink, so that two products rounded differently
    /// (a GPU's TF32 and f32 kernels) give gradients as close as their rounding, where a ReLU
    /// may cut a unit in one and keep it in the other.
    pub fn smooth(device: &Device) -> Self {
        Self::with(Tanh::new().into(), device)
    }

    fn with(activation: Activation, device: &Device) -> Self {
        Self {
            first: LinearConfig::new(6, 8).init(device),
            activation,
            second: LinearConfig::new(8, 3).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.second
            .forward(self.activation.forward(self.first.forward(x)))
    }
}

impl Forward for Mlp {
    type Input = Tensor<2>;
    type Output = Tensor<2>;

    fn forward(&self, input: Tensor<2>) -> Tensor<2> {
        Mlp::forward(self, input)
    }
}

/// A model whose two weights share one parameter id (a weight tied by cloning its `Param`).
#[derive(Module, Debug)]
pub struct Tied {
    pub encoder: Param<Tensor<2>>,
    pub decoder: Param<Tensor<2>>,
}

impl Tied {
    pub fn new(device: &Device) -> Self {
        let encoder = Param::from_tensor(Tensor::random(
            [6, 4],
            Distribution::Normal(0.0, 0.5),
            device,
        ));
        Self {
            decoder: encoder.clone(),
            encoder,
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        x.matmul(self.encoder.val())
            .tanh()
            .matmul(self.decoder.val().transpose())
    }
}

/// A batch of `rows` inputs of the perceptron and their targets, on `device`.
pub fn batch(rows: usize, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let normal = Distribution::Normal(0.0, 1.0);
    (
        Tensor::random([rows, 6], normal, device),
        Tensor::random([rows, 3], normal, device),
    )
}
