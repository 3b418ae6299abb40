//! Cutting a module's parameters into coalesced buckets.

use burn::tensor::DType;

/// The buckets for parameters of `(dtype, tracked, bytes)`: groups of positions, in order.
///
/// Parameters with the same dtype and tracking are packed in order into buckets of at most
/// `bucket_size` bytes; a parameter larger than that gets a bucket of its own. A size of zero
/// gives every parameter a bucket of its own.
pub(crate) fn plan_buckets(params: &[(DType, bool, usize)], bucket_size: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<((DType, bool), Vec<usize>)> = Vec::new();
    for (i, (dtype, tracked, _)) in params.iter().enumerate() {
        let key = (*dtype, *tracked);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let mut buckets = Vec::new();
    for (_, members) in groups {
        let mut bucket: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for i in members {
            let size = params[i].2;
            if !bucket.is_empty() && bytes + size > bucket_size {
                buckets.push(std::mem::take(&mut bucket));
                bytes = 0;
            }
            bucket.push(i);
            bytes += size;
        }
        if !bucket.is_empty() {
            buckets.push(bucket);
        }
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: DType = DType::F32;

    #[test]
    fn buckets_pack_in_order_up_to_the_size() {
        let params = [
            (F32, true, 40),
            (F32, true, 40),
            (F32, true, 30),
            (F32, true, 10),
        ];
        assert_eq!(plan_buckets(&params, 80), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(plan_buckets(&params, 1000), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn a_parameter_larger_than_the_size_gets_its_own_bucket() {
        let params = [(F32, true, 10), (F32, true, 500), (F32, true, 10)];
        assert_eq!(plan_buckets(&params, 100), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn size_zero_moves_every_parameter_alone() {
        let params = [(F32, true, 4); 3];
        assert_eq!(plan_buckets(&params, 0), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn buckets_never_mix_dtypes_or_tracking() {
        let params = [
            (F32, true, 4),
            (DType::BF16, true, 2),
            (F32, false, 4),
            (F32, true, 4),
            (DType::BF16, true, 2),
        ];
        assert_eq!(
            plan_buckets(&params, 1 << 20),
            vec![vec![0, 3], vec![1, 4], vec![2]]
        );
    }

    #[test]
    fn every_parameter_is_in_exactly_one_bucket() {
        let params: Vec<(DType, bool, usize)> = (0..50)
            .map(|i| {
                (
                    if i % 7 == 0 { DType::F16 } else { F32 },
                    i % 5 != 0,
                    4 * (1 + i * 13 % 17),
                )
            })
            .collect();
        for size in [0, 1, 16, 100, 1000] {
            let mut seen: Vec<usize> = plan_buckets(&params, size).concat();
            seen.sort();
            assert_eq!(seen, (0..50).collect::<Vec<_>>(), "bucket size {size}");
        }
    }
}
