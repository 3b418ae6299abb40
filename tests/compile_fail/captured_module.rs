// A second trainable module captured by the forward closure (a head after the body).
use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn_dataparallel::DataParallel;

type B = Autodiff<Flex>;

fn main() {
    let device = Default::default();
    let body: Linear<B> = LinearConfig::new(4, 3).init(&device);
    let head: Linear<B> = LinearConfig::new(3, 2).init(&device);
    let dp = DataParallel::new(body, vec![device; 3]).unwrap();
    let x = Tensor::<B, 2>::ones([9, 4], &device);
    let y = dp.forward_with(x, |m, x| head.forward(m.forward(x)).tanh());
    let _grads = y.powi_scalar(2).mean().backward();
}
