//! Splitting one tensor into pieces along any dimension: views where every piece is one
//! aligned block of the input (splits along the first dimension), otherwise one kernel launch.
//!
//! The kernel writes every piece into one buffer, each piece contiguous and starting at an
//! offset aligned for the device, and the pieces are views of that buffer. One thread copies
//! one vector of the input, seen as a matrix `[outer, sum(width_i)]` as in `concat.rs`, to the
//! piece that holds its column (found by [`locate`]).

use burn::backend::cubecl::dtype_to_storage_type;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;
use cubecl::std::FastDivmod;

use super::concat::vector_size;

#[cube(launch_unchecked, address_type = "dynamic")]
fn split_kernel<E: Numeric, N: Size>(
    input: &Tensor<Vector<E, N>>,
    output: &mut Tensor<Vector<E, N>>,
    widths: Sequence<usize>,
    starts: Sequence<usize>,
    row_width: FastDivmod<usize>,
    units: usize,
    #[define(E)] _dtype: ElemType,
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

/// Where `column` of a row laid out as pieces of `widths` columns side by side falls: the
/// piece, the column within it and the piece's width. The pieces' count is a compile-time
/// constant, so the walk is unrolled.
#[cube]
fn locate(widths: &Sequence<usize>, column: usize) -> (usize, usize, usize) {
    let mut piece = 0usize;
    let mut offset = column;
    let mut width = 0usize;
    let mut found = false;
    #[unroll]
    for i in 0..comptime![widths.len()] {
        let piece_width = *widths.index(i);
        if !found {
            if offset < piece_width {
                piece = i;
                width = piece_width;
                found = true;
            } else {
                offset -= piece_width;
            }
        }
    }
    (piece, offset, width)
}

/// A contiguous view with `shape` of the bytes `from..to` of `tensor`'s memory (counted from
/// where its memory starts); `from` is aligned for the device.
fn view(tensor: &CubeTensor, from: usize, to: usize, shape: Vec<usize>) -> CubeTensor {
    let used = tensor.handle.size_in_used();
    let handle = (tensor.handle.clone())
        .offset_start(from as u64)
        .offset_end(used - to as u64);
    CubeTensor::new_contiguous(
        tensor.client.clone(),
        tensor.device.clone(),
        shape.into(),
        handle,
        tensor.dtype,
    )
}

/// Splits `tensor` along `dim` into pieces of `sizes`.
///
/// # Panics
///
/// If the sizes do not sum to the tensor's size along `dim`.
pub(super) fn split(tensor: CubeTensor, sizes: &[usize], dim: usize) -> Vec<CubeTensor> {
    let shape = tensor.meta.shape().to_vec();
    assert_eq!(
        sizes.iter().sum::<usize>(),
        shape[dim],
        "split sizes {sizes:?} do not sum to the size {} of dimension {dim}",
        shape[dim]
    );
    if sizes.len() == 1 {
        return vec![tensor];
    }
    let piece_shape = |size: usize| {
        let mut piece = shape.clone();
        piece[dim] = size;
        piece
    };
    let elem = tensor.dtype.size();
    let alignment = tensor.client.properties().memory.alignment as usize;
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let tensor = if tensor.is_contiguous() {
        tensor
    } else {
        into_contiguous(tensor)
    };
    let widths: Vec<usize> = sizes.iter().map(|size| size * inner).collect();

    // Every piece is one block of the input: views, where every block starts aligned.
    if outer == 1 {
        let offset = tensor.handle.offset_start.unwrap_or(0) as usize;
        let starts = running_starts(widths.iter().map(|width| width * elem));
        if (starts.iter()).all(|start| (offset + start).is_multiple_of(alignment)) {
            return views(&tensor, &starts, sizes, piece_shape);
        }
    }

    // Otherwise one launch into one buffer, each piece starting aligned in it.
    let align = (alignment / elem).max(1);
    let padded = widths
        .iter()
        .map(|width| (outer * width).div_ceil(align) * align);
    let starts = running_starts(padded.clone());
    let end: usize = padded.sum();
    let all: Vec<usize> = widths.iter().chain(&starts).copied().collect();
    let vector = vector_size(&tensor.client, elem, &all);
    let buffer = empty_device_contiguous_dtype(
        tensor.client.clone(),
        tensor.device.clone(),
        vec![end.max(1)].into(),
        tensor.dtype,
    );
    let units = tensor.meta.num_elements() / vector;
    if units > 0 {
        let client = tensor.client.clone();
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
                dtype_to_storage_type(dtype),
            );
        }
    }
    let starts: Vec<usize> = starts.iter().map(|start| start * elem).collect();
    views(&buffer, &starts, sizes, piece_shape)
}

/// Where each of pieces of `lengths` starts when they are laid end to end.
fn running_starts(lengths: impl Iterator<Item = usize>) -> Vec<usize> {
    lengths
        .scan(0, |end, length| {
            let start = *end;
            *end += length;
            Some(start)
        })
        .collect()
}

/// The pieces of `sizes` of `tensor`, piece `i` the bytes from `starts[i]` to the next start.
fn views(
    tensor: &CubeTensor,
    starts: &[usize],
    sizes: &[usize],
    piece_shape: impl Fn(usize) -> Vec<usize>,
) -> Vec<CubeTensor> {
    let used = tensor.handle.size_in_used() as usize;
    let ends = starts[1..].iter().copied().chain([used]);
    (starts.iter().zip(ends).zip(sizes))
        .map(|((&from, to), &size)| view(tensor, from, to, piece_shape(size)))
        .collect()
}
