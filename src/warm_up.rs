//! [`DataParallel::warm_up`]: one step on a sample batch before training, so that a fresh
//! process compiles and tunes its kernels for the shard shapes training will use.

use std::time::{Duration, Instant};

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use crate::data_parallel::DataParallel;
use crate::error::DataParallelError;
use crate::gather::Sum;
use crate::scatter::Scatter;
use crate::step;

/// What [`DataParallel::warm_up`] did and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmUp {
    /// The sample's shard sizes, one per replica that received items.
    pub shard_sizes: Vec<usize>,
    /// The forward, waited for on every device.
    pub forward: Duration,
    /// The backward, waited for on every device.
    pub backward: Duration,
}

impl WarmUp {
    /// The forward and the backward together.
    pub fn total(&self) -> Duration {
        self.forward + self.backward
    }
}

impl<M: Module> DataParallel<M> {
    /// Runs one forward and backward of `loss` on `sample`, waits for every device, and drops
    /// the gradients: the parameters do not change.
    ///
    /// On GPUs, a process's first steps compile kernels and tune them for each shape; a
    /// sample of the training batch size gives the replicas the shard shapes they will see.
    /// `loss` captures nothing, as in [`forward_with`](Self::forward_with).
    ///
    /// # Errors
    ///
    /// Those of [`try_forward_with`](Self::try_forward_with).
    ///
    /// # Example
    ///
    /// ```
    /// use burn::nn::{Linear, LinearConfig};
    /// use burn::tensor::{Device, Tensor};
    /// use burn_dataparallel::DataParallel;
    ///
    /// let device = Device::flex().autodiff();
    /// let model: Linear = LinearConfig::new(4, 2).init(&device);
    /// let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
    /// let sample = Tensor::<2>::ones([8, 4], &device);
    /// let warm = dp.warm_up(sample, |m, x| m.forward(x).powi_scalar(2).mean()).unwrap();
    /// assert_eq!(warm.shard_sizes, [4, 4]);
    /// ```
    ///
    /// A loss that captures does not compile:
    ///
    /// ```compile_fail,E0308
    /// # use burn::nn::{Linear, LinearConfig};
    /// # use burn::tensor::{Device, Tensor};
    /// # use burn_dataparallel::DataParallel;
    /// # let device = Device::flex().autodiff();
    /// # let model: Linear = LinearConfig::new(4, 2).init(&device);
    /// # let dp = DataParallel::new(model, vec![device.clone(); 2]).unwrap();
    /// let target = Tensor::<2>::zeros([1, 2], &device);
    /// let sample = Tensor::<2>::ones([8, 4], &device);
    /// let warm = dp.warm_up(sample, |m, x| (m.forward(x) - target.clone()).powi_scalar(2).mean());
    /// ```
    #[rustfmt::skip]
    pub fn warm_up<I>( // no captures: tensors go in the sample (`Broadcast`)
        &self,
        sample: I,
        loss: fn(&M, I) -> Tensor<1>,
    ) -> Result<WarmUp, DataParallelError>
    where
        I: Scatter + Send,
    {
        let shards = self.shards(&sample)?;
        let mut devices = shards.devices().to_vec();
        devices.push(self.settings.output_device.clone());
        let start = Instant::now();
        let loss = |replica: &M, shard| Ok(Sum(loss(replica, shard)));
        let Sum(total) = step::forward(&self.module, &self.settings, sample, loss, false)?;
        synchronize(&devices);
        let forward = start.elapsed();
        let start = Instant::now();
        let grads = total.backward();
        synchronize(&devices);
        drop(grads);
        Ok(WarmUp {
            shard_sizes: shards.sizes().to_vec(),
            forward,
            backward: start.elapsed(),
        })
    }
}

/// Waits for the work queued on every one of `devices`.
fn synchronize(devices: &[Device]) {
    for device in devices {
        // A device that failed reports it at its next use; the warm-up's timing needs none.
        let _ = device.sync();
    }
}
