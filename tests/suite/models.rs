//! The models the tests train.

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig, Tanh};
use burn::tensor::{Device, Distribution, Tensor};
use burn_dataparallel::Forward;

/// A two-layer perceptron with a tanh between the layers.
///
/// A tanh, not a ReLU: on CUDA, Burn's autotune runs a small f32 product in TF32 or in f32,
/// whichever was faster for its bucket of shapes, and the replicas' shards fall in other
/// buckets than the whole batch. A tanh keeps that a rounding difference (within the GPU
/// tolerance); a ReLU turns it into a unit's whole term where a unit's input is near zero.
#[derive(Module, Debug)]
pub struct Mlp {
    first: Linear,
    activation: Tanh,
    second: Linear,
}

impl Mlp {
    pub fn new(device: &Device) -> Self {
        Self {
            first: LinearConfig::new(6, 8).init(device),
            activation: Tanh::new(),
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
