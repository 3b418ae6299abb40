//! Errors returned by [`DataParallel`](crate::DataParallel).

use std::error::Error;

use thiserror::Error;

/// Boxed error returned by a replica's fallible forward.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// What went wrong while configuring or running a [`DataParallel`](crate::DataParallel).
///
/// New variants may be added in minor releases.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DataParallelError {
    /// The device list is empty.
    #[error("DataParallel needs at least one device, none was given")]
    NoDevices,

    /// A listed device does not exist on this machine (a CUDA GPU index past the GPUs).
    #[error(
        "device {device} does not exist on this machine; its devices of that kind are {available}"
    )]
    UnknownDevice {
        /// The device asked for.
        device: String,
        /// The devices of that kind this machine has.
        available: String,
    },

    /// The number of shard weights differs from the number of devices.
    #[error("{found} shard weights were given for {expected} devices")]
    ShardWeightsLength {
        /// Number of devices.
        expected: usize,
        /// Number of weights given.
        found: usize,
    },

    /// A shard weight is zero, negative, infinite or NaN.
    #[error("shard weight {index} is {weight}: weights must be positive and finite")]
    InvalidShardWeight {
        /// Position of the weight in the list.
        index: usize,
        /// The weight given.
        weight: f64,
    },

    /// The adaptive split's settings are out of range
    /// ([`AdaptiveShardsConfig`](crate::AdaptiveShardsConfig)).
    #[error(
        "adaptive shards need a damping in (0, 1] and a finite tolerance of at least 0, not \
         damping {damping} and tolerance {tolerance}"
    )]
    InvalidAdaptiveShards {
        /// The damping given.
        damping: f64,
        /// The tolerance given.
        tolerance: f64,
    },

    /// A scattered part's loss weight ([`Scatter::loss_weight`](crate::Scatter::loss_weight))
    /// is negative, infinite or NaN, or is missing while other parts state theirs.
    #[error(
        "shard {shard}'s loss weight is {}: loss weights must be finite and non-negative, and \
         stated by every part of the input or by none",
        .weight.map_or("not stated".to_string(), |w| w.to_string())
    )]
    InvalidLossWeight {
        /// The shard whose part stated it.
        shard: usize,
        /// The weight stated, `None` when that part stated none.
        weight: Option<f64>,
    },

    /// Every scattered part's loss weight is zero: the batch's mean loss is 0 / 0.
    #[error("every shard's loss weight is zero: the batch's mean loss would be 0 / 0")]
    ZeroLossWeights,

    /// A device stopped answering during a step (a remote server that went away): moving
    /// tensors to or from it failed. The wrapped module is intact on the output device, so
    /// the wrapper carries on without that device:
    /// [`without_device`](crate::DataParallel::without_device).
    #[error(
        "device {device} (replica {replica}) stopped answering during the step: {reason} \
         ({message}); the module is intact: go on without it (`DataParallel::without_device`)"
    )]
    DeviceFailed {
        /// The first entry of the device list on that device.
        replica: usize,
        /// The device.
        device: String,
        /// What the device answered when asked to finish its work.
        reason: String,
        /// The failure seen during the step.
        message: String,
    },

    /// [`without_device`](crate::DataParallel::without_device) was asked to remove the
    /// output device, which holds the module and gathers the outputs.
    #[error(
        "device {device} is the output device, which holds the module: choose another output \
         device first (`with_output_device`), or wrap the module again"
    )]
    OutputDeviceRemoved {
        /// The device asked to be removed.
        device: String,
    },

    /// The output device is not one of the devices.
    #[error("output device {device} is not one of the devices {devices}")]
    OutputDeviceNotListed {
        /// The output device asked for.
        device: String,
        /// The device list.
        devices: String,
    },

    /// The output device index is past the end of the device list.
    #[error("output device index {index} is out of range for {len} devices")]
    OutputDeviceIndex {
        /// The index asked for.
        index: usize,
        /// Number of devices.
        len: usize,
    },

    /// [`forward_with_captures`](crate::DataParallel::forward_with_captures) would run
    /// replicas on devices other than the output device, where what its closure captures does
    /// not live.
    #[error(
        "forward_with_captures would run replicas on {devices}, but what its closure captures \
         stays on its own device; pass tensors in the input (`Broadcast` for a whole tensor) \
         and train a second module inside the wrapped one (a tuple of modules is a module), \
         then call `forward_with`"
    )]
    CapturesAcrossDevices {
        /// The devices the shards would go to.
        devices: String,
    },

    /// The input holds no tensor, so there is nothing to split.
    #[error("the input holds no tensor to split along dim {dim}")]
    NothingToScatter {
        /// The batch dimension.
        dim: usize,
    },

    /// The input batch has no items.
    #[error("the input batch is empty along dim {dim}")]
    EmptyBatch {
        /// The batch dimension.
        dim: usize,
    },

    /// Two tensors of one input have different sizes along the batch dimension.
    #[error(
        "tensors of one input disagree on the batch size along dim {dim}: {expected} and {found}"
    )]
    BatchSizeMismatch {
        /// The batch dimension.
        dim: usize,
        /// Batch size of the first tensor found.
        expected: usize,
        /// Batch size of a later tensor.
        found: usize,
    },

    /// A tensor has no dimension `dim`.
    #[error("dim {dim} is out of range for a tensor of rank {rank}")]
    DimOutOfRange {
        /// The batch dimension.
        dim: usize,
        /// Rank of the tensor.
        rank: usize,
    },

    /// A replica's forward panicked.
    #[error("replica {replica} on device {device} panicked: {message}")]
    ReplicaPanicked {
        /// Position of the replica's entry in the device list.
        replica: usize,
        /// The replica's device.
        device: String,
        /// The panic message.
        message: String,
    },

    /// A replica's forward returned an error.
    #[error("replica {replica} on device {device} failed: {source}")]
    ReplicaFailed {
        /// Position of the replica's entry in the device list.
        replica: usize,
        /// The replica's device.
        device: String,
        /// The error the replica returned.
        #[source]
        source: BoxError,
    },

    /// Replica outputs disagree on a dimension other than the gather dimension.
    #[error("output of replica {replica} has shape {found:?} where replica 0 gave {expected:?}")]
    OutputShapeMismatch {
        /// Which output (position among the replicas that ran).
        replica: usize,
        /// Shape of the first replica's output.
        expected: Vec<usize>,
        /// Shape of this replica's output.
        found: Vec<usize>,
        /// The gather dimension, along which shapes may differ; `None` for a reduction.
        dim: Option<usize>,
    },

    /// Replica outputs disagree in structure (a `Vec` length, `Some` against `None`).
    #[error("output of replica {replica} has {found} where replica 0 gave {expected}")]
    OutputStructureMismatch {
        /// Which output (position among the replicas that ran).
        replica: usize,
        /// What the first replica gave.
        expected: String,
        /// What this replica gave.
        found: String,
    },

    /// Replicas returned maps with different keys.
    #[error(
        "output of replica {replica} has other keys than replica 0's: missing {missing:?}, \
         in addition {unexpected:?}"
    )]
    OutputKeysMismatch {
        /// Which output (position among the replicas that ran).
        replica: usize,
        /// Keys of replica 0's map that this replica's lacks.
        missing: Vec<String>,
        /// Keys of this replica's map that replica 0's lacks.
        unexpected: Vec<String>,
    },

    /// The worker threads could not be started.
    #[error("the replica worker threads could not be started: {message}")]
    WorkerSpawn {
        /// The operating system's reason.
        message: String,
    },
}

impl DataParallelError {
    /// A [`ReplicaPanicked`](Self::ReplicaPanicked) error from a caught panic payload.
    pub(crate) fn replica_panicked(
        replica: usize,
        device: String,
        payload: Box<dyn std::any::Any + Send>,
    ) -> Self {
        Self::ReplicaPanicked {
            replica,
            device,
            message: panic_message(payload.as_ref()),
        }
    }
}

/// The message of a caught panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(panic payload is not a string)".to_string()
    }
}
