#![warn(missing_docs)]

//! PyTorch-style data parallelism for [Burn](https://burn.dev).
//!
//! Wrap a model in [`DataParallel`] and keep the training loop: every forward splits the batch
//! over several devices, runs one replica per device at the same time, and concatenates the
//! outputs on one device, with gradients flowing back into the one set of parameters.
//!
//! # The pipeline
//!
//! ```text
//! forward(input):
//!   shards   = scatter(input, devices, dim)       // Scatter: split the batch, move each shard
//!   replicas = replicate(module, shard devices)   // differentiable copies of the parameters
//!   outputs  = parallel_apply(replicas, shards)   // one persistent worker thread per device
//!   gather(outputs, output_device, dim)           // Gather: differentiable concatenation
//! ```
//!
//! - [`Scatter`] splits tensors along `dim` and walks tuples, `Vec`, arrays, `Option` and user
//!   structs ([`impl_scatter!`]); other values ([`Shared`], numbers, strings) go to every
//!   replica unchanged.
//! - [`replicate()`] shares parameters with replicas on the same device (no copy) and moves
//!   them to other devices in coalesced buckets ([`DataParallelConfig::bucket_size`], 25 MiB by
//!   default): each bucket is one flat buffer, one transfer out and, in the backward, one
//!   transfer of its gradients back, so gradients of all replicas sum into the original
//!   parameters in a few large transfers instead of one per parameter tensor.
//! - Replicas run on long-lived worker threads, one per entry of the device list, so that
//!   Burn's per-thread state (batch-norm running statistics, CubeCL streams) stays bounded and
//!   correct. A panic or error in a replica comes back as a [`DataParallelError`] naming the
//!   replica and its device.
//! - A forward with one shard on the module's own device (one device, or a batch of one)
//!   skips `replicate` and the workers: the module runs on the calling thread as the bare
//!   model would.
//! - Under `Autodiff`, each replica's backward also runs on its worker, all at the same time
//!   ([`DataParallelConfig::parallel_backward`], on by default): every replica's forward
//!   starts from its own leaves (its copy of the parameters, its input shard) in an autodiff
//!   graph of its own, and its outputs enter the caller's graph as stand-ins. When the
//!   caller's `backward` reaches the stand-ins, each replica runs its own backward, seeded
//!   with its outputs' gradients, and the gradients come back to the parameters (and tracked
//!   inputs) in one transfer per device and dtype. Outputs must be gathered through
//!   [`Gather`] (the provided impls, [`impl_gather!`]), and a replica's forward must not use
//!   tracked tensors captured from outside its inputs; otherwise turn the option off.
//! - [`Gather`] concatenates tensors on the output device; [`Mean`] and [`Sum`] combine
//!   per-replica losses weighted by shard size, so the result is the whole-batch value even
//!   for uneven shards.
//! - Splitting and concatenation run this crate's [`kernels`]: one launch for any number of
//!   inputs on CubeCL backends, recorded as custom operations under `Fusion`, with custom
//!   backward steps under `Autodiff`. Tensors in inputs and outputs therefore need a
//!   [`ConcatBackend`]; [`DataParallelBackend`] is the bound for generic training code.
//!
//! # Semantics
//!
//! - Shards are as even as possible (sizes differ by at most one, larger first), or follow
//!   per-device [shard weights](DataParallelConfig::shard_weights). A batch smaller than the
//!   device count uses fewer replicas; a single shard runs on the calling thread.
//! - After `backward`, the gradients equal those of the bare model on the whole batch (up to
//!   float rounding), for every layer whose output for one item does not depend on the other
//!   items of the batch.
//! - Batch normalization in training normalizes each shard with its own statistics, as in
//!   PyTorch's `DataParallel`. Its running statistics are updated by every replica: after a
//!   forward they hold `(1 - momentum) * previous + momentum * mean_i(stat_i)`, the average
//!   over replicas of what each shard alone would give (each shard counts once, whatever its
//!   size).
//! - The record of a `DataParallel<B, M>` is `M::Record`: checkpoints saved through the wrapper
//!   load into the bare model and back, and optimizers see the same parameter ids.
//!
//! # Example
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::module::Module;
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::{GradientsParams, Optimizer, SgdConfig};
//! use burn::tensor::Tensor;
//! use burn_dataparallel::{DataParallel, Mean};
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let model: Linear<B> = LinearConfig::new(16, 1).init(&device);
//! let mut model = DataParallel::new(model, vec![device; 3]).unwrap();
//! let mut optim = SgdConfig::new().init();
//!
//! let inputs = Tensor::<B, 2>::ones([10, 16], &device);
//! let targets = Tensor::<B, 2>::zeros([10, 1], &device);
//! let Mean(loss) = model.forward_with((inputs, targets), |model, (x, y)| {
//!     Mean((model.forward(x) - y).powi_scalar(2).mean())
//! });
//! let grads = GradientsParams::from_grads(loss.backward(), &model);
//! model = optim.step(0.1, model, grads);
//! ```
//!
#![cfg_attr(feature = "train", doc = include_str!("docs/learner.md"))]
//!
//! # Where a step's time goes
//!
//! [`DataParallel::set_profiling`] turns on a per-step [`StepProfile`]: the time of the
//! scatter, the replication, each replica's forward, the running statistics' averaging, the
//! gather and the backward's gradient transfers, and the bytes each moved between devices.
//! Each stage ends by synchronising its devices, so the times are device times and a
//! profiled step runs slower; when off, a step pays one atomic load. Under `Fusion`, read
//! the second profiled step: the stages' synchronisations cut the queued operations into
//! new fused blocks, whose kernels the first profiled step compiles.
//!
//! ```
//! # use burn::backend::{Autodiff, Flex};
//! # use burn::nn::{Linear, LinearConfig};
//! # use burn::tensor::Tensor;
//! # use burn_dataparallel::DataParallel;
//! # type B = Autodiff<Flex>;
//! # let device = Default::default();
//! # let model: Linear<B> = LinearConfig::new(8, 2).init(&device);
//! let dp = DataParallel::new(model, vec![device; 2]).unwrap();
//! dp.set_profiling(true);
//! let output = dp.forward_with(Tensor::<B, 2>::ones([6, 8], &device), |m, x| m.forward(x));
//! output.sum().backward();
//! println!("{}", dp.profile().unwrap()); // scatter 0.004 ms, replicate 0.021 ms, ...
//! ```
//!
//! # Cold start
//!
//! On a GPU backend the first step of every new shape compiles kernels and autotunes them;
//! on a fresh machine that is seconds to minutes before anything visible happens.
//! [`DataParallel::warm_up`] runs one forward and backward of a sample batch on every replica,
//! so that this cost is paid, and reported, before training:
//!
//! ```
//! # use burn::backend::{Autodiff, Flex};
//! # use burn::nn::{Linear, LinearConfig};
//! # use burn::tensor::Tensor;
//! # use burn_dataparallel::DataParallel;
//! # type B = Autodiff<Flex>;
//! # let device = Default::default();
//! # let model: Linear<B> = LinearConfig::new(8, 2).init(&device);
//! let dp = DataParallel::new(model, vec![device; 2]).unwrap();
//! let sample = Tensor::<B, 2>::zeros([64, 8], &device); // a batch of the training size
//! let warm = dp.warm_up(sample, |m, x| m.forward(x).mean()).unwrap();
//! println!("kernels ready after {:.1} s", warm.total().as_secs_f64());
//! ```
//!
//! Replicas of equal shard size share compiled kernels: even shards differ by at most one
//! item, so a batch gives at most two shard shapes, and a batch size divisible by the device
//! count gives one. The replicas compile at the same time on their worker threads. On a
//! fresh cache and one H200, the wrapper's first step took 0.96–1.02x the bare model's with
//! one, two and four replicas on `CubeBackend`, and 0.89–0.99x with one and two under
//! `Fusion`; four under `Fusion` took 1.22x: Fusion fuses Burn's summing of the replicas'
//! gradients into the weight-gradient matmuls, kernels the bare model does not have, and
//! tunes them once.
//!
//! CubeCL keeps two caches, configured by a `cubecl.toml` (or a `[cubecl]` section of
//! `burn.toml`) found in the working directory or a parent:
//!
//! - autotune results, on by default, in `target/autotune/` of the nearest folder with a
//!   `Cargo.toml` (else the user cache directory, `~/.cache/cubecl` on Linux);
//! - compiled kernels, **off by default**; turn it on with
//!
//! ```toml
//! [compilation]
//! cache = "target"   # or "local" (working directory), "global", or { file = "/path" }
//!
//! [autotune]
//! cache = "target"
//! level = "balanced" # "minimal" tunes far less, for tests and first runs
//! ```
//!
//! Keep those folders between runs (and ship them with a deployed binary) and a later process
//! skips both compilation and tuning for shapes it has seen; `CUBECL_AUTOTUNE_LEVEL=minimal`
//! shortens a fresh run's tuning at some cost in kernel choice.
//!
//! Keep one compilation cache per model (or project), not one for everything: CubeCL 0.10
//! stores it as one file per runtime (`<cache>/cuda/<version>/ptx/chunk0.cbor`) and reads and
//! decodes that file whole the first time a process uses a device, whichever kernels the model
//! needs. A cache holding 2,868 kernels of several models (358 MB) took 7 s to decode on a
//! two-core machine, and put a model that compiled nothing at 6 s to its first step on an
//! H200, where each benchmark model's own cache gives 0.7–0.8 s.
//!
//! On CUDA that cache holds PTX, which the driver compiles for the GPU when a kernel is first
//! loaded and keeps in a cache of its own (`~/.nv/ComputeCache`, moved by `CUDA_CACHE_PATH`).
//! Keep that folder too where home directories do not persist (containers): without it the
//! same first steps took 4.3–5.3 s.
//!
//! Autotune results are kept per device index
//! (`autotune/<version>/device-<type>-<index>-<runtime>/`, CubeCL's `CubeTuneId`), so with
//! several GPUs every GPU tunes every shape once, each on its replica's thread at the same time
//! as the others. On identical GPUs, a copy of device 0's folder under the other indices'
//! names lets them skip it (`scripts/gpu-check.sh` does so).
//!
//! # Coming from `torch.nn.DataParallel`
//!
//! | PyTorch | here |
//! |---|---|
//! | `DataParallel(module, device_ids, output_device, dim)` | [`DataParallel::new`]`(module, devices)` or [`DataParallelConfig`] (`dim`, `output_device` as an index, `shard_weights`) |
//! | `dp(x)` | [`dp.forward(x)`](DataParallel::forward) for a [`Forward`] model, or [`dp.forward_with(x, \|m, x\| ...)`](DataParallel::forward_with) |
//! | exceptions from replicas | [`try_forward`](DataParallel::try_forward) / [`try_forward_with`](DataParallel::try_forward_with) return a [`DataParallelError`] |
//! | `dp.module` | [`dp.module()`](DataParallel::module), [`dp.into_inner()`](DataParallel::into_inner) |
//! | `dp.state_dict()` | `dp.into_record()` — the same record as the bare model's |
//!
//! The classic pitfalls, and what happens here:
//!
//! | pitfall | `torch.nn.DataParallel` | this crate |
//! |---|---|---|
//! | checkpoint prefix | keys saved through the wrapper start with `module.` and do not load into the bare model | the record is the bare model's record, byte for byte, both ways |
//! | batch-norm statistics | only replica 0's running statistics survive a forward | every replica's update is kept, averaged (see Semantics) |
//! | uneven or tiny batches | `chunk` gives ceiling-sized shards (7 over 3: 3, 3, 1); scalar losses are then averaged with equal weights | even shards (3, 2, 2); [`Mean`] weights each replica by its shard size; a batch of one runs on one device; an empty batch is an error |
//! | scalar outputs | 0-dim losses are gathered into a vector, with a warning, to be `.mean()`ed by hand | [`Mean`] / [`Sum`] say how a per-replica value combines; a plain tensor is always concatenated |
//! | imbalanced memory on the first GPU | outputs, loss and gradients land on `device_ids[0]`, which runs out first | [shard weights](DataParallelConfig::shard_weights) give the output device a smaller share; `output_device` can be any listed device |
//! | attributes hidden behind the wrapper | `dp.module.attr` | `dp.module().attr`; the wrapper does not `Deref` to the model, so a model method cannot silently run on one device |
//! | replica failure | exception re-raised from a thread, other replicas keep running | typed error naming the replica and device after all workers finished; the wrapper stays usable |
//! | GIL-bound threads | one Python thread per replica per forward | one persistent OS thread per device, reused by every forward |
//!
//! # Outgrowing one machine
//!
//! `DataParallel` runs in one process and gathers on one device: the outputs, the loss and
//! its backward up to the replicas' outputs run on the output device, and every step moves
//! the parameters out and the gradients back. Across machines there is no `DataParallel` at
//! all. Burn's own distributed data parallel strategy (burn-train with
//! the `ddp` feature, through burn's `distributed` feature on a backend with collectives such
//! as CUDA with NCCL) keeps a full replica per device, each with its own batches, and
//! all-reduces the gradients after every backward. Moving there changes little:
//!
//! - hand the bare model to `Learner::new` (`dp.into_inner()`, or the model before wrapping):
//!   its `TrainStep` and `InferenceStep` are the ones DDP uses; the [`Forward`] impl and the
//!   [`impl_scatter!`] line are no longer needed;
//! - add `.with_training_strategy(ExecutionStrategy::ddp(devices, DistributedConfig {
//!   all_reduce_op: ReduceOperation::Mean }).into())` to `SupervisedTraining`;
//! - the batch size becomes per device: DDP gives each device its own batches, where
//!   `DataParallel` split one batch, so divide the loader's batch size by the device count to
//!   keep the same global batch (or scale the learning rate);
//! - checkpoints need no conversion: a record saved through `DataParallel` is the bare model's
//!   record;
//! - across machines, start the same program on every node with matching collective settings;
//!   the first device of the first node validates and reports.
//!

pub mod backend;
mod config;
mod data_parallel;
mod error;
mod forward;
mod gather;
mod kernels;
mod macros;
mod module;
mod parallel_apply;
mod profile;
mod replicate;
mod running_states;
mod scatter;
mod shards;
mod step;
#[cfg(feature = "train")]
mod train;
mod warm_up;

pub use backend::{ConcatBackend, DataParallelBackend};
pub use config::{DataParallelConfig, LossReduction};
pub use data_parallel::DataParallel;
pub use error::{BoxError, DataParallelError};
pub use forward::Forward;
pub use gather::{Gather, Mean, Sum};
pub use profile::StepProfile;
pub use replicate::{DEFAULT_BUCKET_SIZE, replicate, replicate_with_buckets};
pub use scatter::{Broadcast, Scatter, Shared, merge_batch_size};
pub use shards::{Shards, shard_sizes};
pub use warm_up::WarmUp;
