#![warn(missing_docs)]

//! PyTorch-style data parallelism for [Burn](https://burn.dev) 0.22.
//!
//! Wrap a model in [`DataParallel`] and keep the training loop: every forward splits the batch
//! over several devices, runs one replica per device at the same time, and concatenates the
//! outputs on one device, with gradients flowing back into the one set of parameters.
//!
//! # The pipeline
//!
//! ```text
//! forward(input):                                   // step.rs
//!   shards   = scatter(input, devices, dim)         // scatter/: split the batch, move each shard
//!                                                   //   (kernels/: one launch on CubeCL devices)
//!   replicas = replicate(module, shard devices)     // replicate.rs: copies of the parameters
//!                                                   //   (transfer.rs: moved together)
//!   outputs  = parallel_apply(replicas, shards)     // parallel_apply.rs: one lane per device
//!   gather(outputs, output_device, dim)             // gather.rs: differentiable concatenation
//!                                                   //   (kernels/: one launch on CubeCL devices)
//! ```
//!
//! - [`Scatter`] splits tensors along `dim` and walks tuples, `Vec`, arrays, `Option`, maps
//!   and user structs (`#[derive(Scatter)]`, or [`impl_scatter!`]); [`Broadcast`] gives a whole tensor to every
//!   replica; other values ([`Shared`], numbers, strings) go to every replica unchanged.
//! - [`replicate()`] shares the parameters with replicas on the module's device and moves
//!   them to other devices as Burn's differentiable `to_device` does, all of them in one
//!   transfer where the target is a CubeCL device (from another, or from Flex).
//! - Replicas run on long-lived threads, one *lane* per entry of the device list, so that
//!   Burn's per-thread state (batch-norm running statistics) stays bounded and correct. A
//!   panic or error in a replica comes back as a [`DataParallelError`] naming the replica and
//!   its device.
//! - A forward with one shard on the module's own device (one device, or a batch of one), and
//!   a wrapper's forward inside another wrapper's replica, run the module itself on the
//!   calling thread, as the bare model would.
//! - [`Gather`] concatenates tensors on the output device; [`Mean`] and [`Sum`] combine
//!   per-replica losses weighted by shard size, so the result is the whole-batch value even
//!   for uneven shards.
//! - Gradients: the moves are Burn's own tracked operations and the split and concatenation
//!   tracked operations of the crate's (each one's backward is the other), so the caller's
//!   `backward()` runs every replica's backward and Burn's autodiff adds the replicas'
//!   gradients of each parameter.
//!
//! # Which forward to call
//!
//! | call | when | a failure comes back as |
//! |---|---|---|
//! | [`DataParallel::forward`] | the model implements [`Forward`]: `dp.forward(x)` where the bare model has `model.forward(x)` | a panic with the error's message |
//! | [`DataParallel::try_forward`] | the same, handling the error | a [`DataParallelError`] |
//! | [`DataParallel::forward_with`] | a function or closure over a replica and its shard that captures nothing | a panic with the error's message |
//! | [`DataParallel::try_forward_with`] | the same, handling the error | a [`DataParallelError`] |
//! | [`DataParallel::try_forward_fallible`] | such a function that can fail itself (`Result<O, E>`) | [`DataParallelError::ReplicaFailed`] holding the `E` |
//! | [`DataParallel::forward_with_captures`], [`try_forward_with_captures`](DataParallel::try_forward_with_captures) | a closure that captures tensors or modules, on the output device's replicas | as above |
//!
//! # Side inputs
//!
//! What a replica needs besides the wrapped module comes through the input:
//!
//! | side input | how | gradient |
//! |---|---|---|
//! | a tensor every replica reads whole (a learnable scale, prototypes) | [`Broadcast`]`(tensor)` | summed over the replicas, as for a parameter |
//! | a tensor with a row per item (targets, a mask) | a field of the input, split like the batch | rows concatenated |
//! | a number, a flag, a string, a `Vec` of them | a field of the input, given to every replica | none |
//! | any other value (a config of your own) | [`Shared`]`(value)`, given to every replica as it is | none |
//! | a second trainable module (a head, an embedding) | inside the wrapped module: `(body, head)` is a module | as the model's own parameters |
//!
//! ```
//! use burn::nn::{Linear, LinearConfig};
//! use burn::tensor::{Device, Tensor};
//! use burn_dataparallel::{Broadcast, DataParallel, Mean};
//!
//! let device = Device::flex().autodiff();
//! let body: Linear = LinearConfig::new(4, 3).init(&device);
//! let head: Linear = LinearConfig::new(3, 2).init(&device);
//! // Body and head trained together: the tuple is the wrapped module.
//! let dp = DataParallel::new((body, head), vec![device.clone(); 2]).unwrap();
//! let temperature = Tensor::<1>::from_floats([2.0], &device).require_grad();
//! let x = Tensor::<2>::ones([6, 4], &device);
//! let y = Tensor::<2>::zeros([6, 2], &device);
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
//! # Semantics
//!
//! - Shards are as even as possible (sizes differ by at most one, larger first), or follow
//!   per-device [shard weights](DataParallelConfig::shard_weights). A batch smaller than the
//!   device count uses fewer replicas. Whatever the split, [`Mean`] losses are weighted by
//!   the shards' shares, so gradients are the whole batch's.
//! - After `backward`, outputs and gradients equal those of the bare model on the whole batch
//!   (up to float rounding), for every layer whose output for one item does not depend on the
//!   other items of the batch.
//! - Batch normalization in training normalizes each shard with its own statistics, as in
//!   PyTorch's `DataParallel`; its running statistics average every replica's update.
//! - The wrapper's parameters are the wrapped module's, under the same names: checkpoints
//!   saved through the wrapper load into the bare model and back, and optimizers see the same
//!   parameter ids.
//! - Devices may be of any kinds Burn names, mixed, including another machine's through
//!   Burn's remote backend ([`DeviceList`]'s `ws://HOST:PORT`, feature `remote`). A device
//!   that stops answering during a step is a [`DataParallelError::DeviceFailed`] naming it;
//!   the module stays intact on the output device.
//! - The replicas run at once where they cannot meet in one autodiff graph while recording
//!   (an input that carries no gradients, no captures), else one after the other: Burn
//!   0.22.1 loses a recorded step when threads record into a graph being merged.
//!
//! # Example
//!
//! ```
//! use burn::module::Module;
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::{GradientsParams, Optimizer, SgdConfig};
//! use burn::tensor::{Device, Tensor};
//! use burn_dataparallel::{DataParallel, Mean};
//!
//! let device = Device::flex().autodiff();
//! let model: Linear = LinearConfig::new(16, 1).init(&device);
//! let mut model = DataParallel::new(model, vec![device.clone(); 3]).unwrap();
//! let mut optim = SgdConfig::new().init();
//!
//! let inputs = Tensor::<2>::ones([10, 16], &device);
//! let targets = Tensor::<2>::zeros([10, 1], &device);
//! let Mean(loss) = model.forward_with((inputs, targets), |model, (x, y)| {
//!     Mean((model.forward(x) - y).powi_scalar(2).mean())
//! });
//! let grads = GradientsParams::from_grads(loss.backward(), &model);
//! model = optim.step(0.1, model, grads);
//! ```

mod balance;
mod config;
mod data_parallel;
mod devices;
mod error;
mod forward;
mod gather;
mod kernels;
mod macros;
mod parallel_apply;
mod profile;
mod replicate;
mod scatter;
mod shards;
mod step;
#[cfg(feature = "train")]
mod train;
mod transfer;
mod warm_up;

pub use balance::AdaptiveShardsConfig;
pub use burn_dataparallel_derive::{Gather, Scatter};
pub use config::{DataParallelConfig, LossReduction};
pub use data_parallel::DataParallel;
pub use devices::{DeviceList, ParseDeviceError};
pub use error::{BoxError, DataParallelError};
pub use forward::Forward;
pub use gather::{Gather, Mean, Sum};
pub use profile::StepProfile;
pub use replicate::replicate;
pub use scatter::{Broadcast, Scatter, Shared, merge_batch_size};
pub use shards::{Shards, shard_sizes};
pub use warm_up::WarmUp;

/// Not part of the API: what the crate's benches set to compare its ways of working.
#[doc(hidden)]
pub mod __bench {
    pub use crate::kernels::{FusionConcat, set_concat_cubes, set_concat_group, set_fusion_concat};
}

/// The README's Rust examples, compiled (and run, where not `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
