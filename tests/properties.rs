//! Properties of shard sizes and of scatter followed by gather, over random settings.

use burn::backend::Flex;
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::{Gather, Scatter, Shards, shard_sizes};
use proptest::prelude::*;

fn weights(slots: usize) -> impl Strategy<Value = Option<Vec<f64>>> {
    prop::option::of(prop::collection::vec(0.05f64..10.0, slots))
}

proptest! {
    #[test]
    fn even_shards_sum_to_the_batch_and_differ_by_at_most_one(
        batch in 1usize..500,
        slots in 1usize..17,
    ) {
        let sizes = shard_sizes(batch, slots, None);
        prop_assert_eq!(sizes.len(), slots);
        prop_assert_eq!(sizes.iter().sum::<usize>(), batch);
        let used: Vec<usize> = sizes.iter().copied().filter(|&s| s > 0).collect();
        prop_assert_eq!(used.len(), batch.min(slots));
        prop_assert!(used.iter().max().unwrap() - used.iter().min().unwrap() <= 1);
        prop_assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "larger shards first: {:?}", sizes);
    }

    #[test]
    fn weighted_shards_sum_to_the_batch_and_round_the_ideal_share(
        batch in 1usize..500,
        (slots, weights) in (1usize..9).prop_flat_map(|n| (Just(n), prop::collection::vec(0.05f64..10.0, n))),
    ) {
        let sizes = shard_sizes(batch, slots, Some(&weights));
        prop_assert_eq!(sizes.iter().sum::<usize>(), batch);
        let total: f64 = weights.iter().sum();
        for (size, weight) in sizes.iter().zip(&weights) {
            let ideal = batch as f64 * weight / total;
            prop_assert!((*size as f64 - ideal).abs() < 1.0, "{} for ideal {}", size, ideal);
        }
    }

    #[test]
    fn scatter_then_gather_is_the_identity(
        rank in 1usize..5,
        dims in prop::collection::vec(1usize..5, 4),
        batch in 1usize..13,
        dim_seed in 0usize..4,
        (slots, weights) in (1usize..6).prop_flat_map(|n| (Just(n), weights(n))),
    ) {
        let dim = dim_seed % rank;
        let mut shape = dims[..rank].to_vec();
        shape[dim] = batch;
        match rank {
            1 => round_trip::<1>(&shape, dim, slots, weights)?,
            2 => round_trip::<2>(&shape, dim, slots, weights)?,
            3 => round_trip::<3>(&shape, dim, slots, weights)?,
            _ => round_trip::<4>(&shape, dim, slots, weights)?,
        }
    }
}

fn round_trip<const D: usize>(
    shape: &[usize],
    dim: usize,
    slots: usize,
    weights: Option<Vec<f64>>,
) -> Result<(), TestCaseError> {
    let device = Default::default();
    let shape: [usize; D] = shape.try_into().unwrap();
    let floats = Tensor::<Flex, D>::random(shape, Distribution::Default, &device);
    let ints = Tensor::<Flex, 1, Int>::arange(0..(shape.iter().product::<usize>() as i64), &device)
        .reshape(shape);
    let input = (
        floats.clone(),
        vec![ints.clone()],
        Some(ints.clone().greater_elem(3)),
        [floats.clone(), floats.clone().neg()],
    );

    let batch = input.batch_size(dim).unwrap().unwrap();
    prop_assert_eq!(batch, shape[dim]);
    let shards = Shards::<Flex>::new(batch, &vec![device; slots], weights.as_deref(), dim, device);
    let parts = input.scatter(&shards);
    prop_assert_eq!(parts.len(), shards.len());
    for (part, &size) in parts.iter().zip(shards.sizes()) {
        prop_assert_eq!(part.0.dims()[dim], size);
    }
    let (floats_back, ints_back, bools_back, pair_back) = Gather::gather(parts, &shards).unwrap();
    let [first, second] = pair_back;
    prop_assert_eq!(first.into_data(), floats.clone().into_data());
    prop_assert_eq!(second.into_data(), floats.clone().neg().into_data());
    prop_assert_eq!(floats_back.into_data(), floats.into_data());
    prop_assert_eq!(ints_back[0].clone().into_data(), ints.clone().into_data());
    prop_assert_eq!(
        bools_back.unwrap().into_data(),
        ints.greater_elem(3).into_data()
    );
    Ok(())
}
