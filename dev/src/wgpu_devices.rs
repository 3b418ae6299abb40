//! The wgpu devices that the distinct-device tests and the host-staged bench put replicas on.

use burn::backend::wgpu::WgpuDevice;

/// The devices named by `DATAPARALLEL_WGPU_DEVICES`, comma-separated, the output device
/// first: `default`, `cpu`, `discrete:N`, `integrated:N` or `virtual:N` (wgpu's
/// `WgpuDevice` variants). Unset: `default,cpu`, two Burn devices with a CubeCL server each
/// over one adapter (Mesa's lavapipe without a GPU). Two AMD GPUs on Vulkan:
/// `discrete:0,discrete:1`; one NVIDIA GPU as two devices: `default,discrete:0`.
///
/// # Panics
///
/// On an entry that names no wgpu device, or on fewer than two entries.
pub fn wgpu_devices() -> Vec<WgpuDevice> {
    let list = std::env::var("DATAPARALLEL_WGPU_DEVICES").unwrap_or_else(|_| "default,cpu".into());
    let devices: Vec<WgpuDevice> = list.split(',').map(|entry| parse(entry.trim())).collect();
    assert!(
        devices.len() >= 2,
        "DATAPARALLEL_WGPU_DEVICES={list:?}: name at least two devices"
    );
    devices
}

fn parse(entry: &str) -> WgpuDevice {
    let (kind, index) = match entry.split_once(':') {
        Some((kind, index)) => (kind, index.parse::<usize>().ok()),
        None => (entry, None),
    };
    match (kind, index) {
        ("default", None) => WgpuDevice::DefaultDevice,
        ("cpu", None) => WgpuDevice::Cpu,
        ("discrete", Some(i)) => WgpuDevice::DiscreteGpu(i),
        ("integrated", Some(i)) => WgpuDevice::IntegratedGpu(i),
        ("virtual", Some(i)) => WgpuDevice::VirtualGpu(i),
        _ => panic!(
            "DATAPARALLEL_WGPU_DEVICES: {entry:?} is not one of default, cpu, discrete:N, \
             integrated:N, virtual:N"
        ),
    }
}
