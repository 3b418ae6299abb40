//! Concatenation of any number of tensors along any dimension in one kernel launch (one per
//! group of inputs where a device binds fewer buffers a launch, as wgpu's do).
//!
//! Every input is seen as a matrix `[outer, width_i]`, where `outer` is the product of the
//! dimensions before `dim` and `width_i` that of `dim` and the ones after it, and the output as
//! `[outer, sum(width_i)]`. The launch is a grid of cubes with one row per input
//! (`CUBE_POS_Y`): a cube copies vectors of its row's input only, so the input is chosen once
//! per cube, with no walk over the others and no divergence, and its threads stride over that
//! input's vectors. Vectors are as wide as every input's row allows; inputs that are not
//! contiguous are made contiguous first.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::std::FastDivmod;

use super::{ShardOps, concat_cubes, concat_group};

impl ShardOps for CubeBackend {
    fn concat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        concat(tensors, dim)
    }

    fn split(tensor: FloatTensor<Self>, sizes: &[usize], dim: usize) -> Vec<FloatTensor<Self>> {
        super::split::split(tensor, sizes, dim)
    }
}

#[cube(launch_unchecked, address_type = "dynamic")]
fn concat_kernel<E: Numeric, N: Size>(
    inputs: &Sequence<OwnedTensor<Vector<E, N>>>,
    output: &mut Tensor<Vector<E, N>>,
    widths: Sequence<FastDivmod<usize>>,
    offsets: Sequence<usize>,
    row_width: usize,
    #[comptime] one_row: bool,
    #[define(E)] _dtype: ElemType,
) {
    let piece = CUBE_POS_Y as usize;
    let stride = (CUBE_COUNT_X * CUBE_DIM) as usize;
    // A sequence's items are indexed at compile time: one unrolled branch per input, taken by
    // whole cubes.
    #[unroll]
    for i in 0..comptime![inputs.len()] {
        if piece == i {
            let tensor = inputs.index(i);
            // The tensor's vectors (its shape's), not its slice's length: that is the
            // buffer's, which a device may round up (CUDA's allocations are).
            let units = tensor.len();
            let input = tensor.as_slice();
            let width = widths.index(i);
            let offset = *offsets.index(i);
            let mut pos = (CUBE_POS_X * CUBE_DIM + UNIT_POS) as usize;
            while pos < units {
                let mut target = pos + offset;
                if comptime![!one_row] {
                    let (row, column) = width.div_mod(pos);
                    target = row * row_width + offset + column;
                }
                output[target] = input[pos];
                pos += stride;
            }
        }
    }
}

/// The widest vector (in elements) that divides every width and that the device loads in one
/// instruction for elements of `elem_size` bytes.
pub(super) fn vector_size(client: &Client, elem_size: usize, widths: &[usize]) -> usize {
    client
        .io_optimized_vector_sizes(elem_size)
        .filter(|&size| widths.iter().all(|width| width.is_multiple_of(size)))
        .max()
        .unwrap_or(1)
}

/// Concatenates `tensors` along `dim` in one launch.
///
/// # Panics
///
/// If `tensors` is empty, or they differ in rank, dtype or outside `dim`.
pub(super) fn concat(tensors: Vec<CubeTensor>, dim: usize) -> CubeTensor {
    let first = tensors.first().expect("concat needs at least one tensor");
    let rank = first.meta.num_dims();
    let dtype = first.dtype;
    let client = first.client.clone();
    let device = first.device.clone();
    let mut shape = first.meta.shape().to_vec();
    for tensor in &tensors[1..] {
        let other = tensor.meta.shape();
        assert_eq!(tensor.dtype, dtype, "concat inputs differ in dtype");
        assert_eq!(other.len(), rank, "concat inputs differ in rank");
        for d in (0..rank).filter(|&d| d != dim) {
            assert_eq!(other[d], shape[d], "concat inputs differ in dimension {d}");
        }
    }
    shape[dim] = tensors.iter().map(|t| t.meta.shape()[dim]).sum();

    let tensors: Vec<CubeTensor> = tensors
        .into_iter()
        .filter(|t| t.meta.shape()[dim] > 0)
        .map(|t| {
            if t.is_contiguous() {
                t
            } else {
                into_contiguous(t)
            }
        })
        .collect();
    if tensors.len() == 1 {
        return tensors.into_iter().next().expect("one tensor");
    }
    let output = empty_device_contiguous_dtype(client.clone(), device, shape.clone().into(), dtype);
    if tensors.is_empty() || output.meta.num_elements() == 0 {
        return output;
    }

    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let widths: Vec<usize> = tensors
        .iter()
        .map(|t| t.meta.shape()[dim] * inner)
        .collect();
    let vector = vector_size(&client, dtype.size(), &widths);
    // Widths, and where each input's columns start in a row of the output, in vectors.
    let widths: Vec<usize> = widths.iter().map(|width| width / vector).collect();
    let row_width: usize = widths.iter().sum();
    let offsets: Vec<usize> = widths
        .iter()
        .scan(0, |start, width| {
            let offset = *start;
            *start += width;
            Some(offset)
        })
        .collect();

    // A launch binds each input, the output and the metadata, and devices bound the bindings
    // of a launch (wgpu: its storage buffers, 8 to 31): more inputs go in several launches,
    // each writing its inputs' columns of the one output.
    let most = (client.properties().hardware.max_bindings as usize)
        .saturating_sub(2)
        .min(concat_group())
        .max(1);
    let mut tensors = tensors.into_iter();
    for (widths, offsets) in widths.chunks(most).zip(offsets.chunks(most)) {
        let group = tensors.by_ref().take(widths.len()).collect();
        let launch = Launch {
            widths,
            offsets,
            vector,
            row_width,
            outer,
        };
        launch.run(&client, group, &output);
    }
    output
}

/// One launch of [`concat_kernel`]: the `widths` and `offsets` (within a row of the output)
/// of the inputs it copies, into rows of `row_width`; all in vectors of `vector` elements.
struct Launch<'a> {
    widths: &'a [usize],
    offsets: &'a [usize],
    vector: usize,
    row_width: usize,
    outer: usize,
}

impl Launch<'_> {
    fn run(&self, client: &Client, inputs: Vec<CubeTensor>, output: &CubeTensor) {
        let address = inputs
            .iter()
            .map(CubeTensor::required_address_type)
            .chain([output.required_address_type()])
            .max()
            .unwrap_or_default();
        let pieces = inputs.len() as u32;
        let mut args = SequenceArg::new();
        let mut widths = SequenceArg::new();
        let mut offsets = SequenceArg::new();
        for ((tensor, width), offset) in inputs.into_iter().zip(self.widths).zip(self.offsets) {
            args.push(tensor.into_tensor_arg());
            widths.push(*width);
            offsets.push(*offset);
        }
        // Enough cubes for the largest input, at most about `concat_cubes` in all and what a
        // grid's row holds on the device: the threads of a cube stride over the rest.
        let largest = self.widths.iter().max().expect("an input") * self.outer;
        let cube_dim = CubeDim::new(client, largest);
        let row = client.properties().hardware.max_cube_count.0 as usize;
        let per_piece = largest
            .div_ceil(cube_dim.num_elems() as usize)
            .min(concat_cubes().div_ceil(pieces as usize))
            .min(row)
            .max(1);
        unsafe {
            concat_kernel::launch_unchecked(
                client,
                CubeCount::new_2d(per_piece as u32, pieces),
                cube_dim,
                address,
                self.vector,
                args,
                output.clone().into_tensor_arg(),
                widths,
                offsets,
                self.row_width,
                self.outer == 1,
                dtype_to_storage_type(output.dtype),
            );
        }
    }
}
