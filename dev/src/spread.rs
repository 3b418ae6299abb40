//! Spreading replicas or threads over a backend's devices.

use burn::tensor::backend::{Backend, Device, DeviceId};

/// `n` devices of the backend's default kind: entry `i` is the device `i` places after the
/// default one, modulo the backend's device count (all on the default device when there is
/// one).
pub fn spread<B: Backend>(n: usize) -> Vec<B::Device> {
    let first = B::Device::default().to_id();
    let count = B::device_count(first.type_id).max(1);
    (0..n)
        .map(|i| {
            B::Device::from_id(DeviceId {
                type_id: first.type_id,
                index_id: ((first.index_id as usize + i) % count) as u16,
            })
        })
        .collect()
}
