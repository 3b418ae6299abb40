//! Splitting one tensor into pieces: zero-copy views where every piece is one contiguous
//! block of the input, otherwise one kernel launch.
//!
//! The kernel writes all pieces into one buffer, each piece contiguous and starting at an
//! offset aligned for the device, and the pieces are returned as views of that buffer. One
//! thread copies one vector of the input, seen as a matrix `[outer, sum(width_i)]` as in
//! `concat.rs`, to the piece that holds its column (found by `concat.rs`' `locate`).

use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_std::{Metadata, Strides};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;
use cubecl::std::FastDivmod;

use super::concat::{locate, product, vector_size};

#[cube(launch_unchecked, address_type = "dynamic")]
fn split_kernel<E: Numeric, N: Size>(
    input: &Tensor<Vector<E, N>>,
    output: &mut Tensor<Vector<E, N>>,
    widths: Sequence<usize>,
    starts: Sequence<usize>,
    row_width: FastDivmod<usize>,
    units: usize,
    #[define(E)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= units {
        terminate!();
    }
    let (row, column) = row_width.div_mod(ABSOLUTE_POS);
    let (piece, offset, width) = locate(&widths, column);

    // A sequence's items are indexed at compile time: one unrolled branch per piece.
    let mut start = 0usize;
    #[unroll]
    for i in 0..comptime![starts.len()] {
        if piece == i {
            start = *starts.index(i);
        }
    }
    output[start + row * width + offset] = input[ABSOLUTE_POS];
}

fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// A contiguous view with `shape` of `buffer`'s elements from element `start`; `buffer` is
/// contiguous.
fn view<R: CubeRuntime>(buffer: &CubeTensor<R>, start: usize, shape: Vec<usize>) -> CubeTensor<R> {
    let elem = buffer.dtype.size() as u64;
    let total = buffer.meta.num_elements() as u64;
    let elements = product(&shape) as u64;
    let start = start as u64;
    let strides = Strides::from(contiguous_strides(&shape));
    CubeTensor::new(
        buffer.client.clone(),
        buffer
            .handle
            .clone()
            .offset_start(start * elem)
            .offset_end((total - start - elements) * elem),
        Metadata::new(shape, strides),
        buffer.device.clone(),
        buffer.dtype,
    )
}

/// Splits `tensor` along `dim` into pieces of `sizes`.
///
/// # Panics
///
/// If the sizes do not sum to the tensor's size along `dim`.
pub(crate) fn split<R: CubeRuntime>(
    tensor: CubeTensor<R>,
    sizes: &[usize],
    dim: usize,
) -> Vec<CubeTensor<R>> {
    let shape = tensor.meta.shape().to_vec();
    assert_eq!(
        sizes.iter().sum::<usize>(),
        shape[dim],
        "split sizes do not match"
    );
    let piece_shape = |size: usize| {
        let mut piece = shape.clone();
        piece[dim] = size;
        piece
    };
    if sizes.len() == 1 {
        return vec![tensor];
    }
    let elem = tensor.dtype.size();
    let alignment = tensor.client.properties().memory.alignment as usize;
    let (outer, inner) = (product(&shape[..dim]), product(&shape[dim + 1..]));

    // Every piece is one contiguous block of the input: views, if their starts are aligned.
    if outer == 1 && tensor.is_contiguous() {
        let starts: Vec<usize> = sizes
            .iter()
            .scan(0, |start, &size| {
                let begin = *start;
                *start += size * inner;
                Some(begin)
            })
            .collect();
        let offset = tensor.handle.offset_start.unwrap_or(0) as usize;
        if starts
            .iter()
            .all(|s| (offset + s * elem).is_multiple_of(alignment))
        {
            return sizes
                .iter()
                .zip(starts)
                .map(|(&size, start)| view(&tensor, start, piece_shape(size)))
                .collect();
        }
    }

    // Otherwise one launch into one buffer, each piece aligned in it.
    let tensor = if tensor.is_contiguous() {
        tensor
    } else {
        into_contiguous(tensor)
    };
    let widths: Vec<usize> = sizes.iter().map(|size| size * inner).collect();
    let align_elems = (alignment / elem).max(1);
    let mut starts = Vec::with_capacity(sizes.len());
    let mut end = 0;
    for width in &widths {
        starts.push(end);
        end += (outer * width).div_ceil(align_elems) * align_elems;
    }
    let vector = vector_size(
        &tensor.client,
        elem,
        widths.iter().copied().chain(starts.iter().copied()),
    );
    let buffer = empty_device_contiguous_dtype(
        tensor.client.clone(),
        tensor.device.clone(),
        vec![end.max(1)].into(),
        tensor.dtype,
    );
    let client = tensor.client.clone();
    let units = tensor.meta.num_elements() / vector;
    if units > 0 {
        let address = tensor
            .required_address_type()
            .max(buffer.required_address_type());
        let mut vector_widths = SequenceArg::new();
        let mut vector_starts = SequenceArg::new();
        for (width, start) in widths.iter().zip(&starts) {
            vector_widths.push(width / vector);
            vector_starts.push(start / vector);
        }
        let row_width = widths.iter().sum::<usize>() / vector;
        let cube_dim = CubeDim::new(&client, units);
        let cube_count = calculate_cube_count_elemwise(&client, units, cube_dim);
        let dtype = tensor.dtype;
        unsafe {
            split_kernel::launch_unchecked(
                &client,
                cube_count,
                cube_dim,
                address,
                vector,
                tensor.into_tensor_arg(),
                buffer.clone().into_tensor_arg(),
                vector_widths,
                vector_starts,
                row_width,
                units,
                dtype.into(),
            );
        }
    }
    sizes
        .iter()
        .zip(starts)
        .map(|(&size, start)| view(&buffer, start, piece_shape(size)))
        .collect()
}
