//! Tests written once, generic over the backend, run on the CPU backend and, with the `cuda`
//! feature, on CUDA with and without fusion (`backend_tests!` in `common`).
//!
//! One test binary for all of them, so that a CUDA build ships as one executable.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

#[cfg(all(feature = "flex", feature = "train"))]
mod adaptive;
mod batch_norm;
mod captured;
mod chain;
mod equivalence;
mod errors;
#[cfg(feature = "cuda")]
mod faults;
mod graphs;
#[cfg(feature = "flex")]
mod hangs;
#[cfg(feature = "train")]
mod learner;
#[cfg(feature = "train")]
mod learner_steps;
#[cfg(feature = "train")]
mod learner_usage;
#[cfg(feature = "train")]
mod loss_weights;
mod overlap;
mod races;
mod side_inputs;
mod training;
