//! The examples' `--devices` argument: a comma-separated list, one entry per replica, counted
//! the way `nvidia-smi` and `vulkaninfo` count GPUs. `cpu` (the default is `cpu,cpu`: two
//! replicas sharing the CPU), `cuda:N` (`CubeBackend` on CUDA GPU N, feature `cuda`),
//! `vulkan:N` or `wgpu:N` (`CubeBackend` on wgpu's discrete GPU N, feature `wgpu`). A GPU
//! listed twice runs two replicas on it (the same results, no speed-up).

/// The devices of the command line, of one kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Devices {
    /// So many replicas on the CPU.
    Cpu(usize),
    /// CUDA GPUs by index.
    Cuda(Vec<usize>),
    /// wgpu discrete GPUs by index (Vulkan on Linux and Windows, Metal on macOS).
    Wgpu(Vec<usize>),
}

impl Devices {
    /// The `--devices` argument of this process's command line (`cpu,cpu` without one).
    pub fn from_args() -> Self {
        let args: Vec<String> = std::env::args().collect();
        let list = args
            .iter()
            .position(|a| a == "--devices")
            .map(|i| args.get(i + 1).expect("--devices takes a list").clone())
            .or_else(|| {
                (args.iter()).find_map(|a| a.strip_prefix("--devices=").map(str::to_string))
            })
            .unwrap_or_else(|| "cpu,cpu".to_string());
        Self::parse(&list).unwrap_or_else(|error| panic!("--devices {list}: {error}"))
    }

    /// `list` parsed, or why not.
    pub fn parse(list: &str) -> Result<Self, String> {
        let entries: Vec<(&str, Option<usize>)> = list
            .split(',')
            .map(|entry| match entry.trim().split_once(':') {
                Some((kind, index)) => index
                    .parse()
                    .map(|i| (kind, Some(i)))
                    .map_err(|_| format!("`{entry}`: the index is a number")),
                None => Ok((entry.trim(), None)),
            })
            .collect::<Result<_, _>>()?;
        let kind = entries[0].0;
        if entries.iter().any(|(k, _)| *k != kind) {
            return Err("one kind of device at a time".into());
        }
        let indices = || -> Result<Vec<usize>, String> {
            (entries.iter())
                .map(|(kind, index)| index.ok_or(format!("`{kind}` needs an index: `{kind}:0`")))
                .collect()
        };
        match kind {
            "cpu" => Ok(Devices::Cpu(entries.len())),
            "cuda" => Ok(Devices::Cuda(indices()?)),
            "vulkan" | "wgpu" => Ok(Devices::Wgpu(indices()?)),
            other => Err(format!(
                "unknown device kind `{other}` (cpu, cuda, vulkan, wgpu)"
            )),
        }
    }
}

/// Runs `$run::<Backend>(devices)` on the backend the command line's devices belong to:
/// `Autodiff<Flex>`, `Autodiff<CubeCuda>` or `Autodiff<CubeWgpu>`.
macro_rules! on_devices {
    ($run:ident) => {
        match crate::devices::Devices::from_args() {
            crate::devices::Devices::Cpu(n) => {
                $run::<burn::backend::Autodiff<burn::backend::Flex>>(vec![Default::default(); n])
            }
            #[cfg(feature = "cuda")]
            crate::devices::Devices::Cuda(indices) => {
                $run::<burn::backend::Autodiff<burn_dataparallel::CubeCuda>>(
                    (indices.into_iter())
                        .map(|index| burn_dataparallel::CudaDevice { index })
                        .collect(),
                )
            }
            #[cfg(feature = "wgpu")]
            crate::devices::Devices::Wgpu(indices) => {
                $run::<burn::backend::Autodiff<burn_dataparallel::CubeWgpu>>(
                    (indices.into_iter())
                        .map(burn_dataparallel::WgpuDevice::DiscreteGpu)
                        .collect(),
                )
            }
            #[allow(unreachable_patterns)]
            other => panic!(
                "{other:?} needs this crate's `cuda` or `wgpu` feature: \
                 cargo run --features cuda --example ... -- --devices cuda:0,cuda:1"
            ),
        }
    };
}
