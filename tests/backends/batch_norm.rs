//! Batch-norm running statistics after training through the wrapper: the average over
//! replicas of what each replica's shard alone would give.

use crate::common::*;
use burn::module::Module;
use burn::tensor::Tensor;

use burn_dataparallel::{DataParallel, DataParallelBackend, DataParallelError};

/// Running (mean, var) a fresh copy of `model` would hold after one training forward on each
/// shard alone, averaged over shards.
fn expected_statistics<B: DataParallelBackend>(
    model: &BnNet<B>,
    shards: Vec<Tensor<B, 2>>,
) -> (Vec<f32>, Vec<f32>) {
    let count = shards.len() as f32;
    let mut sums = (vec![0f32; 16], vec![0f32; 16]);
    for shard in shards {
        let copy =
            BnNet::<B>::new(0.0, &Default::default()).load_record(model.clone().into_record());
        let _ = copy.forward(shard);
        let (mean, var) = (
            values(copy.norm.running_mean.value_sync()),
            values(copy.norm.running_var.value_sync()),
        );
        sums.0
            .iter_mut()
            .zip(mean)
            .for_each(|(s, v)| *s += v / count);
        sums.1
            .iter_mut()
            .zip(var)
            .for_each(|(s, v)| *s += v / count);
    }
    sums
}

fn statistics<B: DataParallelBackend>(model: &BnNet<B>) -> (Vec<f32>, Vec<f32>) {
    (
        values(model.norm.running_mean.value()),
        values(model.norm.running_var.value()),
    )
}

/// Four steps with 3, 1 (the module itself, on the calling thread), 2, then 3 shards: each
/// ends with the average of the shards' updates of the previous statistics, whichever
/// replicas took part before; the same with statistics per device (on one device: the same
/// path).
fn running_statistics_average_the_shards<B: DataParallelBackend>() {
    for per_device in [false, true] {
        running_statistics_average::<B>(per_device);
    }
}

fn running_statistics_average<B: DataParallelBackend>(per_device: bool) {
    let device = Default::default();
    let dp = DataParallel::new(BnNet::<B>::new(0.0, &device), devices::<B>(3)).unwrap();
    let dp = match per_device {
        true => dp.with_running_states_per_device(),
        false => dp,
    };
    for batch in [7, 1, 2, 9] {
        let input = random::<B, 2>([batch, 8], &device);
        let shards = dp.shards(&input).unwrap();
        let elsewhere = shards.devices().iter().any(|d| d != dp.output_device());
        if !per_device && elsewhere && !B::orders_receives() {
            // CUDA: replicas on other GPUs would move the shared statistics unfenced.
            let result = dp.try_forward_with(input, |m, x| m.forward(x));
            assert!(
                matches!(result, Err(DataParallelError::SharedRunningStates { .. })),
                "shared statistics on other devices are refused"
            );
            continue;
        }
        let sizes = shards.sizes().to_vec();
        let expected = expected_statistics(dp.module(), input.clone().split_with_sizes(sizes, 0));
        // Own sets on other devices come home once each: running mean and variance.
        let mut homes_away: Vec<&B::Device> = Vec::new();
        for device in shards.devices() {
            if per_device && device != dp.output_device() && !homes_away.contains(&device) {
                homes_away.push(device);
            }
        }
        let weight = dp.module().hidden.weight.val();
        // The batch norm's width is the hidden layer's output width.
        let state_bytes = 2 * weight.dims()[1] as u64 * weight.dtype().size() as u64;
        dp.set_profiling(true);
        let _ = dp.forward_with(input, |m, x| m.forward(x));
        let profile = dp.profile().expect("a profiled step");
        assert_eq!(
            profile.bytes_running_states,
            homes_away.len() as u64 * state_bytes,
            "running-state bytes after batch {batch}"
        );
        assert_eq!(
            dp.module().devices(),
            vec![dp.output_device().clone()],
            "the statistics stay on the module's device"
        );
        let actual = statistics(dp.module());
        assert_close(
            &actual.0,
            &expected.0,
            &format!("running mean after batch {batch}"),
        );
        assert_close(
            &actual.1,
            &expected.1,
            &format!("running var after batch {batch}"),
        );
    }
}

/// Statistics gathered through the wrapper are those saved in its record and used by its
/// inference replicas.
fn statistics_reach_the_record_and_inference<B: DataParallelBackend>() {
    use burn::module::AutodiffModule;
    let device = Default::default();
    let dp = DataParallel::new(BnNet::<B>::new(0.0, &device), devices::<B>(2))
        .unwrap()
        .with_running_states_per_device();
    let _ = dp.forward_with(random::<B, 2>([6, 8], &device), |m, x| m.forward(x));
    let trained = statistics(dp.module());
    assert_ne!(trained.0, vec![0.0; 16], "the running mean moved");

    let restored = BnNet::<B>::new(0.0, &device).load_record(dp.clone().into_record());
    assert_eq!(statistics(&restored), trained);

    let inference = dp.valid();
    let x = random::<B::InnerBackend, 2>([5, 8], &device);
    let expected = restored.valid().forward(x.clone());
    let actual = inference.forward_with(x, |m, x| m.forward(x));
    assert_close(&values(actual), &values(expected), "inference output");
}

backend_tests! {
    running_statistics => running_statistics_average_the_shards();
    record_and_inference => statistics_reach_the_record_and_inference();
}
