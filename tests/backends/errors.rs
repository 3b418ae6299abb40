//! Every way a user can misuse the wrapper gives a typed error, and the wrapper stays usable.

use crate::common::*;
use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use burn_dataparallel::DataParallelBackend;
use burn_dataparallel::{
    DataParallel, DataParallelConfig, DataParallelError, Gather, Mean, Scatter, Shared,
};

fn model<B: DataParallelBackend>(replicas: usize) -> DataParallel<B, Mlp<B>> {
    DataParallel::new(
        Mlp::new(8, 16, 4, &Default::default()),
        devices::<B>(replicas),
    )
    .unwrap()
}

/// `try_forward_with` for a forward that cannot fail.
fn attempt<B, M, I, O>(
    dp: &DataParallel<B, M>,
    input: I,
    forward: fn(&M, I) -> O,
) -> Result<O, DataParallelError>
where
    B: AutodiffBackend + burn_dataparallel::ConcatBackend,
    M: Module<B>,
    I: Scatter<B> + Send,
    O: Gather<B> + Send,
{
    dp.try_forward_with(input, forward)
}

fn configuration_errors<B: DataParallelBackend>() {
    let mlp = || Mlp::<B>::new(8, 16, 4, &Default::default());
    assert!(matches!(
        DataParallel::new(mlp(), Vec::new()),
        Err(DataParallelError::NoDevices)
    ));
    assert!(matches!(
        DataParallelConfig::new()
            .with_shard_weights(Some(vec![1.0]))
            .init(mlp(), devices::<B>(2)),
        Err(DataParallelError::ShardWeightsLength {
            expected: 2,
            found: 1
        })
    ));
    assert!(matches!(
        DataParallelConfig::new()
            .with_shard_weights(Some(vec![1.0, -2.0]))
            .init(mlp(), devices::<B>(2)),
        Err(DataParallelError::InvalidShardWeight { index: 1, .. })
    ));
    assert!(matches!(
        DataParallelConfig::new()
            .with_output_index(2)
            .init(mlp(), devices::<B>(2)),
        Err(DataParallelError::OutputDeviceIndex { index: 2, len: 2 })
    ));
}

fn input_errors<B: DataParallelBackend>() {
    let dp = model::<B>(3);
    let device = Default::default();
    let forward = |m: &Mlp<B>, x: Tensor<B, 2>| m.forward(x);

    // `empty`, not `zeros`: on CUDA, Burn 0.21 fills a zero-element tensor with a kernel
    // launched on an empty grid, which CUDA refuses (`CUDA_ERROR_INVALID_VALUE`); CubeCL 0.10
    // keeps that error on the thread's stream slot (stream id modulo 128), and a later
    // thread landing on the same slot fails its next read with it (benches/RESULTS.md,
    // 2026-12-02).
    let empty = Tensor::<B, 2>::empty([0, 8], &device);
    assert!(matches!(
        dp.try_forward(empty.clone()),
        Err(DataParallelError::EmptyBatch { dim: 0 })
    ));
    // The infallible forms panic with the error's message.
    let message =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dp.forward(empty.clone())))
            .expect_err("an empty batch panics")
            .downcast::<String>()
            .expect("a formatted message");
    assert_eq!(*message, "the input batch is empty along dim 0");
    let message = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dp.forward_with(empty.clone(), |m, x| m.forward(x))
    }))
    .expect_err("an empty batch panics")
    .downcast::<String>()
    .expect("a formatted message");
    assert_eq!(*message, "the input batch is empty along dim 0");
    assert!(matches!(
        attempt(&dp, empty, forward),
        Err(DataParallelError::EmptyBatch { dim: 0 })
    ));
    assert!(matches!(
        attempt(&dp, Shared(3), |_, _| ()),
        Err(DataParallelError::NothingToScatter { dim: 0 })
    ));
    let mismatched = (
        random::<B, 2>([4, 8], &device),
        random::<B, 2>([5, 8], &device),
    );
    assert!(matches!(
        attempt(&dp, mismatched, |m, (x, _)| m.forward(x)),
        Err(DataParallelError::BatchSizeMismatch {
            dim: 0,
            expected: 4,
            found: 5
        })
    ));
    let wide = DataParallelConfig::new()
        .with_dim(2)
        .init(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(2))
        .unwrap();
    assert!(matches!(
        attempt(&wide, random::<B, 2>([4, 8], &device), forward),
        Err(DataParallelError::DimOutOfRange { dim: 2, rank: 2 })
    ));
}

fn output_errors<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = model::<B>(3);
    let input = || random::<B, 2>([7, 8], &device);

    // Shards are [3, 2, 2]: a square output per shard differs outside dim 0.
    let square = attempt(&dp, input(), |_, x| {
        let n = x.dims()[0];
        Tensor::<B, 2>::zeros([n, n], &x.device())
    });
    assert!(matches!(
        square,
        Err(DataParallelError::OutputShapeMismatch { replica: 1, expected, found, dim: Some(0) })
            if expected == vec![3, 3] && found == vec![2, 2]
    ));
    let means = attempt(&dp, input(), |_, x| Mean(x.sum_dim(0)));
    assert!(matches!(means, Ok(Mean(t)) if t.dims() == [1, 8]));
    let means = attempt(&dp, input(), |_, x| {
        let n = x.dims()[0];
        Mean(x.sum_dim(0).repeat_dim(0, n))
    });
    assert!(matches!(
        means,
        Err(DataParallelError::OutputShapeMismatch {
            replica: 1,
            dim: None,
            ..
        })
    ));
    let optional = attempt(&dp, input(), |_, x| (x.dims()[0] == 3).then_some(x));
    assert!(matches!(
        optional,
        Err(DataParallelError::OutputStructureMismatch { replica: 1, .. })
    ));
    let lists = attempt(&dp, input(), |_, x| {
        let n = 1 + (x.dims()[0] == 3) as usize;
        vec![x; n]
    });
    assert!(matches!(
        lists,
        Err(DataParallelError::OutputStructureMismatch { replica: 1, .. })
    ));
    let by_columns = DataParallelConfig::new()
        .with_dim(1)
        .init(Mlp::<B>::new(8, 16, 4, &device), devices::<B>(2))
        .unwrap();
    let rank_one = attempt(&by_columns, input(), |_, x| {
        x.sum_dim(1).squeeze_dim::<1>(1)
    });
    assert!(matches!(
        rank_one,
        Err(DataParallelError::DimOutOfRange { dim: 1, rank: 1 })
    ));
}

#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused")
    }
}

impl std::error::Error for Refused {}

/// A panicking or failing replica is reported by index and device; the next forward works.
fn replica_failures_are_errors<B: DataParallelBackend>() {
    let device = Default::default();
    let dp = model::<B>(3);
    let input = || random::<B, 2>([7, 8], &device);

    // Shards are [3, 2, 2]: replicas 1 and 2 panic, the first of them is reported.
    let panicked = attempt(&dp, input(), |m, x| {
        assert!(x.dims()[0] == 3, "shard of {} items", x.dims()[0]);
        m.forward(x)
    });
    match panicked {
        Err(DataParallelError::ReplicaPanicked {
            replica,
            device,
            message,
        }) => {
            assert_eq!(replica, 1);
            assert_eq!(device, format!("{:?}", dp.replica_devices()[1]));
            assert_eq!(message, "shard of 2 items");
        }
        other => panic!("expected a panic error, got {other:?}"),
    }

    let failed = dp.try_forward_fallible(input(), |m, x| match x.dims()[0] {
        3 => Ok(m.forward(x)),
        _ => Err(Refused),
    });
    match failed {
        Err(error @ DataParallelError::ReplicaFailed { replica: 1, .. }) => {
            assert!(error.to_string().ends_with("failed: refused"), "{error}");
            let source = std::error::Error::source(&error).expect("source");
            assert_eq!(source.to_string(), "refused");
        }
        other => panic!("expected a failure error, got {other:?}"),
    }

    // A single shard runs on the calling thread and is caught the same way.
    let single = attempt(
        &dp,
        random::<B, 2>([1, 8], &device),
        |_, _| -> Tensor<B, 2> { panic!("alone") },
    );
    assert!(matches!(
        single,
        Err(DataParallelError::ReplicaPanicked { replica: 0, .. })
    ));

    let output = attempt(&dp, input(), |m, x| m.forward(x)).unwrap();
    assert_eq!(output.dims(), [7, 4]);
}

backend_tests! {
    configuration => configuration_errors(), moves_nothing = "refused before a forward";
    inputs => input_errors(), moves_nothing = "inputs refused before a transfer";
    outputs => output_errors();
    replica_failures => replica_failures_are_errors();
}

/// An operation whose backward panics for shards of two rows: replica 1's and 2's backward
/// fail (shards of 3, 2 and 2), replica 0's runs.
mod failing_backward {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorPrimitive};

    #[derive(Debug)]
    struct FailForTwoRows;

    impl<B: Backend> Backward<B, 1> for FailForTwoRows {
        type State = usize;

        fn backward(self, ops: Ops<usize, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            assert!(
                ops.state != 2,
                "a backward that fails on {} rows",
                ops.state
            );
            let grad = grads.consume::<B>(&ops.node);
            if let [Some(parent)] = ops.parents {
                grads.register::<B>(parent.id, grad);
            }
        }
    }

    /// The identity, with [`FailForTwoRows`] as its backward.
    pub fn identity<B: Backend>(x: Tensor<Autodiff<B>, 2>) -> Tensor<Autodiff<B>, 2> {
        let rows = x.dims()[0];
        let TensorPrimitive::Float(x) = x.into_primitive() else {
            unreachable!("float tensors")
        };
        let value = x.primitive.clone();
        let out = match FailForTwoRows
            .prepare::<NoCheckpointing>([x.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(rows, value),
            OpsKind::UnTracked(prep) => prep.finish(value),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

/// A backward that fails in some replicas panics in the caller's `backward` with a message
/// naming the first failing replica, after every replica's backward has ended; the next
/// step trains as the bare model does.
fn failing_replica_backward_then_a_normal_step<I>()
where
    I: burn_dataparallel::ConcatBackend,
    burn::backend::Autodiff<I>: DataParallelBackend,
{
    type B<I> = burn::backend::Autodiff<I>;
    if !I::concurrent_backward() {
        return; // the single backward runs on the calling thread: a plain panic there
    }
    let device = Default::default();
    let dp = model::<B<I>>(3);
    let bare = dp.module().clone();
    let output = dp.forward_with(random::<B<I>, 2>([7, 8], &device), |m, x| {
        failing_backward::identity(m.forward(x))
    });
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| output.sum().backward()));
    let message = match failed {
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default(),
        Ok(_) => panic!("the backward should have failed"),
    };
    assert!(message.contains("the backward of replica 1"), "{message}");
    assert!(message.contains("fails on 2 rows"), "{message}");
    let x = random::<B<I>, 2>([7, 8], &device);
    assert_matches_bare(&dp, &bare, x, |m, x| m.forward(x));
}

mod failing_backward_flex {
    #[test]
    fn failing_replica_backward() {
        crate::common::within("failing_replica_backward", || {
            super::failing_replica_backward_then_a_normal_step::<burn::backend::Flex>()
        });
    }
}

mod failing_backward_ndarray {
    #[test]
    fn failing_replica_backward() {
        crate::common::within("failing_replica_backward", || {
            super::failing_replica_backward_then_a_normal_step::<burn::backend::NdArray>()
        });
    }
}

#[cfg(feature = "cuda")]
mod failing_backward_cuda_cube {
    #[test]
    fn failing_replica_backward() {
        crate::common::within("failing_replica_backward", || {
            // The tolerance is the test thread's own: set on the thread that compares.
            crate::common::set_tolerance(crate::common::TF32_TOLERANCE);
            super::failing_replica_backward_then_a_normal_step::<
                burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
            >()
        });
    }
}
