//! The CubeCL kernels behind [`ConcatBackend`](crate::backend::ConcatBackend) on CubeCL
//! backends: one file per kernel, each with the host code that sizes and launches it.
//!
//! Nothing here knows about the pipeline: the kernels take and return `CubeTensor`s.

mod concat;
mod split;

pub(crate) use concat::concat;
pub(crate) use split::split;
