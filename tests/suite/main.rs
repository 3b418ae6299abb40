//! The crate's behaviour against the bare model, each test run on every device list of
//! `common::on_every_device_list!`.

#[path = "../common/mod.rs"]
mod common;

mod batch_norm;
mod derive;
mod equivalence;
mod errors;
mod gather;
mod learner;
mod learner_usage;
mod models;
mod moves;
mod profile;
mod record;
mod scatter;
mod side_inputs;
mod training;
