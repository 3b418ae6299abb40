//! [`DeviceList`]: a device list written as text, for command lines and settings files.

use std::str::FromStr;

use burn::tensor::Device;
use thiserror::Error;

use crate::error::DataParallelError;

/// A list of devices parsed from text: comma-separated entries, one per replica.
///
/// | entry | device | needs the crate feature |
/// |---|---|---|
/// | `cpu` or `flex` | Burn's Flex CPU backend (`Device::flex()`) | `flex` |
/// | `ndarray` | Burn's NdArray CPU backend | `ndarray` |
/// | `cuda:N` | CUDA GPU `N`, numbered as `nvidia-smi` does (`Device::cuda(N)`) | `cuda` |
/// | `wgpu:N` or `vulkan:N` | wgpu's discrete GPU `N` | `wgpu` |
/// | `wgpu:default`, `wgpu:cpu` | wgpu's default device, its CPU device (lavapipe) | `wgpu` |
/// | `ws://HOST:PORT` | device 0 of the Burn remote server at that address (WebSocket) | `remote` |
/// | `ws://HOST:PORT/N` | device `N` of that server | `remote` |
///
/// Kinds may be mixed (`cuda:0,cpu`); an entry listed twice runs two replicas on it. A remote
/// entry connects to its server while the list is parsed (Burn opens a remote device's
/// session when it is made), so a server that cannot be reached is an error here.
/// [`autodiff`](Self::autodiff) turns gradients on for every device.
///
/// # Example
///
/// ```
/// use burn::tensor::Device;
/// use burn_dataparallel::{DeviceList, ParseDeviceError};
///
/// let devices: DeviceList = "cpu,cpu".parse().unwrap();
/// assert_eq!(devices.len(), 2);
/// assert_eq!(devices[0], Device::flex());
/// assert!(matches!("cdua:0".parse::<DeviceList>(), Err(ParseDeviceError::UnknownKind { .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceList(Vec<Device>);

/// Why a [`DeviceList`] could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ParseDeviceError {
    /// The list has no entry.
    #[error("the device list is empty; write entries such as `cuda:0,cuda:1` or `cpu`")]
    Empty,
    /// An entry names no kind of device this crate knows.
    #[error(
        "unknown device `{entry}`: write `cpu`, `flex`, `ndarray`, `cuda:N`, `wgpu:N`, `vulkan:N`, `wgpu:default`, `wgpu:cpu` or `ws://HOST:PORT`"
    )]
    UnknownKind {
        /// The entry as written.
        entry: String,
    },
    /// An entry's index is missing or not a number.
    #[error("`{entry}`: a GPU needs a number after the colon, as in `{kind}:0`")]
    BadIndex {
        /// The entry as written.
        entry: String,
        /// The kind of device it names.
        kind: String,
    },
    /// A remote server could not be reached, or refused the session.
    #[error("`{entry}`: cannot connect to the remote server: {reason}")]
    Unreachable {
        /// The entry as written.
        entry: String,
        /// What the connection attempt reported.
        reason: String,
    },
    /// The entry's backend is not compiled in.
    #[error("`{entry}` needs this crate's `{feature}` feature (and Burn's backend with it)")]
    NotEnabled {
        /// The entry as written.
        entry: String,
        /// The feature to enable.
        feature: &'static str,
    },
}

impl DeviceList {
    /// The devices, with autodiff turned on (training).
    pub fn autodiff(self) -> Self {
        Self(self.0.into_iter().map(Device::autodiff).collect())
    }

    /// The devices, one per replica.
    pub fn into_vec(self) -> Vec<Device> {
        self.0
    }
}

impl core::ops::Deref for DeviceList {
    type Target = [Device];

    fn deref(&self) -> &[Device] {
        &self.0
    }
}

impl From<DeviceList> for Vec<Device> {
    fn from(list: DeviceList) -> Self {
        list.0
    }
}

impl FromStr for DeviceList {
    type Err = ParseDeviceError;

    fn from_str(list: &str) -> Result<Self, Self::Err> {
        if list.trim().is_empty() {
            return Err(ParseDeviceError::Empty);
        }
        list.split(',')
            .map(|entry| parse_entry(entry.trim()))
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

/// One entry of a device list.
fn parse_entry(entry: &str) -> Result<Device, ParseDeviceError> {
    if entry.len() > 5 && entry[..5].eq_ignore_ascii_case("ws://") {
        return remote(entry);
    }
    let (kind, index) = match entry.split_once(':') {
        Some((kind, index)) => (kind.trim().to_ascii_lowercase(), Some(index.trim())),
        None => (entry.to_ascii_lowercase(), None),
    };
    let gpu = |index: Option<&str>| {
        index
            .and_then(|i| i.parse::<usize>().ok())
            .ok_or_else(|| ParseDeviceError::BadIndex {
                entry: entry.to_string(),
                kind: kind.clone(),
            })
    };
    let not_enabled = |feature| ParseDeviceError::NotEnabled {
        entry: entry.to_string(),
        feature,
    };
    match (kind.as_str(), index) {
        ("cpu" | "flex", None) => flex().ok_or_else(|| not_enabled("flex")),
        ("ndarray", None) => ndarray().ok_or_else(|| not_enabled("ndarray")),
        ("cuda", index) => {
            let index = gpu(index)?;
            cuda(index).ok_or_else(|| not_enabled("cuda"))
        }
        ("wgpu" | "vulkan", Some("default")) => wgpu(None).ok_or_else(|| not_enabled("wgpu")),
        ("wgpu" | "vulkan", Some("cpu")) => wgpu(Some(None)).ok_or_else(|| not_enabled("wgpu")),
        ("wgpu" | "vulkan", index) => {
            let index = gpu(index)?;
            wgpu(Some(Some(index))).ok_or_else(|| not_enabled("wgpu"))
        }
        _ => Err(ParseDeviceError::UnknownKind {
            entry: entry.to_string(),
        }),
    }
}

/// Checks that every one of `devices` exists on this machine: a CUDA GPU past the ones CUDA
/// counts is refused before anything runs on it (with the `cuda` feature; other kinds are
/// not looked up).
///
/// # Errors
///
/// [`DataParallelError::UnknownDevice`] for the first device that does not exist.
pub(crate) fn check_present(devices: &[Device]) -> Result<(), DataParallelError> {
    #[cfg(feature = "cuda")]
    {
        use burn::backend::{CubeDevice, DispatchDevice};
        use burn::tensor::DeviceType;
        let is_cuda = |device: &Device| {
            let plain = device.clone().inner();
            matches!(
                plain.as_dispatch(),
                DispatchDevice::Cube(CubeDevice::Cuda(_))
            )
        };
        if devices.iter().any(is_cuda) {
            let present = Device::enumerate(DeviceType::Cuda).into_vec();
            if let Some(device) = devices.iter().find(|d| is_cuda(d) && !present.contains(d)) {
                return Err(DataParallelError::UnknownDevice {
                    device: format!("{device:?}"),
                    available: format!("{present:?}"),
                });
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = devices;
    Ok(())
}

/// Whether `device` is one of Burn's CPU backends (Flex, NdArray), which run each operation
/// as it is recorded: replicas sharing it can record at once, with no stream to share
/// (`parallel_apply.rs`). Other devices, and these without this crate's feature for them,
/// answer `false`.
pub(crate) fn runs_as_recorded(device: &Device) -> bool {
    #[cfg(any(feature = "flex", feature = "ndarray"))]
    {
        use burn::backend::DispatchDevice;
        let plain = device.clone().inner();
        #[cfg(feature = "flex")]
        if matches!(plain.as_dispatch(), DispatchDevice::Flex(_)) {
            return true;
        }
        #[cfg(feature = "ndarray")]
        if matches!(plain.as_dispatch(), DispatchDevice::NdArray(_)) {
            return true;
        }
    }
    #[cfg(not(any(feature = "flex", feature = "ndarray")))]
    let _ = device;
    false
}

fn flex() -> Option<Device> {
    #[cfg(feature = "flex")]
    return Some(Device::flex());
    #[cfg(not(feature = "flex"))]
    None
}

#[allow(deprecated)] // NdArray is deprecated in Burn 0.22, and still a backend users run.
fn ndarray() -> Option<Device> {
    #[cfg(feature = "ndarray")]
    return Some(Device::ndarray());
    #[cfg(not(feature = "ndarray"))]
    None
}

#[allow(unused_variables)]
fn cuda(index: usize) -> Option<Device> {
    #[cfg(feature = "cuda")]
    return Some(Device::cuda(index));
    #[cfg(not(feature = "cuda"))]
    None
}

/// Device `N` of the WebSocket server of `ws://HOST:PORT/N` (device 0 without `/N`).
#[cfg(feature = "remote")]
fn remote(entry: &str) -> Result<Device, ParseDeviceError> {
    use burn::tensor::remote::RemoteHost;
    let address = &entry[5..];
    let (address, index) = match address.split_once('/') {
        Some((address, index)) => {
            let index = index
                .parse::<usize>()
                .map_err(|_| ParseDeviceError::BadIndex {
                    entry: entry.to_string(),
                    kind: format!("ws://{address}/"),
                })?;
            (address, index)
        }
        None => (address, 0),
    };
    let host = RemoteHost::websocket(&format!("ws://{address}"));
    Device::remote_options(&host)
        .device_index(index)
        .init()
        .map_err(|error| ParseDeviceError::Unreachable {
            entry: entry.to_string(),
            reason: error.to_string(),
        })
}

#[cfg(not(feature = "remote"))]
fn remote(entry: &str) -> Result<Device, ParseDeviceError> {
    Err(ParseDeviceError::NotEnabled {
        entry: entry.to_string(),
        feature: "remote",
    })
}

/// A wgpu device: the default one (`None`), the CPU one (`Some(None)`) or a discrete GPU.
#[allow(unused_variables)]
fn wgpu(which: Option<Option<usize>>) -> Option<Device> {
    #[cfg(feature = "wgpu")]
    {
        use burn::tensor::DeviceKind;
        let kind = match which {
            None => DeviceKind::DefaultDevice,
            Some(None) => DeviceKind::Cpu,
            Some(Some(index)) => DeviceKind::DiscreteGpu(index),
        };
        Some(Device::wgpu(kind))
    }
    #[cfg(not(feature = "wgpu"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_are_refused_with_what_to_write() {
        let parse = |text: &str| text.parse::<DeviceList>();
        assert_eq!(parse(""), Err(ParseDeviceError::Empty));
        assert!(
            matches!(parse("cdua:0"), Err(ParseDeviceError::UnknownKind { entry }) if entry == "cdua:0")
        );
        assert!(matches!(
            parse("cuda:x"),
            Err(ParseDeviceError::BadIndex { .. })
        ));
        assert!(matches!(
            parse("cuda"),
            Err(ParseDeviceError::BadIndex { .. }) | Err(ParseDeviceError::NotEnabled { .. })
        ));
        assert!(matches!(
            parse("cpu:1"),
            Err(ParseDeviceError::UnknownKind { .. })
        ));
        let message = parse("cdua:0").unwrap_err().to_string();
        assert!(message.contains("cuda:N"), "{message}");
    }

    #[cfg(not(feature = "remote"))]
    #[test]
    fn remote_entries_need_the_feature() {
        assert!(matches!(
            "cpu,ws://10.0.0.2:3000".parse::<DeviceList>(),
            Err(ParseDeviceError::NotEnabled {
                feature: "remote",
                ..
            })
        ));
    }

    #[cfg(feature = "remote")]
    #[test]
    fn a_remote_device_index_is_a_number() {
        assert!(matches!(
            "ws://10.0.0.2:3000/one".parse::<DeviceList>(),
            Err(ParseDeviceError::BadIndex { .. })
        ));
    }

    #[cfg(feature = "flex")]
    #[test]
    fn entries_become_devices() {
        let devices: DeviceList = " cpu, flex ".parse().unwrap();
        assert_eq!(devices.into_vec(), vec![Device::flex(); 2]);
        let devices: DeviceList = "cpu".parse::<DeviceList>().unwrap().autodiff();
        assert!(devices[0].is_autodiff());
    }

    #[cfg(feature = "flex")]
    #[test]
    fn flex_runs_operations_as_recorded() {
        assert!(runs_as_recorded(&Device::flex()));
        assert!(runs_as_recorded(&Device::flex().autodiff()));
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn a_cubecl_device_does_not() {
        assert!(!runs_as_recorded(&wgpu(Some(None)).unwrap()));
    }
}
