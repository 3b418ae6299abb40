//! Compiling and tuning every replica's kernels before the first training step.

use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::backend::ConcatBackend;
use crate::backend::comm::synchronize;
use crate::data_parallel::DataParallel;
use crate::data_parallel::own_states;
use crate::error::DataParallelError;
use crate::gather::Sum;
use crate::scatter::Scatter;
use crate::step;

/// What [`DataParallel::warm_up`] did and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmUp {
    /// Items in each shard of the sample, one entry per replica that ran.
    pub shard_sizes: Vec<usize>,
    /// The forward on every replica, up to every device being synchronised.
    pub forward: Duration,
    /// The backward, up to every device being synchronised.
    pub backward: Duration,
}

impl WarmUp {
    /// Forward and backward together.
    pub fn total(&self) -> Duration {
        self.forward + self.backward
    }
}

impl<B: AutodiffBackend + ConcatBackend, M: AutodiffModule<B>> DataParallel<B, M> {
    /// Runs one forward and backward of `sample` on every replica and discards the gradients,
    /// so that CubeCL compiles and tunes the kernels of this shard shape before training.
    ///
    /// On a GPU backend the first step of a shape pays for kernel compilation and autotuning
    /// (seconds to minutes on a fresh cache, see the crate docs on cold start); calling this
    /// with a batch of the training batch size moves that cost to a point where it can be
    /// reported. The replicas compile at the same time, each on its own worker thread, and
    /// share the kernels of equal shard shapes. The parameters are not changed.
    ///
    /// `loss` computes a replica's scalar loss from its shard, capturing nothing (as the
    /// function [`forward_with`](Self::forward_with) takes); the losses of all replicas are
    /// summed for the backward.
    ///
    /// # Shapes
    ///
    /// - sample: as the forward's input, a full batch
    /// - `loss` output: `[1]`
    ///
    /// # Errors
    ///
    /// Those of [`try_forward_with`](Self::try_forward_with).
    ///
    /// # Example
    ///
    /// ```
    /// use burn::backend::{Autodiff, Flex};
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::tensor::Tensor;
    /// use burn_dataparallel::DataParallel;
    ///
    /// type B = Autodiff<Flex>;
    /// let device = Default::default();
    /// let model: Linear<B> = LinearConfig::new(8, 2).init(&device);
    /// let dp = DataParallel::new(model, vec![device; 2]).unwrap();
    ///
    /// let sample = Tensor::<B, 2>::zeros([32, 8], &device);
    /// let warm = dp.warm_up(sample, |m, x| m.forward(x).mean()).unwrap();
    /// assert_eq!(warm.shard_sizes, vec![16, 16]);
    /// println!("warm-up took {:?}", warm.total());
    /// ```
    // rustc shows the next line when a capturing closure is passed (`data_parallel/forwards.rs`).
    #[rustfmt::skip]
    pub fn warm_up<I>( // no captures: tensors go in the sample (`Broadcast`), else warm up with `forward_with_captures`
        &self,
        sample: I,
        loss: fn(&M, I) -> Tensor<B, 1>,
    ) -> Result<WarmUp, DataParallelError>
    where
        I: Scatter<B> + Send,
    {
        let shards = self.shards(&sample)?;
        let mut devices = shards.devices().to_vec();
        devices.push(self.settings.output_device.clone());
        let start = Instant::now();
        // Added element-wise (`Sum`), not reduced: a reduction over the replicas' losses would
        // tune a kernel shape that training never uses.
        // Running states per device as in `TrainStep`: the step that follows may use either.
        let own_states = self.own_states.or(Some(own_states::<B, M>));
        let Sum(total) = step::forward(
            &self.module,
            &self.settings,
            sample,
            |replica, shard| Ok::<_, std::convert::Infallible>(Sum(loss(replica, shard))),
            own_states,
            false,
        )?;
        synchronize::<B>(&devices);
        let forward = start.elapsed();
        let start = Instant::now();
        let grads = total.backward();
        synchronize::<B>(&devices);
        drop(grads);
        Ok(WarmUp {
            shard_sizes: shards.sizes().to_vec(),
            forward,
            backward: start.elapsed(),
        })
    }
}
