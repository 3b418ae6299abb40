//! Replicas on devices that other processes serve: Burn's remote backend over WebSocket,
//! each server a process in a network namespace of its own (its own address, not loopback),
//! started and stopped by the test. Needs root for `ip netns`; CI runs it:
//!
//! ```sh
//! cargo test --features remote --test remote
//! ```
//!
//! The binary is its own harness: `--serve PORT` runs a server, anything else runs the
//! tests, each under a watchdog.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Distribution, Tensor};
use burn::train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_dataparallel::{DataParallel, DataParallelError, DeviceList, Mean, impl_scatter};

#[path = "../common/mod.rs"]
mod common;
mod servers;

use common::{Silent, assert_same_params};
use servers::Server;

/// How long one test may take.
const LIMIT: Duration = Duration::from_secs(120);

#[derive(Module, Debug)]
struct Mlp {
    first: Linear,
    activation: Relu,
    second: Linear,
}

impl Mlp {
    fn new(device: &Device) -> Self {
        Self {
            first: LinearConfig::new(6, 8).init(device),
            activation: Relu::new(),
            second: LinearConfig::new(8, 3).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.second
            .forward(self.activation.forward(self.first.forward(x)))
    }

    fn loss(&self, batch: Batch) -> Tensor<1> {
        MseLoss::new().forward(self.forward(batch.x), batch.y, Reduction::Mean)
    }
}

#[derive(Clone, Debug)]
struct Batch {
    x: Tensor<2>,
    y: Tensor<2>,
}

impl_scatter!(Batch { x, y });

impl Batch {
    fn random(rows: usize, device: &Device) -> Self {
        let normal = Distribution::Normal(0.0, 1.0);
        Self {
            x: Tensor::random([rows, 6], normal, device),
            y: Tensor::random([rows, 3], normal, device),
        }
    }
}

impl TrainStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> TrainOutput<RegressionOutput> {
        let output = self.forward(batch.x);
        let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
        let item = RegressionOutput::new(loss.clone(), output, batch.y);
        TrainOutput::new(self, loss.backward(), item)
    }
}

impl InferenceStep for Mlp {
    type Input = Batch;
    type Output = RegressionOutput;

    fn step(&self, batch: Batch) -> RegressionOutput {
        let output = self.forward(batch.x);
        let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.y)
    }
}

/// The local Flex device, then one device per server, parsed as a user would.
fn devices(servers: &[Server]) -> Vec<Device> {
    let mut list = vec!["cpu".to_string()];
    list.extend(servers.iter().map(Server::entry));
    let devices: DeviceList = list.join(",").parse().expect("the servers answer");
    devices.autodiff().into_vec()
}

/// Three SGD steps of the bare model on the local device and of the wrapper over `devices`
/// (from `dp`): the same parameters after each. Returns both.
fn train_beside(
    mut bare: Mlp,
    mut dp: DataParallel<Mlp>,
    steps: usize,
) -> (Mlp, DataParallel<Mlp>) {
    let local = dp.output_device().clone();
    let mut bare_optim: ModuleOptimizer = SgdConfig::new().init();
    let mut dp_optim: ModuleOptimizer = SgdConfig::new().init();
    for rows in [10, 7, 13].into_iter().cycle().take(steps) {
        let batch = Batch::random(rows, &local);
        let grads = GradientsParams::from_grads(bare.loss(batch.clone()).backward(), &bare);
        bare = bare_optim.step(0.1, bare, grads);
        let Mean(loss) = dp.forward_with(batch, |m, batch| Mean(m.loss(batch)));
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = dp_optim.step(0.1, dp, grads);
        assert_same_params(dp.module(), &bare, 1e-5);
    }
    (bare, dp)
}

fn trains_as_the_bare_model_over(count: usize) {
    let servers: Vec<Server> = (0..count).map(|_| Server::start()).collect();
    let devices = devices(&servers);
    let bare = Mlp::new(&devices[0]);
    let dp = DataParallel::new(bare.clone(), devices.clone()).unwrap();
    let (_, dp) = train_beside(bare, dp, 3);
    assert_eq!(dp.replica_devices(), devices.as_slice());
}

fn two_servers_train_as_the_bare_model() {
    trains_as_the_bare_model_over(2);
}

fn four_servers_train_as_the_bare_model() {
    trains_as_the_bare_model_over(4);
}

#[derive(Clone)]
struct RandomBatcher;

impl Batcher<usize, Batch> for RandomBatcher {
    fn batch(&self, items: Vec<usize>, device: &Device) -> Batch {
        device.seed(items[0] as u64);
        Batch::random(items.len(), device)
    }
}

/// Two epochs of 36 items in batches of 9, validated on 9.
fn training<M>(dir: &std::path::Path, device: &Device) -> SupervisedTraining<M>
where
    M: burn::train::LearnerModel
        + TrainStep<Input = Batch, Output = RegressionOutput>
        + InferenceStep<Input = Batch, Output = RegressionOutput>,
{
    let loader = |items: usize| {
        DataLoaderBuilder::new(RandomBatcher)
            .batch_size(9)
            .set_device(device.clone())
            .build(InMemDataset::new((0..items).collect::<Vec<usize>>()))
    };
    SupervisedTraining::new(dir, loader(36), loader(9))
        .with_application_logger(None)
        .renderer(Box::new(Silent))
        .num_epochs(2)
}

/// burn-train's Learner, two epochs, the wrapper over two servers and the bare model.
fn the_learner_trains_as_the_bare_one() {
    let servers: Vec<Server> = (0..2).map(|_| Server::start()).collect();
    let devices = devices(&servers);
    let local = devices[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let bare = Mlp::new(&local);
    let dp = DataParallel::new(bare.clone(), devices).unwrap();
    let trained_bare = training(&dir.path().join("bare"), &local)
        .launch(Learner::new(bare, SgdConfig::new().init(), 0.1))
        .model;
    let trained_dp = training(&dir.path().join("wrapped"), &local)
        .launch(Learner::new(dp, SgdConfig::new().init(), 0.1))
        .model;
    assert_same_params(trained_dp.module(), &trained_bare, 1e-5);
}

/// A server killed between steps: the next forward is a `DeviceFailed` naming it, soon;
/// the module is intact, and the wrapper without that device trains on as the bare model
/// does.
fn a_server_that_goes_away_is_a_typed_error() {
    let mut servers: Vec<Server> = (0..2).map(|_| Server::start()).collect();
    let devices = devices(&servers);
    let local = devices[0].clone();
    let bare = Mlp::new(&local);
    let dp = DataParallel::new(bare.clone(), devices.clone()).unwrap();
    let (bare, dp) = train_beside(bare, dp, 2);
    servers[1].kill();
    let start = Instant::now();
    let error = dp
        .try_forward_with(Batch::random(10, &local), |m, batch| Mean(m.loss(batch)))
        .map(|_| ())
        .expect_err("a replica's server is gone");
    let waited = start.elapsed();
    match &error {
        DataParallelError::DeviceFailed {
            replica, device, ..
        } => {
            assert_eq!(*replica, 2, "{error}");
            assert!(
                device.contains(&servers[1].address.replace(":3000", "")),
                "{error}"
            );
        }
        other => panic!("expected DeviceFailed, got {other}"),
    }
    assert!(
        waited < Duration::from_secs(30),
        "the error took {waited:?}"
    );
    let dp = dp.without_device(&devices[2]).unwrap();
    assert_eq!(dp.replica_devices(), &devices[..2]);
    train_beside(bare, dp, 2);
}

/// A remote entry whose server does not answer is refused when the list is parsed.
fn an_address_without_a_server_is_refused() {
    let server = Server::start();
    let entry = server.entry().replace(":3000", ":3001");
    let parsed = format!("cpu,{entry}").parse::<DeviceList>();
    assert!(
        matches!(&parsed, Err(burn_dataparallel::ParseDeviceError::Unreachable { entry: e, .. }) if *e == entry),
        "{parsed:?}"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, port] = args.as_slice()
        && flag == "--serve"
    {
        servers::serve(port.parse().expect("a port"));
        return;
    }
    let tests: [(&str, fn()); 5] = [
        (
            "two_servers_train_as_the_bare_model",
            two_servers_train_as_the_bare_model,
        ),
        (
            "four_servers_train_as_the_bare_model",
            four_servers_train_as_the_bare_model,
        ),
        (
            "the_learner_trains_as_the_bare_one",
            the_learner_trains_as_the_bare_one,
        ),
        (
            "a_server_that_goes_away_is_a_typed_error",
            a_server_that_goes_away_is_a_typed_error,
        ),
        (
            "an_address_without_a_server_is_refused",
            an_address_without_a_server_is_refused,
        ),
    ];
    // `cargo test` passes a filter (and flags) through: run the tests whose names hold it.
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-'));
    let mut failed = Vec::new();
    for (name, test) in tests {
        if filter.is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let start = Instant::now();
        let (done, finished) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            test();
            let _ = done.send(());
        });
        let passed = match finished.recv_timeout(LIMIT) {
            Ok(()) => handle.join().is_ok(),
            Err(mpsc::RecvTimeoutError::Disconnected) => handle.join().is_ok(),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // A hang fails in bounded time; the servers go with the process.
                eprintln!("test {name} did not finish within {LIMIT:?}");
                std::process::exit(1);
            }
        };
        println!(
            "test {name} ... {} ({:.1} s)",
            if passed { "ok" } else { "FAILED" },
            start.elapsed().as_secs_f64()
        );
        if !passed {
            failed.push(name);
        }
    }
    if !failed.is_empty() {
        eprintln!("failed: {failed:?}");
        std::process::exit(1);
    }
}
