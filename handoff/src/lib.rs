//! The hand-off from `DataParallel` to burn-collective's all-reduce, the code behind the crate
//! docs' chapter "Outgrowing one machine": the model and its data, training through the
//! wrapper, the checkpoint, and the peers (threads of one process) that continue from it.
//! `examples/ddp_handoff.rs` runs it, `tests/ddp_handoff.rs` checks it, and the `multinode/`
//! workspace runs the peers as processes. [`barrier`] reproduces burn-collective 0.21.0's
//! multi-node barrier fault in one process.

pub mod barrier;

use std::path::Path;

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::module::AutodiffModule;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer, Sgd, SgdConfig};
use burn::record::{DefaultFileRecorder, FullPrecisionSettings, RecorderError};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_dataparallel::{ConcatBackend, DataParallel, DataParallelBackend, Forward};

/// A small classifier of points in 8 dimensions into 4 classes.
#[derive(Module, Debug)]
pub struct Classifier<B: Backend> {
    hidden: Linear<B>,
    activation: Relu,
    output: Linear<B>,
}

impl<B: Backend> Classifier<B> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(8, 32).init(device),
            activation: Relu::new(),
            output: LinearConfig::new(32, 4).init(device),
        }
    }

    fn logits(&self, points: Tensor<B, 2>) -> Tensor<B, 2> {
        self.output
            .forward(self.activation.forward(self.hidden.forward(points)))
    }
}

impl<B: ConcatBackend> Forward<B> for Classifier<B> {
    type Input = Tensor<B, 2>;
    type Output = Tensor<B, 2>;

    fn forward(&self, points: Tensor<B, 2>) -> Tensor<B, 2> {
        self.logits(points)
    }
}

/// One global batch: points and their labels, as plain data so that every peer and device
/// builds the same tensors.
#[derive(Clone)]
pub struct Batch {
    pub points: TensorData,
    pub labels: TensorData,
}

impl Batch {
    fn len(&self) -> usize {
        self.points.shape[0]
    }

    /// Rows `rows` of the batch on `device`.
    fn tensors<B: Backend>(
        &self,
        rows: std::ops::Range<usize>,
        device: &B::Device,
    ) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let points = Tensor::<B, 2>::from_data(self.points.clone(), device).slice(rows.clone());
        let labels = Tensor::<B, 1, Int>::from_data(self.labels.clone(), device).slice(rows);
        (points, labels)
    }
}

/// `count` global batches of `size` points around four centres, labelled by their centre;
/// the same for every call with the same arguments (a fixed linear congruential sequence).
pub fn batches(count: usize, size: usize) -> Vec<Batch> {
    let mut state = 0x2545_f491_u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    let centres: Vec<f32> = (0..4 * 8).map(|_| 2.0 * next()).collect();
    (0..count)
        .map(|_| {
            let labels: Vec<i64> = (0..size)
                .map(|_| ((next() + 1.0) * 2.0) as i64 % 4)
                .collect();
            let points: Vec<f32> = labels
                .iter()
                .flat_map(|&l| (0..8).map(move |d| (l as usize, d)))
                .map(|(l, d)| centres[l * 8 + d] + next())
                .collect();
            Batch {
                points: TensorData::new(points, [size, 8]),
                labels: TensorData::new(labels, [size]),
            }
        })
        .collect()
}

/// The optimizer of both runs, with its learning rate: each run starts it fresh (a module
/// checkpoint holds no optimizer state).
#[derive(Clone, Copy, Debug)]
pub enum Optim {
    Adam(f64),
    Sgd(f64),
}

/// An optimizer of [`Optim`]'s kind for module `M`.
enum Stepper<B: AutodiffBackend, M: AutodiffModule<B>> {
    Adam(OptimizerAdaptor<Adam, M, B>, f64),
    Sgd(OptimizerAdaptor<Sgd<B::InnerBackend>, M, B>, f64),
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Stepper<B, M> {
    fn new(optim: Optim) -> Self {
        match optim {
            Optim::Adam(lr) => Self::Adam(AdamConfig::new().init(), lr),
            Optim::Sgd(lr) => Self::Sgd(SgdConfig::new().init(), lr),
        }
    }

    fn step(&mut self, module: M, grads: GradientsParams) -> M {
        match self {
            Self::Adam(optim, lr) => optim.step(*lr, module, grads),
            Self::Sgd(optim, lr) => optim.step(*lr, module, grads),
        }
    }
}

/// Trains `model` through `DataParallel` over `devices` on `batches` (one step each, with
/// `optim`); returns the model and each step's loss.
pub fn train_data_parallel<B: DataParallelBackend>(
    model: Classifier<B>,
    devices: Vec<B::Device>,
    batches: &[Batch],
    optim: Optim,
) -> (Classifier<B>, Vec<f32>) {
    let device = devices[0].clone();
    let mut dp = DataParallel::new(model, devices).expect("valid devices");
    let mut optim = Stepper::new(optim);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut losses = Vec::new();
    for batch in batches {
        let (points, labels) = batch.tensors::<B>(0..batch.len(), &device);
        let loss = loss_fn.forward(dp.forward(points), labels);
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = optim.step(dp, grads);
    }
    (dp.into_inner(), losses)
}

/// Saves `model` where the distributed run will find it: the checkpoint saved through the
/// wrapper is the bare model's (`into_inner`, or the wrapper itself, give the same record).
/// The recorder keeps every bit of the parameters (full precision), so the distributed run
/// starts from exactly the wrapper's model.
pub fn save<B: Backend>(model: Classifier<B>, path: &Path) -> Result<(), RecorderError> {
    model.save_file(path, &DefaultFileRecorder::<FullPrecisionSettings>::new())
}

/// The model saved at `path` by [`save`], on `device`.
pub fn load<B: Backend>(path: &Path, device: &B::Device) -> Result<Classifier<B>, RecorderError> {
    Classifier::new(device).load_file(
        path,
        &DefaultFileRecorder::<FullPrecisionSettings>::new(),
        device,
    )
}

/// Step 1 of the hand-off programs: trains `model` through the wrapper on `replicas` copies of
/// `device` over `batches`, prints the first and last loss, and saves the checkpoint into a
/// fresh folder of the system's temporary folder named after `program`. Returns the
/// checkpoint's path.
pub fn train_and_save<B: DataParallelBackend>(
    program: &str,
    device: &B::Device,
    replicas: usize,
    batches: &[Batch],
    optim: Optim,
) -> std::path::PathBuf {
    let model = Classifier::<B>::new(device);
    let devices = vec![device.clone(); replicas];
    let (model, losses) = train_data_parallel(model, devices, batches, optim);
    let last = losses.len() - 1;
    println!(
        "DataParallel, {} steps: loss {:.4} -> {:.4}",
        losses.len(),
        losses[0],
        losses[last]
    );
    let dir = std::env::temp_dir().join(format!("{program}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a checkpoint folder");
    let path = dir.join("classifier");
    save(model, &path).expect("save the checkpoint");
    path
}

/// What one peer of the distributed run saw.
pub struct PeerRun<B: Backend> {
    /// The model as loaded from the checkpoint, before any step.
    pub loaded: Classifier<B>,
    /// The model after the last step.
    pub trained: Classifier<B>,
    /// Each step's loss on this peer's slice of the batch.
    pub losses: Vec<f32>,
}

/// Continues training from the checkpoint at `path` with one peer per device in `devices`,
/// threads of this process, as burn-collective's all-reduce does it: every peer loads the
/// checkpoint, takes its slice of each global batch (the batch split into equal slices, peer
/// `i` the `i`-th), computes its gradients, averages them with the other peers'
/// (`ReduceOperation::Mean`) and steps its own optimizer (`optim`). Returns each peer's run,
/// in peer order.
///
/// # Panics
///
/// If a global batch does not split into equal slices over the peers (the mean of the
/// slices' mean-loss gradients is then not the whole batch's), or if a collective operation
/// fails.
pub fn train_all_reduce<B: AutodiffBackend>(
    path: &Path,
    devices: Vec<B::Device>,
    batches: &[Batch],
    optim: Optim,
) -> Vec<PeerRun<B>> {
    let peers = devices.len();
    let config = CollectiveConfig::default().with_num_devices(peers);
    collective::reset_collective::<B::InnerBackend>();
    std::thread::scope(|scope| {
        let runs: Vec<_> = devices
            .into_iter()
            .enumerate()
            .map(|(peer, device)| {
                let config = config.clone();
                let slice = Slice {
                    index: peer,
                    count: peers,
                };
                scope.spawn(move || {
                    run_peer::<B>(
                        PeerId::from(peer),
                        slice,
                        device,
                        config,
                        path,
                        batches,
                        optim,
                    )
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a peer panicked"))
            .collect()
    })
}

/// The slice of every global batch that one peer takes.
#[derive(Clone, Copy, Debug)]
pub struct Slice {
    pub index: usize,
    pub count: usize,
}

/// One peer's training: registered with the collective under `id`, from the checkpoint at
/// `path`, on its `slice` of every batch.
pub fn run_peer<B: AutodiffBackend>(
    id: PeerId,
    slice: Slice,
    device: B::Device,
    config: CollectiveConfig,
    path: &Path,
    batches: &[Batch],
    optim: Optim,
) -> PeerRun<B> {
    assert!(
        batches.iter().all(|b| b.len() % slice.count == 0),
        "every global batch must split into {} equal slices",
        slice.count
    );
    collective::register::<B::InnerBackend>(id, device.clone(), config)
        .expect("register with the collective");
    let loaded = load::<B>(path, &device).expect("the wrapper's checkpoint");
    let mut model = loaded.clone();
    let mut optim = Stepper::new(optim);
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut losses = Vec::new();
    for batch in batches {
        let rows = batch.len() / slice.count;
        let rows = slice.index * rows..(slice.index + 1) * rows;
        let (points, labels) = batch.tensors::<B>(rows, &device);
        let loss = loss_fn.forward(model.logits(points), labels);
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &model)
            .all_reduce::<B::InnerBackend>(id, ReduceOperation::Mean)
            .expect("all-reduce of the gradients");
        model = optim.step(model, grads);
    }
    collective::finish_collective::<B::InnerBackend>(id).expect("leave the collective");
    PeerRun {
        loaded,
        trained: model,
        losses,
    }
}

/// Every float parameter of `model`, flattened, in module order.
pub fn parameters<B: Backend>(model: &Classifier<B>) -> Vec<f32> {
    struct Flatten(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Flatten {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data().convert::<f32>();
            self.0.extend(data.as_slice::<f32>().expect("f32 data"));
        }
    }
    let mut flatten = Flatten(Vec::new());
    model.visit(&mut flatten);
    flatten.0
}

/// The largest difference between `a` and `b` relative to `b`'s largest magnitude.
pub fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "the same parameters");
    let scale = b
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// The hand-off tests' data: `BATCHES` global batches of `ROWS` rows (equal slices for 2, 3
/// and 4 peers and replicas), the first `HALF` trained through the wrapper, the rest after
/// the hand-off.
pub const BATCHES: usize = 12;
pub const ROWS: usize = 12;
pub const HALF: usize = 6;

/// The first half of a hand-off test: `HALF` steps through the wrapper (three replicas), and
/// the checkpoint saved as `dir/classifier`. Returns the batches and the saved parameters.
pub fn first_half<B: DataParallelBackend>(
    device: &B::Device,
    optim: Optim,
    dir: &Path,
) -> (Vec<Batch>, Vec<f32>) {
    let all = batches(BATCHES, ROWS);
    let model = Classifier::<B>::new(device);
    let (model, _) = train_data_parallel(model, vec![device.clone(); 3], &all[..HALF], optim);
    let saved = parameters(&model);
    save(model, &dir.join("classifier")).expect("save");
    (all, saved)
}

/// A free TCP port on the loopback interface.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("an address").port()
}
