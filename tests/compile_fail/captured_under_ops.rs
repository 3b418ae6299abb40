// A tracked tensor captured by the forward closure, one operation below the output, with the
// error as a value.
use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn_dataparallel::DataParallel;

type B = Autodiff<Flex>;

fn main() {
    let device = Default::default();
    let model: Linear<B> = LinearConfig::new(4, 3).init(&device);
    let dp = DataParallel::new(model, vec![device; 2]).unwrap();
    let scale = Tensor::<B, 2>::ones([1, 3], &device).require_grad();
    let x = Tensor::<B, 2>::ones([6, 4], &device);
    let _y = dp.try_forward_with(x, move |m, x| (m.forward(x) * scale.clone()).add_scalar(1.0).exp());
}
