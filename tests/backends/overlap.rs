//! The reduce that overlaps the replicas' backward (`DataParallelConfig::overlap_reduce`):
//! every gradient it gives is the one the reduce after the backward gives, bit for bit
//! (parameters, broadcast values passed once or twice, input rows, parameters without a
//! gradient), with buckets of any size; and the profile shows each bucket.

use crate::common::*;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Tensor, backend::Backend};
use burn_dataparallel::{Broadcast, DataParallel, DataParallelBackend, DataParallelConfig};

fn wrap<B: DataParallelBackend, M: Module<B>>(
    model: M,
    overlap: bool,
    bucket_size: usize,
) -> DataParallel<B, M> {
    DataParallelConfig::new()
        .with_overlap_reduce(overlap)
        .with_bucket_size(bucket_size)
        .init(model, devices::<B>(3))
        .unwrap()
}

/// `sum(output * probe(output))`: every output element gets its own gradient.
fn weighted<B: Backend, const D: usize>(output: Tensor<B, D>) -> Tensor<B, 1> {
    let weights = probe(&output);
    (output * weights).sum()
}

/// `model` with its parameters initialised (a wrapper initialises lazy ones), so that its
/// clones hold the same values.
fn initialised<B: DataParallelBackend, M: Module<B>>(model: M) -> M {
    wrap(model, false, 0).module().clone()
}

/// Bit patterns, so that `-0.0` and `0.0` differ.
fn bits(values: Option<Vec<f32>>) -> Option<Vec<u32>> {
    values.map(|v| v.into_iter().map(f32::to_bits).collect())
}

/// Asserts that every gradient has the same bits in both runs, naming those that differ.
///
/// Under Burn's `Fusion`, within the tolerance instead: the overlapped run orders the
/// replicas' operations differently, Fusion fuses them into other kernels, and on fresh
/// CubeCL caches its autotune chose them apart (a gradient 3e-4 off, TF32's size, one H200,
/// 2026-12-02); the same sums still run in the same order.
fn assert_same_bits<B: Backend>(
    actual: &[Option<Vec<u32>>],
    expected: &[Option<Vec<u32>>],
    bucket_size: usize,
) {
    let what = format!("with buckets of {bucket_size} bytes");
    let differences = differences::<B>(actual, expected, &what);
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// What differs between two runs' gradients, a line per gradient: how many elements differ,
/// how many are NaN on each side, and the first that differs (under `Fusion`, within the
/// tolerance instead, panicking there).
fn differences<B: Backend>(
    actual: &[Option<Vec<u32>>],
    expected: &[Option<Vec<u32>>],
    what: &str,
) -> Vec<String> {
    assert_eq!(actual.len(), expected.len());
    let fusion = std::any::type_name::<B>().contains("Fusion");
    let mut lines = Vec::new();
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        match (a, e) {
            (Some(a), Some(e)) if fusion => {
                let floats = |v: &[u32]| v.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>();
                assert_close(&floats(a), &floats(e), &format!("gradient {i} {what}"));
            }
            (Some(a), Some(e)) => {
                let differ: Vec<usize> = (0..a.len()).filter(|&j| a[j] != e[j]).collect();
                let nans = |v: &[u32]| v.iter().filter(|b| f32::from_bits(**b).is_nan()).count();
                // Equal bits would let NaN match NaN: a reference that is not finite fails.
                let infinite = e
                    .iter()
                    .filter(|b| !f32::from_bits(**b).is_finite())
                    .count();
                if infinite > 0 {
                    lines.push(format!(
                        "gradient {i} {what}: the reference holds {infinite} values that are \
                         not finite"
                    ));
                }
                if let Some(&j) = differ.first() {
                    lines.push(format!(
                        "gradient {i} {what}: {} of {} elements differ ({} NaN, against {} \
                         NaN), the first at {j}: {}, against {}",
                        differ.len(),
                        a.len(),
                        nans(a),
                        nans(e),
                        f32::from_bits(a[j]),
                        f32::from_bits(e[j])
                    ));
                }
            }
            (None, None) => {}
            _ => lines.push(format!(
                "gradient {i} is present in one run only ({what}): {}, against {}",
                a.is_some(),
                e.is_some()
            )),
        }
    }
    lines
}

/// Every gradient of one step of `ConvNet` through a wrapper: the parameters, a broadcast
/// value passed twice (two leaves of one tensor in every replica), the tracked input's rows;
/// two forwards before the backward.
fn conv_step<B: DataParallelBackend>(
    model: &ConvNet<B>,
    overlap: bool,
    bucket_size: usize,
    data: &(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 2>),
) -> Vec<Option<Vec<u32>>> {
    let dp = wrap(model.clone(), overlap, bucket_size);
    let (x1, x2, scale) = (
        data.0.clone().require_grad(),
        data.1.clone(),
        data.2.clone().require_grad(),
    );
    let forward =
        |m: &ConvNet<B>, (x, Broadcast(s), Broadcast(t)): (_, _, Broadcast<Tensor<B, 2>>)| {
            m.forward(x) * s + t
        };
    let y1 = dp.forward_with(
        (
            x1.clone(),
            Broadcast(scale.clone()),
            Broadcast(scale.clone()),
        ),
        forward,
    );
    let y2 = dp.forward_with(
        (x2, Broadcast(scale.clone()), Broadcast(scale.clone())),
        forward,
    );
    let grads = (weighted(y1) + weighted(y2).mul_scalar(0.5)).backward();
    let mut all: Vec<Option<Vec<u32>>> = maybe_param_grads(dp.module(), &grads)
        .into_iter()
        .map(|(_, grad)| bits(grad))
        .collect();
    all.push(bits(x1.grad(&grads).map(values)));
    all.push(bits(scale.grad(&grads).map(values)));
    all
}

fn conv_data<B: Backend>(device: &B::Device) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 2>) {
    (
        random([7, 3, 6, 6], device),
        random([5, 3, 6, 6], device),
        random([1, 3], device),
    )
}

/// The overlapped reduce gives the reduce-after-the-backward's gradients bit for bit, with
/// a bucket per parameter, a few buckets, and one bucket for all.
fn overlapped_reduce_is_bit_identical_case<B: DataParallelBackend>() {
    let device = Default::default();
    let model = initialised(ConvNet::<B>::new(&device));
    let data = conv_data::<B>(&device);
    // Once to compile and tune, so that both runs below use the same kernels.
    let _ = conv_step(&model, false, 1 << 20, &data);
    let after = conv_step(&model, false, 1 << 20, &data);
    assert!(
        after.iter().all(Option::is_some),
        "every tensor has a gradient"
    );
    let mut report = Vec::new();
    for bucket_size in [0, 200, 1 << 20] {
        let overlapped = conv_step(&model, true, bucket_size, &data);
        let what = format!("overlapped with buckets of {bucket_size} bytes");
        report.extend(differences::<B>(&overlapped, &after, &what));
    }
    if !report.is_empty() {
        // Whether the reduce after the backward, run again, still gives its first result:
        // tells the overlap from kernels that changed between the runs.
        let again = conv_step(&model, false, 1 << 20, &data);
        report.extend(differences::<B>(
            &again,
            &after,
            "after the backward, run again",
        ));
        panic!(
            "the overlapped reduce differs from the reduce after the backward \
             (against the first run after the backward):\n{}",
            report.join("\n")
        );
    }
}

/// A model with a parameter its forward uses on no path to the output and one it never
/// uses: neither gets a gradient, with or without the overlap, and the buckets holding them
/// fall back to the reduce after the backward.
#[derive(Module, Debug)]
struct Partial<B: Backend> {
    first: Linear<B>,
    discarded: Linear<B>,
    unused: Linear<B>,
    last: Linear<B>,
}

impl<B: Backend> Partial<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            first: LinearConfig::new(6, 8).init(device),
            discarded: LinearConfig::new(8, 8).init(device),
            unused: LinearConfig::new(8, 8).init(device),
            last: LinearConfig::new(8, 3).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.first.forward(x);
        let _dropped = self.discarded.forward(hidden.clone());
        self.last.forward(hidden)
    }
}

fn partial_step<B: DataParallelBackend>(
    model: &Partial<B>,
    overlap: bool,
    bucket_size: usize,
    x: &Tensor<B, 2>,
) -> Vec<Option<Vec<u32>>> {
    let dp = wrap(model.clone(), overlap, bucket_size);
    let grads = weighted(dp.forward_with(x.clone(), |m, x| m.forward(x))).backward();
    maybe_param_grads(dp.module(), &grads)
        .into_iter()
        .map(|(_, grad)| bits(grad))
        .collect()
}

fn parameters_without_gradients_case<B: DataParallelBackend>() {
    let device = Default::default();
    let model = initialised(Partial::<B>::new(&device));
    let x = random::<B, 2>([7, 6], &device);
    let _ = partial_step(&model, false, 1 << 20, &x);
    let after = partial_step(&model, false, 1 << 20, &x);
    let present: Vec<bool> = after.iter().map(Option::is_some).collect();
    // first (weight, bias), discarded, unused, last.
    let expected = [true, true, false, false, false, false, true, true];
    assert_eq!(present, expected, "which parameters have a gradient");
    for bucket_size in [0, 64, 1 << 20] {
        let overlapped = partial_step(&model, true, bucket_size, &x);
        assert_same_bits::<B>(&overlapped, &after, bucket_size);
    }
}

/// With profiling, the overlapped reduce lists its buckets: together they hold every
/// parameter once, each ends after it starts; without the overlap, none.
fn profile_shows_the_buckets_case<B: DataParallelBackend>() {
    let device = Default::default();
    let model = initialised(ConvNet::<B>::new(&device));
    let x = random::<B, 4>([7, 3, 6, 6], &device);
    let step = |overlap: bool| {
        let dp = wrap(model.clone(), overlap, 200);
        dp.set_profiling(true);
        let _ = weighted(dp.forward_with(x.clone(), |m, x| m.forward(x))).backward();
        dp.profile().expect("profiling is on")
    };
    let profile = step(true);
    if !B::concurrent_backward() {
        // No parallel backward, nothing to overlap.
        assert!(profile.reduce_buckets.is_empty());
        return;
    }
    let buckets = &profile.reduce_buckets;
    let params: usize = model.num_params();
    let tensors: usize = buckets.iter().map(|b| b.tensors).sum();
    let bytes: u64 = buckets.iter().map(|b| b.bytes).sum();
    // The gradients' element size is the backend's float type's (f32, f16).
    let element = random::<B, 1>([1], &device).dtype().size() as u64;
    assert_eq!(tensors, 4, "conv and head, weight and bias each: {profile}");
    assert_eq!(bytes, element * params as u64, "{profile}");
    assert!(
        buckets.len() as u64 >= element * params as u64 / 200,
        "buckets of 200 bytes: {profile}"
    );
    let mut indices: Vec<usize> = buckets.iter().map(|b| b.index).collect();
    indices.sort();
    indices.dedup();
    assert_eq!(indices.len(), buckets.len(), "each bucket once: {profile}");
    assert!(buckets.iter().all(|b| b.start <= b.end), "{profile}");
    assert!(
        profile.to_string().contains("buckets reduced at"),
        "{profile}"
    );
    assert!(step(false).reduce_buckets.is_empty());
}

backend_tests! {
    overlapped_reduce_is_bit_identical => overlapped_reduce_is_bit_identical_case();
    parameters_without_gradients => parameters_without_gradients_case();
    profile_shows_the_buckets => profile_shows_the_buckets_case();
}
