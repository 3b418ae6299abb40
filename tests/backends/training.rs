//! Optimizer steps and checkpoints through the wrapper equal those of the bare model.

use crate::common::*;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::{Distribution, Int, Tensor};
use burn_dataparallel::DataParallelBackend;
use burn_dataparallel::{DataParallel, Mean};

fn mse<B: DataParallelBackend>(model: &Mlp<B>, x: Tensor<B, 2>, y: Tensor<B, 2>) -> Tensor<B, 1> {
    (model.forward(x) - y).powi_scalar(2).mean()
}

/// A fresh model with the same parameters (and ids) as `model`, sharing nothing with it.
fn copy_of<B: DataParallelBackend>(model: &Mlp<B>) -> Mlp<B> {
    Mlp::new(8, 16, 4, &Default::default()).load_record(model.clone().into_record())
}

fn batches<B: DataParallelBackend>(steps: usize) -> Vec<(Tensor<B, 2>, Tensor<B, 2>)> {
    let device = Default::default();
    (0..steps)
        .map(|_| (random([7, 8], &device), random([7, 4], &device)))
        .collect()
}

/// Steps of `optim` through the wrapper leave the parameters where the same steps on the bare
/// model leave them.
fn optimizer_steps_match_bare<B: DataParallelBackend>(
    mut optim_bare: impl Optimizer<Mlp<B>, B>,
    mut optim_dp: impl Optimizer<DataParallel<B, Mlp<B>>, B>,
) {
    let device = Default::default();
    let mut dp = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(3)).unwrap();
    let mut bare = copy_of(dp.module());

    for (x, y) in batches::<B>(3) {
        let loss = mse(&bare, x.clone(), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &bare);
        bare = optim_bare.step(0.05, bare, grads);

        let Mean(loss) = dp.forward_with((x, y), |m, (x, y)| Mean(mse(m, x, y)));
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = optim_dp.step(0.05, dp, grads);
    }
    for (a, e) in param_values(&dp).iter().zip(param_values(&bare).iter()) {
        assert_close(a, e, "parameters after three steps");
    }
}

fn sgd_steps_match_bare<B: DataParallelBackend>() {
    let config = SgdConfig::new().with_momentum(Some(burn::optim::momentum::MomentumConfig::new()));
    optimizer_steps_match_bare::<B>(config.init(), config.init());
}

fn adam_steps_match_bare<B: DataParallelBackend>() {
    relax_for_adam();
    let config = adam();
    optimizer_steps_match_bare::<B>(config.init(), config.init());
}

/// Optimizer state built through the wrapper keeps working on the unwrapped model: both see the
/// same parameter ids.
fn optimizer_state_carries_over_to_the_bare_model<B: DataParallelBackend>() {
    relax_for_adam();
    let device = Default::default();
    let mut dp = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(2)).unwrap();
    let mut bare = copy_of(dp.module());
    let mut optim_bare = adam().init::<B, Mlp<B>>();
    let mut optim_dp = adam().init::<B, DataParallel<B, Mlp<B>>>();
    let data = batches::<B>(3);

    for (x, y) in data.iter().cloned() {
        let grads = GradientsParams::from_grads(mse(&bare, x, y).backward(), &bare);
        bare = optim_bare.step(0.05, bare, grads);
    }
    for (x, y) in data[..2].iter().cloned() {
        let Mean(loss) = dp.forward_with((x, y), |m, (x, y)| Mean(mse(m, x, y)));
        let grads = GradientsParams::from_grads(loss.backward(), &dp);
        dp = optim_dp.step(0.05, dp, grads);
    }
    let mut optim = adam().init::<B, Mlp<B>>();
    optim = optim.load_record(optim_dp.to_record());
    let mut unwrapped = dp.into_inner();
    let (x, y) = data[2].clone();
    let grads = GradientsParams::from_grads(mse(&unwrapped, x, y).backward(), &unwrapped);
    unwrapped = optim.step(0.05, unwrapped, grads);

    for (a, e) in param_values(&unwrapped)
        .iter()
        .zip(param_values(&bare).iter())
    {
        assert_close(a, e, "parameters after the third step");
    }
}

/// The wrapper's record is byte for byte the bare model's record.
fn records_are_byte_identical<B: DataParallelBackend>() {
    let device = Default::default();
    let model = Mlp::<B>::new(8, 16, 4, &device);
    let dp = DataParallel::new(model, devices::<B>(2)).unwrap();
    let model = dp.module().clone();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let through_wrapper = recorder.record(dp.into_record(), ()).unwrap();
    let bare = recorder.record(model.into_record(), ()).unwrap();
    assert_eq!(through_wrapper, bare);
}

/// A file saved through the wrapper loads into the bare model, and the reverse.
fn checkpoints_round_trip<B: DataParallelBackend>() {
    let device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    let trained = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(2)).unwrap();

    let path = dir.path().join("through-wrapper");
    trained.clone().save_file(&path, &recorder).unwrap();
    let bare = Mlp::<B>::new(8, 16, 4, &device)
        .load_file(&path, &recorder, &device)
        .unwrap();
    assert_eq!(param_values(&bare), param_values(&trained));

    let path = dir.path().join("bare");
    bare.clone().valid().save_file(&path, &recorder).unwrap();
    let fresh = Mlp::<B::InnerBackend>::new(8, 16, 4, &device);
    let wrapped = DataParallel::new(fresh, devices::<B::InnerBackend>(3))
        .unwrap()
        .load_file(&path, &recorder, &device)
        .unwrap();
    assert_eq!(param_values(&wrapped), param_values(&bare));
}

/// `valid()` gives an inference wrapper with the same parameters and settings; `train()`
/// comes back.
fn valid_and_train_round_trip<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(3)).unwrap();
    let inference = dp.valid();
    assert_eq!(inference.replica_devices().len(), 3);
    assert_eq!(param_values(&inference), param_values(&dp));
    let x = random::<B::InnerBackend, 2>([5, 8], &device);
    let y = inference.forward(x.clone());
    assert_close(
        &values(y),
        &values(dp.module().valid().forward(x)),
        "inference output",
    );
    let back: DataParallel<B, Mlp<B>> = inference.train();
    assert_eq!(param_values(&back), param_values(&dp));
    assert_eq!(back.num_params(), dp.module().num_params());
}

fn display_shows_the_wrapped_module<B: DataParallelBackend>() {
    let dp = DataParallel::new(
        Mlp::<B>::new(8, 16, 4, &Default::default()),
        devices::<B>(2),
    )
    .unwrap();
    let shown = dp.to_string();
    assert!(shown.starts_with("DataParallel"), "{shown}");
    assert!(shown.contains("Mlp"), "{shown}");
    assert!(shown.contains("hidden"), "{shown}");
}

/// The custom training loop of Burn's book, written once and expanded for the bare model and
/// for the wrapper: swapping the model is the only change.
macro_rules! book_training_loop {
    ($model:ident, $optim:ident, $batches:expr) => {
        for (inputs, targets) in $batches {
            let output = $model.forward(inputs);
            let loss = CrossEntropyLossConfig::new()
                .init(&output.device())
                .forward(output.clone(), targets);
            let grads = loss.backward();
            let grads = GradientsParams::from_grads(grads, &$model);
            $model = $optim.step(0.05, $model, grads);
        }
    };
}

fn book_loop_is_unchanged<B: DataParallelBackend>() {
    let device = Default::default();
    let batches = (0..3).map(|_| {
        let inputs = random::<B, 2>([9, 8], &device);
        let targets = Tensor::<B, 1, Int>::random([9], Distribution::Uniform(0.0, 4.0), &device);
        (inputs, targets)
    });
    let batches: Vec<_> = batches.collect();

    let mut model = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(3)).unwrap();
    let mut bare = copy_of(model.module());
    let mut optim = SgdConfig::new().init();
    book_training_loop!(model, optim, batches.clone());
    let mut optim = SgdConfig::new().init();
    book_training_loop!(bare, optim, batches);

    for (a, e) in param_values(&model).iter().zip(param_values(&bare).iter()) {
        assert_close(a, e, "parameters after the book's loop");
    }
}

/// A warm-up runs every replica once and changes nothing: the parameters, and the next step's
/// gradients, are those of a wrapper that was not warmed up.
fn warm_up_changes_nothing<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(3)).unwrap();
    let cold = DataParallel::new(copy_of(dp.module()), devices::<B>(3)).unwrap();
    let (x, y) = (random([8, 8], &device), random([8, 4], &device));

    let warm = dp
        .warm_up((x.clone(), y.clone()), |m, (x, y)| mse(m, x, y))
        .unwrap();
    assert_eq!(warm.shard_sizes, vec![3, 3, 2]);
    assert!(warm.total() >= warm.forward);
    for (a, e) in param_values(&dp).iter().zip(param_values(&cold).iter()) {
        assert_close(a, e, "parameters after the warm-up");
    }
    let step = |dp: &DataParallel<B, Mlp<B>>| {
        let Mean(loss) = dp.forward_with((x.clone(), y.clone()), |m, (x, y)| Mean(mse(m, x, y)));
        let grads = loss.backward();
        values(dp.module().hidden.weight.val().grad(&grads).unwrap())
    };
    assert_close(&step(&dp), &step(&cold), "gradients after the warm-up");
    assert!(matches!(
        dp.warm_up((x.slice(0..0), y.slice(0..0)), |m, (x, y)| mse(m, x, y)),
        Err(burn_dataparallel::DataParallelError::EmptyBatch { dim: 0 })
    ));
}

/// The step profile accounts for every replica and for the bytes moved: none when the replicas
/// share the parameters' device; with `DATAPARALLEL_TEST_DEVICES=distinct` on several GPUs,
/// the whole parameter set once per replica on another device, each in one coalesced transfer
/// there and one back. The gradients through the transfers equal the single-device run's.
fn profile_counts_transfers<B: DataParallelBackend>() {
    let device: B::Device = Default::default();
    let replicas = devices::<B>(3);
    let dp = DataParallel::new(Mlp::<B>::new(8, 16, 4, &device), replicas.clone()).unwrap();
    let bare = copy_of(dp.module());
    let (x, y) = (random([9, 8], &device), random([9, 4], &device));
    dp.set_profiling(true);
    let Mean(loss) = dp.forward_with((x.clone(), y.clone()), |m, (x, y)| Mean(mse(m, x, y)));
    let grads = loss.backward();
    let profile = dp.profile().expect("a profiled step");

    let dtype_size = dp.module().hidden.weight.val().dtype().size() as u64;
    let param_bytes = dp.module().num_params() as u64 * dtype_size;
    let others = replicas.iter().filter(|d| **d != device).count();
    assert_eq!(profile.forward.len(), 3);
    assert_eq!(profile.bytes_broadcast, others as u64 * param_bytes);
    assert_eq!(profile.broadcast_transfers, others);
    assert_eq!(profile.bytes_reduced, others as u64 * param_bytes);
    assert_eq!(profile.reduce_transfers, others);
    // Shards of 3 items, inputs of 8 and targets of 4 values.
    assert_eq!(
        profile.bytes_scattered,
        others as u64 * 3 * (8 + 4) * dtype_size
    );
    // Each replica's one-element loss comes back to be combined.
    assert_eq!(profile.bytes_gathered, others as u64 * dtype_size);
    assert_eq!(
        profile.bytes_running_states, 0,
        "the MLP has no running states"
    );
    // The parallel backward (where the backend runs one) waited for the three replicas'
    // backwards on the calling thread, then combined their gradients there, transfers
    // included.
    let none = std::time::Duration::ZERO;
    if !profile.backward.is_empty() {
        assert_eq!(profile.backward.len(), 3, "{profile}");
        assert!(profile.backward_wait > none, "{profile}");
        assert!(profile.backward_reduce > none, "{profile}");
        assert!(
            profile.backward_reduce >= profile.backward_transfers,
            "{profile}"
        );
    } else {
        assert_eq!(profile.backward_wait, none, "{profile}");
    }

    let expected = mse(&bare, x, y).backward();
    let weight = |m: &Mlp<B>, g| values(m.hidden.weight.val().grad(g).expect("weight gradient"));
    let bias = |m: &Mlp<B>, g| {
        let bias = m.output.bias.as_ref().expect("a bias");
        values(bias.val().grad(g).expect("bias gradient"))
    };
    assert_close(
        &weight(dp.module(), &grads),
        &weight(&bare, &expected),
        "weight gradient",
    );
    assert_close(
        &bias(dp.module(), &grads),
        &bias(&bare, &expected),
        "bias gradient",
    );
}

backend_tests! {
    profile_transfers => profile_counts_transfers();
    warm_up => warm_up_changes_nothing();
    book_loop => book_loop_is_unchanged();
    sgd_steps => sgd_steps_match_bare();
    adam_steps => adam_steps_match_bare();
    optimizer_state_carries_over => optimizer_state_carries_over_to_the_bare_model();
    byte_identical_records => records_are_byte_identical(), moves_nothing = "records only, no forward";
    checkpoint_round_trips => checkpoints_round_trip(), moves_nothing = "checkpoints only, no forward";
    valid_and_train => valid_and_train_round_trip();
    display => display_shows_the_wrapped_module(), moves_nothing = "no forward";
}
