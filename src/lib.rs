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
//! - [`replicate()`] shares parameters with replicas on the same device and moves them with a
//!   differentiable `to_device` to other devices, so gradients of all replicas sum into the
//!   original parameters.
//! - Replicas run on long-lived worker threads, one per entry of the device list, so that
//!   Burn's per-thread state (batch-norm running statistics, CubeCL streams) stays bounded and
//!   correct. A panic or error in a replica comes back as a [`DataParallelError`] naming the
//!   replica and its device.
//! - [`Gather`] concatenates tensors on the output device; [`Mean`] and [`Sum`] combine
//!   per-replica losses weighted by shard size, so the result is the whole-batch value even
//!   for uneven shards.
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

mod config;
mod data_parallel;
mod error;
mod gather;
mod macros;
mod module;
mod ops;
mod parallel_apply;
mod replicate;
mod scatter;
mod shards;
#[cfg(feature = "train")]
mod train;

pub use config::DataParallelConfig;
pub use data_parallel::{DataParallel, Forward};
pub use error::{BoxError, DataParallelError};
pub use gather::{Gather, Mean, Sum};
pub use replicate::replicate;
pub use scatter::{Scatter, Shared, merge_batch_size};
pub use shards::{Shards, shard_sizes};
#[cfg(feature = "train")]
pub use train::StepOutput;

#[doc(hidden)]
pub mod __private {
    pub use burn::tensor::backend::Backend;
}
