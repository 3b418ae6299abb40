//! Helpers shared by burn-dataparallel's integration tests and benches: where replicas go
//! ([`spread`], [`wgpu_devices`]) and a Learner that shows nothing ([`Silent`],
//! [`quiet_training!`]).

mod silent;
mod spread;
mod wgpu_devices;

pub use silent::Silent;
pub use spread::spread;
pub use wgpu_devices::wgpu_devices;
