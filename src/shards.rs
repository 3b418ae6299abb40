//! How a batch is divided among the replicas: the shard sizes, and the plan a step follows.

use burn::tensor::Device;

use crate::config::LossReduction;

/// The split of one batch: which entries of the device list receive items, how many, and how
/// the replicas' losses are weighted.
///
/// Entries whose share is empty (a batch smaller than the device list) are left out, so every
/// shard holds at least one item.
#[derive(Debug, Clone)]
pub struct Shards {
    dim: usize,
    replicas: Vec<usize>,
    sizes: Vec<usize>,
    devices: Vec<Device>,
    output_device: Device,
    loss_reduction: LossReduction,
    stated_shares: Option<Vec<f64>>,
}

impl Shards {
    /// The split of a batch of `batch_size` items over `devices` (by `weights`, else evenly).
    ///
    /// # Panics
    ///
    /// When `devices` is empty, or `weights` is given with another length than `devices`.
    pub fn new(
        batch_size: usize,
        devices: &[Device],
        weights: Option<&[f64]>,
        dim: usize,
        output_device: Device,
    ) -> Self {
        let sizes = shard_sizes(batch_size, devices.len(), weights);
        Self::from_sizes(&sizes, devices, dim, output_device)
    }

    /// The split giving `all_sizes[i]` items to `devices[i]`.
    pub(crate) fn from_sizes(
        all_sizes: &[usize],
        devices: &[Device],
        dim: usize,
        output_device: Device,
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

    pub(crate) fn with_loss_reduction(self, loss_reduction: LossReduction) -> Self {
        Self {
            loss_reduction,
            ..self
        }
    }

    /// How the losses of the replicas combine (the wrapper's setting).
    pub fn loss_reduction(&self) -> LossReduction {
        self.loss_reduction
    }

    /// Number of shards (replicas that receive items).
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether no replica receives items.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// The batch dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Items per shard, in shard order.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Items in the whole batch.
    pub fn batch_size(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Each shard's device.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Each shard's position in the wrapper's device list (its replica index).
    pub fn replicas(&self) -> &[usize] {
        &self.replicas
    }

    /// Where outputs are gathered.
    pub fn output_device(&self) -> &Device {
        &self.output_device
    }

    /// Each shard's share of the batch's loss: its rows over the batch's, or the loss weights
    /// the input's parts state ([`Scatter::loss_weight`](crate::Scatter::loss_weight)).
    pub fn loss_shares(&self) -> Vec<f64> {
        match &self.stated_shares {
            Some(shares) => shares.clone(),
            None => {
                let total = self.batch_size() as f64;
                self.sizes.iter().map(|&n| n as f64 / total).collect()
            }
        }
    }

    pub(crate) fn set_loss_shares(&mut self, shares: Vec<f64>) {
        self.stated_shares = Some(shares);
    }
}

/// The number of items each of `slots` devices receives from a batch of `batch_size`.
///
/// Without weights, shards are as even as possible, larger ones first, and a batch smaller
/// than `slots` leaves the last devices empty. With weights, each device receives its share
/// of the batch rounded to whole items (largest remainders first).
///
/// # Panics
///
/// When `slots` is zero, or `weights` has another length than `slots`.
///
/// # Example
///
/// ```
/// use burn_dataparallel::shard_sizes;
///
/// assert_eq!(shard_sizes(7, 3, None), [3, 2, 2]);
/// assert_eq!(shard_sizes(8, 2, Some(&[1.0, 3.0])), [2, 6]);
/// ```
pub fn shard_sizes(batch_size: usize, slots: usize, weights: Option<&[f64]>) -> Vec<usize> {
    assert!(slots > 0, "shard_sizes needs at least one slot");
    match weights {
        None => {
            let used = batch_size.min(slots).max(1);
            let (base, extra) = (batch_size / used, batch_size % used);
            (0..slots)
                .map(|i| match i {
                    i if i < extra => base + 1,
                    i if i < used => base,
                    _ => 0,
                })
                .collect()
        }
        Some(weights) => {
            assert_eq!(weights.len(), slots, "one weight per slot");
            let total: f64 = weights.iter().sum();
            let ideal: Vec<f64> = weights
                .iter()
                .map(|w| batch_size as f64 * w / total)
                .collect();
            let mut sizes: Vec<usize> = ideal.iter().map(|x| x.floor() as usize).collect();
            let assigned: usize = sizes.iter().sum();
            let mut order: Vec<usize> = (0..slots).collect();
            order.sort_by(|&a, &b| {
                let (fa, fb) = (ideal[a] - ideal[a].floor(), ideal[b] - ideal[b].floor());
                fb.total_cmp(&fa).then(a.cmp(&b))
            });
            for &i in order
                .iter()
                .cycle()
                .take(batch_size.saturating_sub(assigned))
            {
                sizes[i] += 1;
            }
            sizes
        }
    }
}

/// `sizes`, moved so that every slot keeps at least one row where the batch has as many.
pub(crate) fn at_least_one(mut sizes: Vec<usize>) -> Vec<usize> {
    if sizes.iter().sum::<usize>() < sizes.len() {
        return sizes;
    }
    while let Some(empty) = sizes.iter().position(|&n| n == 0) {
        let largest = (0..sizes.len()).max_by_key(|&i| (sizes[i], usize::MAX - i));
        let largest = largest.expect("a slot");
        sizes[largest] -= 1;
        sizes[empty] += 1;
    }
    sizes
}

/// The shard sizes of adaptive shards: by the balancer's weights, every slot of a positive
/// weight keeping a row (a slot without rows is not measured again: only the balancer leaves
/// one out, by a weight of zero).
pub(crate) fn adaptive_sizes(batch_size: usize, weights: &[f64]) -> Vec<usize> {
    let sizes = shard_sizes(batch_size, weights.len(), Some(weights));
    let taking_part: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0.0).collect();
    let kept = at_least_one(taking_part.iter().map(|&i| sizes[i]).collect());
    let mut all = vec![0; weights.len()];
    for (&i, n) in taking_part.iter().zip(kept) {
        all[i] = n;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_batches_put_the_larger_shards_first() {
        assert_eq!(shard_sizes(7, 3, None), vec![3, 2, 2]);
        assert_eq!(shard_sizes(2, 4, None), vec![1, 1, 0, 0]);
        assert_eq!(shard_sizes(1, 4, None), vec![1, 0, 0, 0]);
        assert_eq!(shard_sizes(8, 4, None), vec![2, 2, 2, 2]);
    }

    #[test]
    fn weighted_shards_follow_the_weights() {
        assert_eq!(shard_sizes(8, 2, Some(&[1.0, 3.0])), vec![2, 6]);
        assert_eq!(shard_sizes(10, 3, Some(&[1.0, 1.0, 1.0])), vec![4, 3, 3]);
        assert_eq!(shard_sizes(3, 2, Some(&[1.0, 100.0])), vec![0, 3]);
    }

    #[test]
    fn every_device_keeps_a_row() {
        assert_eq!(adaptive_sizes(10, &[1.0, 1e-6, 1e-6]), [8, 1, 1]);
        assert_eq!(
            adaptive_sizes(10, &[1.0, 0.0, 1e-6]),
            [9, 0, 1],
            "a slot left out"
        );
        assert_eq!(at_least_one(vec![2, 0]), [1, 1]);
        assert_eq!(at_least_one(vec![1, 0, 0]), [1, 0, 0]);
    }
}
