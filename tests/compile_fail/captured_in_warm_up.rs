// A module captured by the loss given to `warm_up`.
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn_dataparallel::DataParallel;

type B = Autodiff<Flex>;

fn main() {
    let device = Default::default();
    let body: Linear<B> = LinearConfig::new(4, 3).init(&device);
    let head: Linear<B> = LinearConfig::new(3, 3).init(&device);
    let dp = DataParallel::new(body, vec![device; 2]).unwrap();
    let sample = (Tensor::<B, 2>::ones([6, 4], &device), Tensor::<B, 2>::zeros([6, 3], &device));
    let _ = dp.warm_up(sample, |m, (x, y)| {
        MseLoss::new().forward(head.forward(m.forward(x)), y, Reduction::Mean)
    });
}
