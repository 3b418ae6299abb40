#![warn(missing_docs)]

//! PyTorch-style data parallelism for [Burn](https://burn.dev) 0.21.
//!
//! Wrap a model in [`DataParallel`] and keep the training loop: every forward splits the batch
//! over several devices, runs one replica per device at the same time, and concatenates the
//! outputs on one device, with gradients flowing back into the one set of parameters. Under
//! burn-train's `Learner`, the wrapper runs the model's own training step on every replica.
//!
//! # The pipeline
//!
//! ```text
//! forward(input):                                   // step/
//!   shards   = scatter(input, devices, dim)         // scatter/: split the batch, move each shard
//!   replicas = replicate(module, shard devices)     // replicate/: copies of the parameters
//!   outputs  = parallel_apply(replicas, shards)     // parallel_apply.rs: one lane per device
//!   gather(outputs, output_device, dim)             // gather.rs: differentiable concatenation
//! ```
//!
//! - [`Scatter`] splits tensors along `dim` and walks tuples, `Vec`, arrays, `Option`, maps
//!   and user structs ([`impl_scatter!`]); [`Broadcast`] gives a whole tensor to every
//!   replica; other values ([`Shared`], numbers, strings) go to every replica unchanged.
//! - [`replicate()`] shares parameters with replicas on the same device (no copy) and moves
//!   them to other devices in coalesced buckets ([`DataParallelConfig::bucket_size`], 25 MiB
//!   by default): one flat buffer and one transfer per bucket.
//! - Replicas run on long-lived threads, one *lane* per entry of the device list, so that
//!   Burn's per-thread state (batch-norm running statistics) stays bounded and correct; all
//!   of a step's work on a device queues on the CubeCL stream of the thread that called the
//!   wrapper (CubeCL 0.10 lets one stream reuse memory that another stream's queued work
//!   still reads). A wrapper keeps exactly one thread per entry of its device list: a
//!   replica backward that finds its lane busy (several forwards before one backward, as in
//!   gradient accumulation) runs on a spare thread that ends with it. A panic or error in a
//!   replica comes back as a [`DataParallelError`] naming the replica and its device.
//! - A forward with one shard on the module's own device (one device, or a batch of one), and
//!   a wrapper's forward inside another wrapper's replica, run the module itself on the
//!   calling thread, as the bare model would.
//! - Under `Autodiff`, each replica's backward runs on its lane, all at the same time
//!   ([`DataParallelConfig::parallel_backward`], on by default; see *The parallel backward*
//!   below): each replica's forward starts from leaves of its own, its outputs enter the
//!   caller's graph as stand-ins, and the caller's `backward` runs the replicas' backwards
//!   and sums their gradients into the parameters (and tracked inputs) in one transfer per
//!   device and dtype, or, with [`DataParallelConfig::overlap_reduce`], in buckets of at
//!   most `bucket_size` bytes while the replicas' backwards still run.
//! - [`Gather`] concatenates tensors on the output device; [`Mean`] and [`Sum`] combine
//!   per-replica losses weighted by shard size, so the result is the whole-batch value even
//!   for uneven shards.
//! - Every transfer is in [`backend`]'s `comm` (the way `torch/nn/parallel/comm.py` holds
//!   `broadcast_coalesced` and `reduce_add_coalesced`), and so is every sum of the replicas'
//!   gradients under the parallel backward and on the Learner path (`comm/reduce.rs`). Under
//!   the single backward (`DataParallelConfig::new().with_parallel_backward(false)`, always on
//!   `Fusion`, and on the exact path) the replicas' gradients of a parameter meet in Burn's
//!   own autodiff, which adds the gradients that reach one node. Splitting and concatenation run this crate's CubeCL kernels:
//!   one launch for any number of inputs, recorded as custom operations under `Fusion`, with
//!   custom backward steps under `Autodiff`. Tensors in inputs and outputs therefore need a
//!   [`ConcatBackend`]; [`DataParallelBackend`] is the bound for generic training code.
//!
//! # Which forward to call
//!
//! | call | when | a failure comes back as |
//! |---|---|---|
//! | [`DataParallel::forward`] | the model implements [`Forward`]: `dp.forward(x)` where the bare model has `model.forward(x)` | a panic with the error's message |
//! | [`DataParallel::try_forward`] | the same, handling the error | a [`DataParallelError`] |
//! | [`DataParallel::forward_with`] | a function or closure over a replica and its shard that captures nothing: a loss inside the replicas, a model without [`Forward`] | a panic with the error's message |
//! | [`DataParallel::try_forward_with`] | the same, handling the error | a [`DataParallelError`] |
//! | [`DataParallel::try_forward_fallible`] | such a function that can fail itself (`Result<O, E>`) | [`DataParallelError::ReplicaFailed`] holding the `E` |
//! | [`DataParallel::forward_with_captures`], [`try_forward_with_captures`](DataParallel::try_forward_with_captures) | a closure that captures tensors or modules, on one device's replicas: the exact path (one graph, one backward) | as above |
//! | burn-train's `TrainStep` / `InferenceStep` | the wrapper handed to the `Learner` | a panic (burn-train's steps have no error channel) |
//!
//! # Side inputs
//!
//! The function [`forward_with`](DataParallel::forward_with) takes captures nothing: a
//! closure that captures a tensor or a module does not compile, because the wrapper could
//! not give what it captures its gradient (each replica's backward runs on a graph of its
//! own). What a replica needs besides the wrapped module comes through the input:
//!
//! | side input | how | gradient |
//! |---|---|---|
//! | a tensor every replica reads whole (a learnable scale, prototypes) | [`Broadcast`]`(tensor)` | summed over the replicas, as for a parameter |
//! | a tensor with a row per item (targets, a mask) | a field of the input, split like the batch | rows concatenated |
//! | a number, a flag, a string, a `Vec` of them | a field of the input, given to every replica | none |
//! | any other value (a config of your own) | [`Shared`]`(value)`, given to every replica as it is | the exact path (see [`Shared`]) |
//! | a second trainable module (a head, an embedding) | inside the wrapped module: `(body, head)` is a module | as the model's own parameters |
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::{Linear, LinearConfig};
//! use burn::tensor::Tensor;
//! use burn_dataparallel::{Broadcast, DataParallel, Mean};
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let body: Linear<B> = LinearConfig::new(4, 3).init(&device);
//! let head: Linear<B> = LinearConfig::new(3, 2).init(&device);
//! // Body and head trained together: the tuple is the wrapped module.
//! let dp = DataParallel::new((body, head), vec![device; 2]).unwrap();
//! let temperature = Tensor::<B, 1>::from_floats([2.0], &device).require_grad();
//! let x = Tensor::<B, 2>::ones([6, 4], &device);
//! let y = Tensor::<B, 2>::zeros([6, 2], &device);
//! let Mean(loss) = dp.forward_with(
//!     (x, y, Broadcast(temperature.clone()), 0.5),
//!     |(body, head), (x, y, Broadcast(t), weight)| {
//!         let logits = head.forward(body.forward(x)) / t.unsqueeze();
//!         Mean((logits - y).powi_scalar(2).mean().mul_scalar(weight))
//!     },
//! );
//! let grads = loss.backward();
//! assert!(temperature.grad(&grads).is_some());
//! assert!(dp.module().1.weight.grad(&grads).is_some());
//! ```
//!
//! Where a closure has to capture, [`forward_with_captures`](DataParallel::forward_with_captures)
//! takes it and gives every tracked tensor it reaches the bare model's gradient: the replicas'
//! forwards join one graph and the caller's backward runs them all, without the parallel
//! backward. A value reached through a global (a `static`) is beyond what the types show:
//! the wrapper refuses what it can see of it ([`DataParallelError::CapturedTensor`]).
//!
//! # Semantics
//!
//! - Shards are as even as possible (sizes differ by at most one, larger first), follow
//!   per-device [shard weights](DataParallelConfig::shard_weights), or follow the replicas'
//!   measured times ([adaptive shards](DataParallelConfig::adaptive_shards)). A batch smaller
//!   than the device count uses fewer replicas. Whatever the split, the losses are weighted
//!   by the shards' shares, so gradients are the whole batch's.
//! - After `backward`, outputs and gradients equal those of the bare model on the whole batch
//!   (up to float rounding), for every layer whose output for one item does not depend on the
//!   other items of the batch; a tracked input the replicas do not differentiate through gets
//!   no gradient, as with the bare model. Any graph around the wrapper works: several
//!   forwards before one backward, several backwards, the wrapper applied to its own output,
//!   several wrappers in one loss.
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
#![doc = include_str!("docs/parallel_backward.md")]
#![doc = include_str!("docs/devices.md")]
#![doc = include_str!("docs/pytorch.md")]
#![doc = include_str!("docs/profile_and_cold_start.md")]
#![doc = include_str!("docs/outgrowing.md")]

pub mod backend;
mod backward;
mod balance;
mod config;
mod data_parallel;
mod error;
mod forward;
mod gather;
#[cfg(feature = "cubecl")]
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

pub use backend::comm::ReduceBucket;
pub use backend::{ConcatBackend, ConcatOps, DataParallelBackend, ReplicaOps, TransferOps};
pub use balance::AdaptiveShardsConfig;
pub use config::{DataParallelConfig, LossReduction};
pub use data_parallel::DataParallel;
pub use error::{BoxError, DataParallelError};
pub use forward::Forward;
pub use gather::{Gather, Mean, Sum};
pub use profile::{StepProfile, bytes_moved};
pub use replicate::{DEFAULT_BUCKET_SIZE, replicate, replicate_with_buckets};
pub use scatter::{Broadcast, Scatter, Shared, merge_batch_size};
pub use shards::{Shards, shard_sizes};
pub use warm_up::WarmUp;

/// `CubeBackend` on CUDA, without fusion: the backend for several CUDA GPUs, whose replicas'
/// backwards run at the same time. `Autodiff<CubeCuda>` trains; devices are
/// [`CudaDevice`]`{ index }`, numbered as `nvidia-smi` does.
#[cfg(feature = "cuda")]
pub type CubeCuda<F = f32, I = i32> = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, F, I, u8>;

/// A CUDA GPU, by its index (`CudaDevice { index: 0 }`).
#[cfg(feature = "cuda")]
pub use cubecl::cuda::CudaDevice;

/// `CubeBackend` on wgpu (Vulkan, Metal, DX12), without fusion: GPUs without CUDA, tensors
/// between them moved through host memory. Devices are [`WgpuDevice`]s
/// (`WgpuDevice::DiscreteGpu(0)`).
#[cfg(feature = "wgpu")]
pub type CubeWgpu<F = f32, I = i32> =
    burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, F, I, u32>;

/// A wgpu device (`WgpuDevice::DiscreteGpu(0)`, `WgpuDevice::DefaultDevice`).
#[cfg(feature = "wgpu")]
pub use cubecl::wgpu::WgpuDevice;

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
