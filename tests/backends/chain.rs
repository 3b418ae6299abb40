//! The element-wise chain of `equivalence::nested_structures`, step by step: through the
//! wrapper, and on pieces of the batch without it, so that a failure there tells a backend's
//! fault, or one of the split's views, from one of the wrapper's.

use crate::common::*;
use burn::tensor::Tensor;
use burn_dataparallel::DataParallel;
use burn_dataparallel::DataParallelBackend;

/// Each step of `nested_structures`' element-wise chain on the shards (the linear output,
/// scaled, masked, plus a scattered 1-D tensor), gathered on its own and compared in order, so
/// that a failure names the first step that differs. Keeping the steps as outputs also stops
/// a fusing backend from fusing the chain, which tells a fused kernel's fault from an op's.
fn elementwise_chain_steps_match_bare<B: DataParallelBackend>(replicas: usize) {
    let device = Default::default();
    let model = Mlp::<B>::new(8, 16, 4, &device);
    let dp = DataParallel::new(model, devices::<B>(replicas)).unwrap();
    let model = dp.module().clone();
    let features = random::<B, 2>([7, 8], &device);
    let mask = random::<B, 2>([7, 4], &device).greater_elem(0.0);
    let extra = random::<B, 1>([7], &device);
    let input = (features, mask, extra);
    let expected = chain_steps(&model, input.clone());
    let actual = dp.forward_with(input, chain_steps);
    for ((name, a), e) in CHAIN_STEPS.iter().zip(actual).zip(expected) {
        assert_close(&values(a), &values(e), name);
    }
}

/// How [`chain_pieces_match_rows`] cuts the batch into pieces.
#[derive(Debug, Clone, Copy)]
enum Pieces {
    /// This crate's split kernel (views of one buffer, or of the input), as scatter cuts.
    Split,
    /// Each piece uploaded on its own from the host: fresh buffers, no split at all.
    Host,
}

/// The element-wise chain of `elementwise_chain_steps` on pieces [3, 2, 2] of a 7-row batch
/// (features, mask and a 1-D tensor cut alike) gives each piece's rows of the chain on the
/// whole batch, with no wrapper: on the calling thread, or each piece on a thread of its own
/// (as replicas run). Tells a backend's fault, or one of the split's views, from one of the
/// wrapper's.
fn chain_pieces_match_rows<B: DataParallelBackend>(pieces: Pieces, threads: bool) {
    let device = Default::default();
    let model = Mlp::<B>::new(8, 16, 4, &device);
    let features = random::<B, 2>([7, 8], &device);
    let mask = random::<B, 2>([7, 4], &device).greater_elem(0.0);
    let extra = random::<B, 1>([7], &device);
    let steps = |input| chain_steps(&model, input);
    let sizes = [3, 2, 2];
    let inputs: Vec<ChainInput<B>> = match pieces {
        Pieces::Split => {
            let features = burn_dataparallel::backend::split(features.clone(), &sizes, 0);
            let mask = burn_dataparallel::backend::split(mask.clone(), &sizes, 0);
            let extra = burn_dataparallel::backend::split(extra.clone(), &sizes, 0);
            let rest = mask.into_iter().zip(extra);
            features
                .into_iter()
                .zip(rest)
                .map(|(f, (m, e))| (f, m, e))
                .collect()
        }
        Pieces::Host => {
            let mut start = 0;
            sizes
                .iter()
                .map(|&rows| {
                    let range = start..start + rows;
                    start += rows;
                    (
                        Tensor::from_data(
                            features.clone().slice(range.clone()).into_data(),
                            &device,
                        ),
                        Tensor::from_data(mask.clone().slice(range.clone()).into_data(), &device),
                        Tensor::from_data(extra.clone().slice(range).into_data(), &device),
                    )
                })
                .collect()
        }
    };
    let whole = steps((features, mask, extra));
    let outputs: Vec<Vec<Tensor<B, 2>>> = match threads {
        false => inputs.into_iter().map(steps).collect(),
        true => std::thread::scope(|scope| {
            let handles: Vec<_> = inputs
                .into_iter()
                .map(|x| scope.spawn(|| steps(x)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        }),
    };
    let mut start = 0;
    for (i, piece) in outputs.into_iter().enumerate() {
        let rows = piece[0].dims()[0];
        for ((name, actual), expected) in CHAIN_STEPS.iter().zip(piece).zip(&whole) {
            let expected = expected.clone().slice(start..start + rows);
            assert_close(
                &values(actual),
                &values(expected),
                &format!("{pieces:?} piece {i}: {name}"),
            );
        }
        start += rows;
    }
}

type ChainInput<B> = (Tensor<B, 2>, Tensor<B, 2, burn::tensor::Bool>, Tensor<B, 1>);

/// What [`chain_steps`] returns, in order.
const CHAIN_STEPS: [&str; 4] = ["linear output", "scaled", "masked", "plus the 1-D tensor"];

/// The MLP's output on the features, then the output scaled, masked and plus the 1-D tensor
/// as a column: each step kept as an output.
fn chain_steps<B: DataParallelBackend>(
    model: &Mlp<B>,
    (features, mask, extra): ChainInput<B>,
) -> Vec<Tensor<B, 2>> {
    let linear = model.forward(features);
    let scaled = linear.clone().mul_scalar(0.5);
    let masked = scaled.clone().mask_fill(mask, 0.0);
    let shifted = masked.clone() + extra.unsqueeze_dim(1);
    vec![linear, scaled, masked, shifted]
}

backend_tests! {
    elementwise_chain_steps => elementwise_chain_steps_match_bare(3);
    split_pieces => chain_pieces_match_rows(Pieces::Split, false), moves_nothing = "no wrapper";
    split_pieces_on_threads => chain_pieces_match_rows(Pieces::Split, true),
        moves_nothing = "no wrapper";
    host_pieces => chain_pieces_match_rows(Pieces::Host, false), moves_nothing = "no wrapper";
    host_pieces_on_threads => chain_pieces_match_rows(Pieces::Host, true),
        moves_nothing = "no wrapper";
}
