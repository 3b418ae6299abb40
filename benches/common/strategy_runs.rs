//! The ways of training that `benches/strategies.rs` compares, and how each one runs a
//! model for some steps: the wrapper's own loop, the `Learner` (bare, wrapped, or with
//! burn-train's `MultiDevice`), and burn-collective's all-reduce between peers.

use std::time::{Duration, Instant};

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::train::{ExecutionStrategy, Learner, MultiDeviceOptim};
use burn_dataparallel::{DataParallel, DataParallelBackend, DataParallelConfig, Mean};

use crate::learner_steps::{Batch, Random, STARTS};
use crate::models::{Model, Sizes};
use crate::thread_cpu::thread_cpu;
use dataparallel_dev::quiet_training;

/// The ways of training that the bench compares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// The bare model under the `Learner`, on one device.
    Bare,
    /// `DataParallel` in a hand-written loop (`forward_with`, the gathered loss's backward).
    WrapperLoop,
    /// `DataParallel` under the `Learner` (the model's own `TrainStep` on every replica).
    WrapperLearner,
    /// The same with `sync_learner_steps(false)`: the wrapper hands each step's item to
    /// burn-train's metric thread without waiting for the device.
    WrapperLearnerUnsynced,
    /// burn-train's `MultiDevice`, optimizer on the main device.
    MultiDeviceMain,
    /// burn-train's `MultiDevice`, optimizer sharded over the devices.
    MultiDeviceSharded,
    /// One peer per device (threads), each with the whole model and a batch of `G / N`,
    /// averaging gradients with burn-collective's all-reduce before its own optimizer step:
    /// DDP's algorithm, in the form Burn 0.21 runs on every backend.
    AllReduce,
}

impl Strategy {
    /// Every strategy, the bare Learner first.
    pub const ALL: [Strategy; 7] = [
        Strategy::Bare,
        Strategy::WrapperLoop,
        Strategy::WrapperLearner,
        Strategy::WrapperLearnerUnsynced,
        Strategy::MultiDeviceMain,
        Strategy::MultiDeviceSharded,
        Strategy::AllReduce,
    ];

    /// The strategy whose [`key`](Self::key) is `key`.
    pub fn from_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.key() == key)
    }

    /// The strategy's name in `STRATEGIES_ONLY`.
    pub fn key(self) -> &'static str {
        match self {
            Strategy::Bare => "bare",
            Strategy::WrapperLoop => "loop",
            Strategy::WrapperLearner => "learner",
            Strategy::WrapperLearnerUnsynced => "unsynced",
            Strategy::MultiDeviceMain => "main",
            Strategy::MultiDeviceSharded => "sharded",
            Strategy::AllReduce => "allreduce",
        }
    }

    pub fn name(self, n: usize) -> String {
        match self {
            Strategy::Bare => "bare, Learner".into(),
            Strategy::WrapperLoop => format!("DataParallel x{n}, own loop"),
            Strategy::WrapperLearner => format!("DataParallel x{n}, Learner"),
            Strategy::WrapperLearnerUnsynced => {
                format!("DataParallel x{n}, Learner, items not synced")
            }
            Strategy::MultiDeviceMain => format!("MultiDevice x{n}, OptimMainDevice"),
            Strategy::MultiDeviceSharded => format!("MultiDevice x{n}, OptimSharded"),
            Strategy::AllReduce => format!("burn-collective all-reduce x{n}, own loop"),
        }
    }
}

/// What the bench runs for one model on one backend.
pub struct Setup<B: Backend> {
    pub model: String,
    pub sizes: Sizes,
    pub batch: usize,
    pub steps: (usize, usize),
    pub template: Model<B>,
}

impl<B: DataParallelBackend> Setup<B> {
    /// A fresh copy of the one model every configuration starts from.
    fn model(&self) -> Model<B> {
        self.template.clone()
    }

    fn random(&self) -> Random {
        Random {
            model: self.model.clone(),
            sizes: self.sizes,
        }
    }

    /// Trains `warm + timed` steps in one of the ways; the step times after the warm-up, and
    /// the calling thread's CPU time per step over the whole run (setup included).
    pub fn run(&self, strategy: Strategy, replicas: usize) -> (Vec<Duration>, Option<Duration>) {
        let cpu_start = thread_cpu();
        let devices = dataparallel_dev::spread::<B>(replicas);
        let (warm, timed) = self.steps;
        let steps = warm + timed + 1;
        STARTS.lock().unwrap().clear();
        let model = self.model();
        let per_step = match strategy {
            Strategy::Bare => 1,
            _ => replicas,
        };
        // The all-reduce's peers are threads of their own: peer 0's CPU per step stands for
        // the calling thread's, which only waits for them.
        let peer_cpu = match strategy {
            Strategy::WrapperLoop => {
                self.own_loop(model, devices, steps);
                None
            }
            Strategy::AllReduce => self.all_reduce(model, devices, steps),
            _ => {
                self.learner(strategy, model, devices, steps);
                None
            }
        };
        let starts = std::mem::take(&mut *STARTS.lock().unwrap());
        assert_eq!(
            starts.len(),
            steps * per_step,
            "one start per replica and step"
        );
        // A step's start is its first replica's.
        let firsts: Vec<Instant> = starts
            .chunks(per_step)
            .map(|c| *c.iter().min().unwrap())
            .collect();
        let cpu = thread_cpu()
            .zip(cpu_start)
            .map(|(end, start)| (end - start) / steps as u32);
        let cpu = peer_cpu.or(cpu);
        let times = firsts.windows(2).skip(warm).map(|w| w[1] - w[0]).collect();
        (times, cpu)
    }

    /// `steps` steps of the wrapper in a hand-written loop, with SGD.
    fn own_loop(&self, model: Model<B>, devices: Vec<B::Device>, steps: usize) {
        let device = B::Device::default();
        let mut dp = DataParallel::new(model, devices)
            .expect("replica devices")
            .with_running_states_per_device();
        let mut optim = SgdConfig::new().init();
        for _ in 0..steps {
            let batch: Batch<B> = self.random().batch(vec![0; self.batch], &device);
            let Mean(loss) = dp.forward_with(batch, |m, batch| {
                // The same start mark as the model's own step.
                B::sync(&batch.targets.device()).expect("sync");
                STARTS.lock().unwrap().push(Instant::now());
                Mean(m.classify(batch).loss)
            });
            let grads = GradientsParams::from_grads(loss.backward(), &dp);
            dp = optim.step(0.01, dp, grads);
        }
        B::sync(&device).expect("sync");
    }

    /// `steps` steps of [`Strategy::AllReduce`], with SGD; peer 0's thread CPU per step.
    fn all_reduce(
        &self,
        model: Model<B>,
        devices: Vec<B::Device>,
        steps: usize,
    ) -> Option<Duration> {
        let peers = devices.len();
        let config = CollectiveConfig::default().with_num_devices(peers);
        collective::reset_collective::<B::InnerBackend>();
        let local = self.batch / peers;
        std::thread::scope(|scope| {
            let handles: Vec<_> = (devices.into_iter().enumerate())
                .map(|(peer, device)| {
                    // Leaves of the peer's own (the same values on every peer).
                    let model = Model::<B>::from_inner(model.valid()).fork(&device);
                    let config = config.clone();
                    scope.spawn(move || {
                        let id = PeerId::from(peer);
                        collective::register::<B::InnerBackend>(id, device.clone(), config)
                            .expect("register with the collective");
                        let cpu_start = thread_cpu();
                        let (mut model, mut optim) = (model, SgdConfig::new().init());
                        for _ in 0..steps {
                            let batch: Batch<B> = self.random().batch(vec![0; local], &device);
                            B::sync(&device).expect("sync");
                            STARTS.lock().unwrap().push(Instant::now());
                            let loss = model.classify(batch).loss;
                            let grads = GradientsParams::from_grads(loss.backward(), &model)
                                .all_reduce::<B::InnerBackend>(id, ReduceOperation::Mean)
                                .expect("all-reduce");
                            model = optim.step(0.01, model, grads);
                        }
                        B::sync(&device).expect("sync");
                        collective::finish_collective::<B::InnerBackend>(id)
                            .expect("leave the collective");
                        let cpu = thread_cpu().zip(cpu_start);
                        cpu.map(|(end, start)| (end - start) / steps as u32)
                    })
                })
                .collect();
            let cpus: Vec<_> = (handles.into_iter())
                .map(|h| h.join().expect("a peer panicked"))
                .collect();
            cpus[0]
        })
    }

    /// `steps` steps under the `Learner`, with SGD, in one epoch.
    fn learner(&self, strategy: Strategy, model: Model<B>, devices: Vec<B::Device>, steps: usize) {
        let device = B::Device::default();
        // `MultiDevice` takes one batch of the data loader per device and step.
        let loaders = match strategy {
            Strategy::MultiDeviceMain | Strategy::MultiDeviceSharded => devices.len(),
            _ => 1,
        };
        let loader_batch = self.batch / loaders;
        let global = loader_batch * loaders;
        let train = DataLoaderBuilder::new(self.random())
            .batch_size(loader_batch)
            .set_device(device.clone())
            .build(InMemDataset::new((0..(steps * global) as u64).collect()));
        let valid = DataLoaderBuilder::new(self.random())
            .batch_size(1)
            .set_device(device.clone())
            .build(InMemDataset::new(vec![0u64]));
        let dir = tempfile::tempdir().expect("a temporary folder");
        // One epoch, nothing logged or shown (a macro: its type follows the model's).
        macro_rules! training {
            () => {
                quiet_training!(dir.path(), train, valid, 1)
            };
        }
        match strategy {
            Strategy::Bare => {
                training!().launch(Learner::new(model, SgdConfig::new().init(), 0.01));
            }
            Strategy::WrapperLearner | Strategy::WrapperLearnerUnsynced => {
                let dp = DataParallelConfig::new()
                    .with_sync_learner_steps(strategy == Strategy::WrapperLearner)
                    .init(model, devices)
                    .expect("replica devices")
                    .with_running_states_per_device();
                training!().launch(Learner::new(dp, SgdConfig::new().init(), 0.01));
            }
            Strategy::MultiDeviceMain | Strategy::MultiDeviceSharded => {
                let mode = match strategy {
                    Strategy::MultiDeviceMain => MultiDeviceOptim::OptimMainDevice,
                    _ => MultiDeviceOptim::OptimSharded,
                };
                training!()
                    .with_training_strategy(ExecutionStrategy::MultiDevice(devices, mode).into())
                    .launch(Learner::new(model, SgdConfig::new().init(), 0.01));
            }
            Strategy::WrapperLoop | Strategy::AllReduce => unreachable!("not under the Learner"),
        }
        B::sync(&device).expect("sync");
    }
}
