//! Serialisable settings of a [`DataParallel`](crate::DataParallel), and the settings every
//! copy of a wrapper carries.

use std::sync::{Arc, Mutex};

use burn::config::Config;
use burn::tensor::Device;

use crate::balance::{AdaptiveShardsConfig, Balancer, SharedBalancer};
use crate::error::DataParallelError;
use crate::parallel_apply::Workers;
use crate::profile::Profiler;

/// Settings of a [`DataParallel`](crate::DataParallel), built with `new()` and `with_*`.
///
/// # Example
///
/// ```
/// use burn::nn::{Linear, LinearConfig};
/// use burn::tensor::Device;
/// use burn_dataparallel::DataParallelConfig;
///
/// let device = Device::flex().autodiff();
/// let model: Linear = LinearConfig::new(8, 2).init(&device);
/// // Outputs on the second device, a third of each batch on the first.
/// let dp = DataParallelConfig::new()
///     .with_output_index(1)
///     .with_shard_weights(Some(vec![1.0, 2.0]))
///     .init(model, vec![device.clone(), device])
///     .unwrap();
/// assert_eq!(dp.shard_weights(), Some(&[1.0, 2.0][..]));
/// assert!(dp.sync_learner_steps(), "on by default");
/// ```
#[derive(Config, Debug)]
pub struct DataParallelConfig {
    /// The batch dimension, along which inputs are split and outputs concatenated.
    #[config(default = 0)]
    pub dim: usize,
    /// Position in the device list of the device that holds the module and gathers outputs.
    #[config(default = 0)]
    pub output_index: usize,
    /// Per-device shares of each batch (one positive weight per device); even shards when
    /// `None`.
    pub shard_weights: Option<Vec<f64>>,
    /// Shards that follow the replicas' measured times (starting from `shard_weights`, else
    /// even): for devices of unequal speed. A device the step is predicted to finish sooner
    /// without is left out (weight zero). Measuring waits for each device at the end of its
    /// replica's work, which costs the overlap of the devices' work on the steps it measures.
    pub adaptive_shards: Option<AdaptiveShardsConfig>,
    /// Whether every step records its stage profile ([`DataParallel::profile`](crate::DataParallel::profile)).
    #[config(default = false)]
    pub profile: bool,
    /// How [`Mean`](crate::Mean) losses combine in burn-train's steps.
    #[config(default = "LossReduction::Mean")]
    pub loss_reduction: LossReduction,
    /// Whether burn-train's steps wait for the output device before handing their item back.
    /// burn-train reads each item on a metric thread of its own, whose CubeCL stream may read
    /// the item's buffers before the writes queued to them have run (`upstream/cross_stream.rs`
    /// in the repository), so a logged loss or accuracy can be wrong (the bare `Learner`'s
    /// too; parameters are not affected). The wait costs the overlap of a step's device work
    /// with the next step's launches.
    #[config(default = true)]
    pub sync_learner_steps: bool,
}

/// How the replicas' losses add up to the batch's: the loss a model's own training step
/// reports under the `Learner`.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum LossReduction {
    /// The replicas' losses are means over their shards: the batch's is their mean weighted
    /// by the shards' shares.
    Mean,
    /// The replicas' losses are sums over their shards: the batch's is their sum.
    Sum,
}

/// What every copy of one wrapper carries: the checked settings and the worker lanes.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) devices: Vec<Device>,
    pub(crate) output_device: Device,
    pub(crate) dim: usize,
    pub(crate) shard_weights: Option<Vec<f64>>,
    /// The adaptive split, shared by every copy of the wrapper.
    pub(crate) balancer: Option<SharedBalancer>,
    pub(crate) loss_reduction: LossReduction,
    pub(crate) sync_learner_steps: bool,
    /// The stage profile, shared by every copy of the wrapper.
    pub(crate) profiler: Arc<Profiler>,
    /// One lane per entry of `devices`; none for a single entry.
    pub(crate) workers: Option<Arc<Workers>>,
}

impl Settings {
    /// The settings of `config` over `devices`, checked.
    ///
    /// # Errors
    ///
    /// [`DataParallelError::NoDevices`], [`DataParallelError::UnknownDevice`],
    /// [`DataParallelError::OutputDeviceIndex`], those of [`check_weights`],
    /// [`DataParallelError::InvalidAdaptiveShards`], and
    /// [`DataParallelError::WorkerSpawn`].
    pub(crate) fn new(
        config: &DataParallelConfig,
        devices: Vec<Device>,
    ) -> Result<Self, DataParallelError> {
        if devices.is_empty() {
            return Err(DataParallelError::NoDevices);
        }
        crate::devices::check_present(&devices)?;
        let output_device = devices.get(config.output_index).cloned().ok_or(
            DataParallelError::OutputDeviceIndex {
                index: config.output_index,
                len: devices.len(),
            },
        )?;
        if let Some(weights) = &config.shard_weights {
            check_weights(weights, devices.len())?;
        }
        let balancer = match &config.adaptive_shards {
            Some(adaptive) => {
                adaptive.check()?;
                let weights = config.shard_weights.as_deref();
                let balancer = Balancer::new(adaptive.clone(), devices.len(), weights);
                Some(Arc::new(Mutex::new(balancer)))
            }
            None => None,
        };
        let workers = match devices.len() {
            1 => None,
            entries => Some(Arc::new(Workers::new(entries)?)),
        };
        let profiler = Arc::<Profiler>::default();
        profiler.set_enabled(config.profile);
        Ok(Self {
            profiler,
            devices,
            output_device,
            dim: config.dim,
            shard_weights: config.shard_weights.clone(),
            balancer,
            loss_reduction: config.loss_reduction,
            sync_learner_steps: config.sync_learner_steps,
            workers,
        })
    }
}

/// Checks one positive, finite weight per device.
///
/// # Errors
///
/// [`DataParallelError::ShardWeightsLength`] and [`DataParallelError::InvalidShardWeight`].
pub(crate) fn check_weights(weights: &[f64], devices: usize) -> Result<(), DataParallelError> {
    if weights.len() != devices {
        return Err(DataParallelError::ShardWeightsLength {
            expected: devices,
            found: weights.len(),
        });
    }
    match weights.iter().position(|w| !(w.is_finite() && *w > 0.0)) {
        Some(index) => Err(DataParallelError::InvalidShardWeight {
            index,
            weight: weights[index],
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_checked() {
        assert!(check_weights(&[1.0, 2.0], 2).is_ok());
        assert!(matches!(
            check_weights(&[1.0], 2),
            Err(DataParallelError::ShardWeightsLength {
                expected: 2,
                found: 1
            })
        ));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                check_weights(&[1.0, bad], 2),
                Err(DataParallelError::InvalidShardWeight { index: 1, .. })
            ));
        }
    }
}
