//! Gathering tensors on the output device (one kernel launch on CubeCL devices) equals
//! Burn's `Tensor::cat` on the same device, value for value, and so do the gradients that
//! flow back through it.

use std::sync::{Mutex, MutexGuard, PoisonError};

use burn::backend::GradientCheckpointingStrategy;
use burn::tensor::{Device, Int, Tensor};
use burn_dataparallel::__bench::{
    FusionConcat, set_concat_cubes, set_concat_group, set_fusion_concat,
};
use burn_dataparallel::{Gather, Shards};

use crate::common::{counting, counting_on_host, values};

/// Shards for `parts` outputs along `dim`, every one of them on the output device.
fn shards(parts: usize, dim: usize, device: &Device) -> Shards {
    Shards::new(
        parts,
        &vec![device.clone(); parts],
        None,
        dim,
        device.clone(),
    )
}

/// `Gather` of `parts` against `Tensor::cat` of the same tensors: the same values exactly.
fn gathers_as_cat<const D: usize>(parts: Vec<Tensor<D>>, dim: usize, device: &Device) {
    let expected = Tensor::cat(parts.clone(), dim);
    let found = Gather::gather(parts.clone(), &shards(parts.len(), dim, device)).unwrap();
    assert_eq!(
        found.dims(),
        expected.dims(),
        "{} parts along {dim}",
        parts.len()
    );
    assert_eq!(
        values(found),
        values(expected),
        "{} parts along {dim}",
        parts.len()
    );
}

/// Pieces of odd sizes (tails that fill no vector), along every dimension, two to five of
/// them, including an empty one.
pub fn gathers_pieces_along_any_dimension(devices: &[Device]) {
    let device = &devices[0];
    for dim in 0..3 {
        for sizes in [
            vec![1, 2],
            vec![3, 1, 4],
            vec![2, 0, 5, 1],
            vec![4, 4, 4, 4, 4],
        ] {
            let parts = sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| {
                    let mut dims = [3, 5, 7];
                    dims[dim] = size;
                    counting(dims, 1000 * i, device)
                })
                .collect();
            gathers_as_cat(parts, dim, device);
        }
    }
    // Rows as wide as a vector of four and a tail of one.
    let wide = (0..3)
        .map(|i| counting([i + 1, 137], 500 * i, device))
        .collect();
    gathers_as_cat(wide, 0, device);
}

/// Inputs that are views with their own strides (a transposed tensor) are read as laid out.
pub fn gathers_strided_pieces(devices: &[Device]) {
    let device = &devices[0];
    let parts = vec![
        counting([6, 4], 0, device).swap_dims(0, 1),
        counting([4, 3], 100, device),
        counting([5, 4], 200, device)
            .swap_dims(0, 1)
            .slice([0..4, 1..4]),
    ];
    gathers_as_cat(parts, 1, device);
}

/// More pieces than one recorded concatenation takes (recorded in groups), and integer
/// tensors (Burn's `cat`).
pub fn gathers_many_pieces_and_integers(devices: &[Device]) {
    let device = &devices[0];
    let many = (0..20)
        .map(|i| counting([1 + i % 3, 3], 10 * i, device))
        .collect();
    gathers_as_cat(many, 0, device);
    let ints: Vec<Tensor<2, Int>> = (0..3)
        .map(|i| Tensor::<1, Int>::arange(i * 10..i * 10 + 6, device).reshape([2, 3]))
        .collect();
    let expected = Tensor::cat(ints.clone(), 0).into_data();
    let found = Gather::gather(ints, &shards(3, 0, device)).unwrap();
    assert_eq!(found.into_data(), expected);
}

/// The gradient each piece receives through the gather is its part of the output's
/// gradient, as through `Tensor::cat`, for every count of pieces the backward is written for
/// and past it.
pub fn gradients_reach_every_piece(devices: &[Device]) {
    let device = &devices[0];
    // Past 16 pieces the concatenation is recorded in groups of at most 16.
    for parts in [2, 3, 8, 16, 17, 40] {
        gradients_through(parts, 0, 4, device, None);
    }
    // Pieces without a gradient, the first groups wholly.
    gradients_through(40, 20, 4, device, None);
    // Burn's checkpointing recomputes some activations in the backward; a gather of
    // checkpointed tensors is another backend type.
    gradients_through(
        3,
        0,
        4,
        device,
        Some(GradientCheckpointingStrategy::Balanced),
    );
}

/// Many pieces making over a MiB, values and gradients: under Burn's Fusion the crate joins
/// those with its own kernel where fewer or smaller ones take Fusion's `cat`.
pub fn gathers_many_large_pieces(devices: &[Device]) {
    let device = &devices[0];
    for (parts, frozen) in [(8, 0), (20, 5)] {
        // A piece is 1 to 3 lines of `width`: 2 on average.
        let width = (1usize << 18).div_ceil(2 * parts) + 1;
        gradients_through(parts, frozen, width, device, None);
    }
}

/// A piece of 24 MiB beside a small one, along both dimensions: more vectors than one pass
/// of the kernel's threads copies, and rows of unequal widths.
pub fn gathers_pieces_of_unequal_sizes(devices: &[Device]) {
    let device = &devices[0];
    for dim in [0, 1] {
        let parts = [3000, 100]
            .into_iter()
            .enumerate()
            .map(|(i, size)| {
                let mut dims = [2048, 2048];
                dims[dim] = size;
                counting_on_host(dims, 7_000_000 * i, device)
            })
            .collect();
        gathers_as_cat(parts, dim, device);
    }
}

/// The concat kernel's knobs (its cap of cubes, its inputs a launch, its Fusion operation
/// forced) held by one test at a time in a process (the device lists' variants run on
/// parallel threads, and none may take another's setting for the default it restores), and
/// set back when dropped, even where an assertion fails.
struct Knobs {
    /// The settings before, of those set.
    cubes: Option<usize>,
    group: Option<usize>,
    _turn: MutexGuard<'static, ()>,
}

impl Knobs {
    /// The kernel forced, at most `cubes` cubes and `group` inputs a launch where given.
    fn hold(cubes: Option<usize>, group: Option<usize>) -> Self {
        static TURN: Mutex<()> = Mutex::new(());
        let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        set_fusion_concat(FusionConcat::Kernel);
        Self {
            cubes: cubes.map(set_concat_cubes),
            group: group.map(set_concat_group),
            _turn: turn,
        }
    }
}

impl Drop for Knobs {
    fn drop(&mut self) {
        if let Some(cubes) = self.cubes {
            set_concat_cubes(cubes);
        }
        if let Some(group) = self.group {
            set_concat_group(group);
        }
        set_fusion_concat(FusionConcat::Rule);
    }
}

/// Pieces of unequal sizes along both dimensions, with vectors of one element and of four,
/// through the concat kernel (its Fusion operation forced under Fusion) as [`Knobs`] set it.
fn gathers_unequal_pieces(device: &Device) {
    for sizes in [[300, 7, 1000], [300, 8, 1000]] {
        for dim in [0, 1] {
            let parts = sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| {
                    let mut dims = [24, 24];
                    dims[dim] = size;
                    counting_on_host(dims, 100_000 * i, device)
                })
                .collect();
            gathers_as_cat(parts, dim, device);
        }
    }
}

/// Pieces of unequal sizes through launches of the concat kernel capped at a few cubes:
/// every thread strides over its piece many times, whatever the default cap.
pub fn gathers_through_few_cubes(devices: &[Device]) {
    let _knobs = Knobs::hold(Some(3), None);
    gathers_unequal_pieces(&devices[0]);
}

/// Pieces of unequal sizes through several launches of the concat kernel into one output,
/// one input a launch: where a device binds fewer buffers than the inputs, as on wgpu, the
/// kernel launches once per group; this takes that path on every device.
pub fn gathers_through_several_launches(devices: &[Device]) {
    let _knobs = Knobs::hold(None, Some(1));
    gathers_unequal_pieces(&devices[0]);
}

/// The values and gradients of `parts` pieces of 1 to 3 lines of `width` through a gather,
/// against `Tensor::cat`'s; the first `frozen` pieces need no gradient.
fn gradients_through(
    parts: usize,
    frozen: usize,
    width: usize,
    device: &Device,
    strategy: Option<GradientCheckpointingStrategy>,
) {
    let checkpointed = |tensor: Tensor<2>| match strategy {
        Some(strategy) => tensor.with_gradient_checkpointing_strategy(strategy),
        None => tensor,
    };
    for dim in [0, 1] {
        let pieces: Vec<Tensor<2>> = (0..parts)
            .map(|i| {
                let dims = if dim == 0 {
                    [1 + i % 3, width]
                } else {
                    [width, 1 + i % 3]
                };
                let piece = checkpointed(counting_on_host(dims, 7 * i, device));
                if i < frozen {
                    piece
                } else {
                    piece.require_grad()
                }
            })
            .collect();
        let total: usize = pieces.iter().map(|p| p.dims()[dim]).sum();
        let weight_dims = if dim == 0 {
            [total, width]
        } else {
            [width, total]
        };
        let weights = checkpointed(counting_on_host(weight_dims, 3, device));
        let (expected, found) = (
            Tensor::cat(pieces.clone(), dim),
            Gather::gather(pieces.clone(), &shards(parts, dim, device)).unwrap(),
        );
        let (expected_values, found_values) = (values(expected.clone()), values(found.clone()));
        assert!(
            found_values == expected_values,
            "the values of {parts} pieces along {dim}"
        );
        let gradients = |output: Tensor<2>| (output * weights.clone()).sum().backward();
        let (expected, found) = (gradients(expected), gradients(found));
        for (i, piece) in pieces.iter().enumerate() {
            let (found, expected) = (piece.grad(&found), piece.grad(&expected));
            if i < frozen {
                assert!(
                    found.is_none() && expected.is_none(),
                    "piece {i} needs none"
                );
                continue;
            }
            let (found, expected) = (found.expect("a gradient"), expected.expect("Burn's"));
            assert_eq!(
                values(found),
                values(expected),
                "piece {i} of {parts} along {dim}"
            );
        }
    }
}

crate::on_every_device_list!(
    gathers_pieces_along_any_dimension => super::gathers_pieces_along_any_dimension,
    gathers_strided_pieces => super::gathers_strided_pieces,
    gathers_many_pieces_and_integers => super::gathers_many_pieces_and_integers,
    gradients_reach_every_piece => super::gradients_reach_every_piece,
    gathers_many_large_pieces => super::gathers_many_large_pieces,
    gathers_pieces_of_unequal_sizes => super::gathers_pieces_of_unequal_sizes,
    gathers_through_few_cubes => super::gathers_through_few_cubes,
    gathers_through_several_launches => super::gathers_through_several_launches,
);
