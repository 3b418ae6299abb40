//! Splitting a tensor into shards (one kernel launch or views on CubeCL devices) equals
//! Burn's `Tensor::split_with_sizes` on the same device, value for value, and so do the
//! gradients that flow back through it, a shard the loss does not reach included.

use burn::backend::GradientCheckpointingStrategy;
use burn::tensor::{Device, Int, Tensor};
use burn_dataparallel::{Scatter, Shards};

use crate::common::{counting, values};

/// Shards of `batch` items along `dim` by `weights`, every one of them on `device`.
fn shards(batch: usize, weights: &[f64], dim: usize, device: &Device) -> Shards {
    let devices = vec![device.clone(); weights.len()];
    Shards::new(batch, &devices, Some(weights), dim, device.clone())
}

/// `Scatter` of `tensor` against `split_with_sizes` of the same sizes: the same values.
fn splits_as_burn<const D: usize>(tensor: Tensor<D>, shards: &Shards) {
    let expected = tensor
        .clone()
        .split_with_sizes(shards.sizes().to_vec(), shards.dim());
    let found = Scatter::scatter(tensor, shards);
    assert_eq!(found.len(), expected.len());
    for (i, (found, expected)) in found.into_iter().zip(expected).enumerate() {
        let case = format!("piece {i} of {:?} along {}", shards.sizes(), shards.dim());
        assert_eq!(found.dims(), expected.dims(), "{case}");
        assert_eq!(found.device(), shards.devices()[i], "{case}");
        assert_eq!(values(found), values(expected), "{case}");
    }
}

/// Pieces of odd sizes (rows that fill no vector, starts that are not aligned), along every
/// dimension, two to five of them.
pub fn splits_along_any_dimension(devices: &[Device]) {
    let device = &devices[0];
    for dim in 0..3 {
        for weights in [
            vec![1.0, 2.0],
            vec![3.0, 1.0, 4.0],
            vec![2.0, 1.0, 5.0, 1.0],
            vec![1.0; 5],
        ] {
            let mut dims = [3, 5, 7];
            dims[dim] = 17;
            splits_as_burn(
                counting(dims, 1, device),
                &shards(17, &weights, dim, device),
            );
        }
    }
    // Rows as wide as a vector of four and a tail of one; blocks of 4 KiB, aligned.
    splits_as_burn(
        counting([9, 137], 0, device),
        &shards(9, &[1.0, 2.0], 0, device),
    );
    let aligned = shards(64, &[1.0, 1.0, 2.0], 0, device);
    splits_as_burn(counting([64, 1024], 0, device), &aligned);
}

/// Inputs that are views with their own strides (a transposed tensor, a slice) are read as
/// laid out, and each piece is a tensor of its own: writing to one leaves the others.
pub fn splits_strided_tensors(devices: &[Device]) {
    let device = &devices[0];
    let transposed = counting([6, 10], 0, device).swap_dims(0, 1);
    splits_as_burn(transposed.clone(), &shards(10, &[2.0, 3.0], 0, device));
    splits_as_burn(transposed, &shards(6, &[1.0, 1.0, 1.0], 1, device));
    let sliced = counting([8, 12], 0, device).slice([1..7, 2..11]);
    splits_as_burn(sliced, &shards(9, &[1.0, 2.0], 1, device));

    let pieces = Scatter::scatter(
        counting([4, 6], 0, device),
        &shards(6, &[1.0, 1.0], 1, device),
    );
    let written = pieces[0].clone().add_scalar(100.0);
    assert_eq!(
        values(pieces[1].clone()),
        values(counting([4, 6], 0, device).slice([0..4, 3..6]))
    );
    assert_eq!(
        values(written),
        values(
            counting([4, 6], 0, device)
                .slice([0..4, 0..3])
                .add_scalar(100.0)
        )
    );
}

/// Integer tensors split as Burn's own.
pub fn splits_integers(devices: &[Device]) {
    let device = &devices[0];
    let ints = Tensor::<1, Int>::arange(0..24, device).reshape([6, 4]);
    let shards = shards(4, &[1.0, 3.0], 1, device);
    let expected = ints.clone().split_with_sizes(shards.sizes().to_vec(), 1);
    for (found, expected) in Scatter::scatter(ints, &shards).into_iter().zip(expected) {
        assert_eq!(found.into_data(), expected.into_data());
    }
}

/// The gradient of a tensor split into shards is each shard's gradient in its place, as
/// through `split_with_sizes`, zeros where the loss reads no shard; on the list's own
/// devices too (each shard moved to its device).
pub fn gradients_reach_the_split_tensor(devices: &[Device]) {
    let device = &devices[0];
    for dim in [0, 1] {
        for parts in [2, 3, 5] {
            let same = shards(7 * parts, &vec![1.0; parts], dim, device);
            gradients_through(&same, dim, None, &[]);
            gradients_through(&same, dim, None, &[1]);
        }
        let balanced = Some(GradientCheckpointingStrategy::Balanced);
        gradients_through(&shards(9, &[1.0, 2.0], dim, device), dim, balanced, &[0]);
        let listed = Shards::new(11, devices, None, dim, device.clone());
        gradients_through(&listed, dim, None, &[]);
    }
}

/// The gradient of a tensor through `shards`, against `split_with_sizes`': every shard but
/// those of `unread` weighted into the loss.
fn gradients_through(
    shards: &Shards,
    dim: usize,
    strategy: Option<GradientCheckpointingStrategy>,
    unread: &[usize],
) {
    let device = shards.output_device();
    let batch = shards.batch_size();
    let dims = if dim == 0 { [batch, 3] } else { [3, batch] };
    // Burn's checkpointing recomputes some activations in the backward; a split of a
    // checkpointed tensor is another backend type.
    let checkpointed = |tensor: Tensor<2>| match strategy {
        Some(strategy) => tensor.with_gradient_checkpointing_strategy(strategy),
        None => tensor,
    };
    let input = checkpointed(counting(dims, 5, device)).require_grad();
    let gradient = |pieces: Vec<Tensor<2>>| {
        let loss = (pieces.into_iter().enumerate())
            .filter(|(i, _)| !unread.contains(i))
            .map(|(i, piece)| {
                let piece = piece.to_device(device);
                let weights = checkpointed(counting(piece.dims(), 3 * i, device));
                (piece * weights).sum()
            })
            .reduce(|a, b| a + b)
            .expect("a shard read");
        let grads = loss.backward();
        input.grad(&grads).expect("a gradient")
    };
    let expected = gradient(input.clone().split_with_sizes(shards.sizes().to_vec(), dim));
    let found = gradient(Scatter::scatter(input.clone(), shards));
    let case = format!("{:?} along {dim}, {unread:?} unread", shards.sizes());
    assert_eq!(values(found), values(expected), "{case}");
}

crate::on_every_device_list!(
    splits_along_any_dimension => super::splits_along_any_dimension,
    splits_strided_tensors => super::splits_strided_tensors,
    splits_integers => super::splits_integers,
    gradients_reach_the_split_tensor => super::gradients_reach_the_split_tensor,
);
