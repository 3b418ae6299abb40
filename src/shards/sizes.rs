//! The shard sizes of a batch: how many items each device receives, evenly or by weights.

/// Splits `batch_size` items over `slots` devices; the result has one entry per device.
///
/// Without weights the shards are as even as possible: sizes differ by at most one, the larger
/// shards come first, so at most two distinct shard shapes occur. A batch smaller than the
/// device count gives one item to each of the first `batch_size` devices and zero to the rest.
/// With weights each device receives `batch_size * w_i / sum(w)` rounded by the largest
/// remainder method (ties go to the earlier device); the sizes always sum to `batch_size`.
///
/// # Panics
///
/// If `slots` is zero or `weights` has another length than `slots`.
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

/// `sizes` with every slot at one row at least, where there are as many rows as slots: a
/// row taken from the largest shard for each empty one.
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

/// The sizes of an adaptive split's step: `batch_size` rows by `weights`, every slot keeping
/// a row where the batch has one for each.
pub(crate) fn adaptive_sizes(batch_size: usize, weights: &[f64]) -> Vec<usize> {
    at_least_one(shard_sizes(batch_size, weights.len(), Some(weights)))
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

    /// Every slot keeps a row, however small its weight.
    #[test]
    fn every_device_keeps_a_row() {
        assert_eq!(adaptive_sizes(10, &[1.0, 1e-6, 1e-6]), [8, 1, 1]);
        assert_eq!(at_least_one(vec![2, 0]), [1, 1]);
        assert_eq!(at_least_one(vec![1, 0, 0]), [1, 0, 0]);
    }
}
