//! The controls on an MLP under autodiff: `bare` (two worker threads by hand) and `wrapper`.

use std::sync::mpsc::{Sender, channel};
use std::time::Instant;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, StreamId, Tensor};
use burn_dataparallel::{DataParallelBackend, DataParallelConfig};
use cubecl::cuda::CudaDevice;

use crate::{CubeAd, FusionAd, device, row, streams};

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    first: Linear<B>,
    act: Relu,
    second: Linear<B>,
    third: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            first: LinearConfig::new(64, 256).init(device),
            act: Relu::new(),
            second: LinearConfig::new(256, 256).init(device),
            third: LinearConfig::new(256, 8).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = self.act.forward(self.first.forward(x));
        self.third.forward(self.act.forward(self.second.forward(h)))
    }
}

/// Every parameter gradient of `model`, flattened, in visiting order.
fn gradients<B: AutodiffBackend, M: Module<B>>(model: &M, grads: &B::Gradients) -> Vec<Vec<f32>> {
    struct Collect<'a, B: AutodiffBackend> {
        grads: &'a B::Gradients,
        out: Vec<Vec<f32>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = param.val().grad(self.grads);
            let values = grad.map(|g| g.into_data().to_vec::<f32>().expect("f32 values"));
            self.out.push(values.unwrap_or_default());
        }
    }
    let mut visitor = Collect::<B> {
        grads,
        out: Vec::new(),
    };
    model.visit(&mut visitor);
    visitor.out
}

/// The largest relative error of `got` against `want`, parameter by parameter (a missing
/// gradient counts as wrong).
fn error(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.len() != w.len() {
                return f32::INFINITY;
            }
            let scale = w.iter().map(|v| v.abs()).fold(1e-6, f32::max);
            g.iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs() / scale)
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

pub fn bare_both(backend: &str, rounds: usize) {
    match backend {
        "cube" => {
            bare::<CubeAd>("cube", rounds, false);
            bare::<CubeAd>("cube", rounds, true);
        }
        "fusion" => {
            bare::<FusionAd>("fusion", rounds, false);
            bare::<FusionAd>("fusion", rounds, true);
        }
        other => panic!("unknown backend {other}: cube or fusion"),
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Two persistent worker threads, as the wrapper has lanes.
fn workers() -> Vec<Sender<Job>> {
    (0..2)
        .map(|_| {
            let (sender, jobs) = channel::<Job>();
            std::thread::spawn(move || jobs.into_iter().for_each(|job| job()));
            sender
        })
        .collect()
}

/// The bare model's forward split over two worker threads by hand, four steps per round.
fn bare<B: AutodiffBackend>(name: &str, rounds: usize, shared: bool)
where
    B::Device: From<CudaDevice>,
{
    const STEPS: usize = 4;
    let device: B::Device = device().into();
    let model = Mlp::<B>::new(&device);
    let lanes = workers();
    let started = Instant::now();
    let mut wrong = Vec::new();
    for _ in 0..rounds {
        let inputs: Vec<Tensor<B, 2>> = (0..STEPS)
            .map(|_| Tensor::random([64, 64], Distribution::Normal(0.0, 1.0), &device))
            .collect();
        let loss = |outputs: Tensor<B, 2>| outputs.powi_scalar(2).mean();
        let mut reference = Tensor::<B, 1>::zeros([1], &device);
        for x in &inputs {
            reference = reference + loss(model.forward(x.clone())).reshape([1]);
        }
        let want = gradients(&model, &reference.backward());
        let caller = StreamId::current();
        let mut total = Tensor::<B, 1>::zeros([1], &device);
        for x in inputs {
            let halves = x.split_with_sizes(vec![32, 32], 0);
            let (sender, receiver) = channel();
            for (index, (half, lane)) in halves.into_iter().zip(&lanes).enumerate() {
                let (model, sender) = (model.clone(), sender.clone());
                let job = move || {
                    let _ = sender.send((index, model.forward(half)));
                };
                lane.send(match shared {
                    true => Box::new(move || caller.executes(job)),
                    false => Box::new(job),
                })
                .expect("a worker");
            }
            drop(sender);
            let mut outputs: Vec<_> = receiver.iter().collect();
            outputs.sort_by_key(|(index, _)| *index);
            let output = Tensor::cat(outputs.into_iter().map(|(_, o)| o).collect(), 0);
            total = total + loss(output).reshape([1]);
        }
        wrong.push(error(&gradients(&model, &total.backward()), &want));
    }
    row("bare, 2 threads", name, streams(shared), &wrong, started);
}

pub fn wrapper(backend: &str, replicas: usize, parallel_backward: bool, rounds: usize) {
    match backend {
        "cube" => wrapper_on::<CubeAd>("cube", replicas, parallel_backward, rounds),
        "fusion" => wrapper_on::<FusionAd>("fusion", replicas, parallel_backward, rounds),
        other => panic!("unknown backend {other}: cube or fusion"),
    }
}

/// The wrapper over `replicas` replicas on GPU 0 against the bare model, one step per round.
fn wrapper_on<B: DataParallelBackend>(
    name: &str,
    replicas: usize,
    parallel_backward: bool,
    rounds: usize,
) where
    B::Device: From<CudaDevice>,
{
    let device: B::Device = device().into();
    let dp = DataParallelConfig::new()
        .with_parallel_backward(parallel_backward)
        .init(Mlp::<B>::new(&device), vec![device.clone(); replicas])
        .expect("a wrapper");
    // The wrapper's own module (its parameters initialised) is the bare model.
    let model = dp.module().clone();
    let started = Instant::now();
    let mut wrong = Vec::new();
    for _ in 0..rounds {
        let x = Tensor::<B, 2>::random([96, 64], Distribution::Normal(0.0, 1.0), &device);
        let want = gradients(
            &model,
            &model.forward(x.clone()).powi_scalar(2).mean().backward(),
        );
        let output = dp.forward_with(x, |m, x| m.forward(x));
        let got = gradients(&model, &output.powi_scalar(2).mean().backward());
        wrong.push(error(&got, &want));
    }
    let control = format!(
        "wrapper, {replicas} replica(s), parallel backward {}",
        match parallel_backward {
            true => "on",
            false => "off",
        }
    );
    row(&control, name, "as the wrapper runs them", &wrong, started);
}
