//! How a batch is divided among the replicas.

use burn::tensor::backend::Backend;

use crate::config::LossReduction;

pub(crate) mod sizes;
pub use sizes::shard_sizes;

/// The split plan of one forward: which replicas run, on which devices, with how many items
/// each, and how their losses combine.
///
/// Built by [`DataParallel`](crate::DataParallel) before every forward and handed to
/// [`Scatter::scatter`](crate::Scatter::scatter) and [`Gather::gather`](crate::Gather::gather).
/// Only replicas that receive at least one item take part.
#[derive(Debug, Clone)]
pub struct Shards<B: Backend> {
    dim: usize,
    replicas: Vec<usize>,
    sizes: Vec<usize>,
    devices: Vec<B::Device>,
    output_device: B::Device,
    /// How the losses of burn-train's output types combine.
    loss_reduction: LossReduction,
    /// The shares the scattered parts stated
    /// ([`Scatter::loss_weight`](crate::Scatter::loss_weight)), once weighed.
    stated_shares: Option<Vec<f64>>,
}

impl<B: Backend> Shards<B> {
    /// Shards for `batch_size` items over `devices`, sized by [`shard_sizes`].
    ///
    /// # Panics
    ///
    /// If `devices` is empty, `batch_size` is zero, or `weights` has another length than
    /// `devices`.
    pub fn new(
        batch_size: usize,
        devices: &[B::Device],
        weights: Option<&[f64]>,
        dim: usize,
        output_device: B::Device,
    ) -> Self {
        let sizes = shard_sizes(batch_size, devices.len(), weights);
        Self::from_sizes(&sizes, devices, dim, output_device)
    }

    /// Shards of `all_sizes` items, one entry per device (zero for a device left out).
    pub(crate) fn from_sizes(
        all_sizes: &[usize],
        devices: &[B::Device],
        dim: usize,
        output_device: B::Device,
    ) -> Self {
        let replicas: Vec<usize> = (0..devices.len()).filter(|&i| all_sizes[i] > 0).collect();
        Self {
            dim,
            sizes: replicas.iter().map(|&i| all_sizes[i]).collect(),
            devices: replicas.iter().map(|&i| devices[i].clone()).collect(),
            replicas,
            output_device,
            loss_reduction: LossReduction::Mean,
            stated_shares: None,
        }
    }

    /// These shards with the wrapper's [`LossReduction`].
    pub(crate) fn with_loss_reduction(self, loss_reduction: LossReduction) -> Self {
        Self {
            loss_reduction,
            ..self
        }
    }

    /// How the `loss` of burn-train's output types (`ClassificationOutput` and the like)
    /// combines over the replicas: a shard-weighted mean, or a sum
    /// ([`DataParallelConfig::loss_reduction`](crate::DataParallelConfig::loss_reduction)).
    pub fn loss_reduction(&self) -> LossReduction {
        self.loss_reduction
    }

    /// Number of shards (replicas taking part).
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Always false: there is at least one shard.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// The dimension inputs are split along and outputs concatenated along.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Items in each shard, all positive.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Total number of items.
    pub fn batch_size(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// The device of each shard.
    pub fn devices(&self) -> &[B::Device] {
        &self.devices
    }

    /// Position of each shard's device in the wrapper's device list.
    pub fn replicas(&self) -> &[usize] {
        &self.replicas
    }

    /// Where outputs are gathered.
    pub fn output_device(&self) -> &B::Device {
        &self.output_device
    }

    /// Each shard's share of a mean-reduced loss, summing to one: the weights the input's
    /// parts state ([`Scatter::loss_weight`](crate::Scatter::loss_weight)) over their sum,
    /// or else each shard's rows over the batch's. [`Mean`](crate::Mean) values and, under
    /// burn-train's `Learner`, the replicas' gradients are weighted by these.
    pub fn loss_shares(&self) -> Vec<f64> {
        match &self.stated_shares {
            Some(shares) => shares.clone(),
            None => {
                let total = self.batch_size() as f64;
                self.sizes.iter().map(|&n| n as f64 / total).collect()
            }
        }
    }

    /// Takes `shares` (summing to one, one per shard) as the shards'
    /// [`loss_shares`](Shards::loss_shares).
    pub(crate) fn set_loss_shares(&mut self, shares: Vec<f64>) {
        self.stated_shares = Some(shares);
    }
}
