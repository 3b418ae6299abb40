//! Declarative macros that give user structs [`Scatter`](crate::Scatter) and
//! [`Gather`](crate::Gather) implementations.

/// Implements [`Scatter`](crate::Scatter) for a struct by scattering each named field.
///
/// List every field: a missing one is a compile error. Fields may be tensors, any other
/// [`Scatter`](crate::Scatter) value, or nested structs that use this macro too.
///
/// # Example
///
/// ```
/// use burn::tensor::{Device, Int, Tensor};
/// use burn_dataparallel::{Scatter, Shards, impl_scatter};
///
/// #[derive(Debug, Clone)]
/// struct ImageBatch {
///     images: Tensor<4>,
///     targets: Tensor<1, Int>,
/// }
/// impl_scatter!(ImageBatch { images, targets });
///
/// let device = Device::flex();
/// let batch = ImageBatch {
///     images: Tensor::zeros([6, 3, 8, 8], &device),
///     targets: Tensor::zeros([6], &device),
/// };
/// let shards = Shards::new(6, &[device.clone(), device.clone(), device.clone()], None, 0, device);
/// let parts = batch.scatter(&shards);
/// assert_eq!(parts.len(), 3);
/// assert_eq!(parts[2].images.dims(), [2, 3, 8, 8]);
/// ```
///
/// A loss that is not a plain mean over rows states each part's weight with
/// `loss_weight = |part| ...` after the fields ([`Scatter::loss_weight`](crate::Scatter::loss_weight)):
///
/// ```
/// use burn::tensor::{Device, Tensor};
/// use burn_dataparallel::{Scatter, Shards, impl_scatter};
///
/// #[derive(Debug, Clone)]
/// struct Masked {
///     tokens: Tensor<2>,
///     mask: Tensor<2>,
/// }
/// // The loss is a mean over unmasked tokens: each part weighs as many.
/// impl_scatter!(Masked { tokens, mask }, loss_weight = |part| {
///     part.mask.clone().sum().into_scalar::<f64>()
/// });
///
/// let device = Device::flex();
/// let batch = Masked {
///     tokens: Tensor::zeros([4, 3], &device),
///     mask: Tensor::from_floats([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], &device),
/// };
/// let shards = Shards::new(4, &[device.clone(), device.clone()], None, 0, device);
/// let parts = batch.scatter(&shards);
/// assert_eq!(parts[0].loss_weight(), Some(4.0));
/// assert_eq!(parts[1].loss_weight(), Some(2.0));
/// ```
#[macro_export]
macro_rules! impl_scatter {
    ($name:ident { $($field:ident),+ $(,)? } $(, loss_weight = $weight:expr)? $(,)?) => {
        impl $crate::Scatter for $name {
            fn batch_size(
                &self,
                dim: usize,
            ) -> ::core::result::Result<::core::option::Option<usize>, $crate::DataParallelError> {
                let size = ::core::option::Option::None;
                $(
                    let size = $crate::merge_batch_size(
                        size,
                        $crate::Scatter::batch_size(&self.$field, dim)?,
                        dim,
                    )?;
                )+
                ::core::result::Result::Ok(size)
            }

            fn scatter(self, shards: &$crate::Shards) -> ::std::vec::Vec<Self> {
                $(
                    let mut $field = $crate::Scatter::scatter(self.$field, shards).into_iter();
                )+
                (0..shards.len())
                    .map(|_| Self {
                        $($field: $field.next().expect("one piece per shard"),)+
                    })
                    .collect()
            }

            fn carries_gradients(&self) -> bool {
                false $(|| $crate::Scatter::carries_gradients(&self.$field))+
            }

            $(
                fn loss_weight(&self) -> ::core::option::Option<f64> {
                    let weight: fn(&Self) -> f64 = $weight;
                    ::core::option::Option::Some(weight(self))
                }
            )?
        }
    };
}

/// Implements [`Gather`](crate::Gather) for a struct by gathering each named field.
///
/// List every field: a missing one is a compile error.
///
/// # Example
///
/// ```
/// use burn::tensor::{Device, Tensor};
/// use burn_dataparallel::{Gather, Mean, Shards, impl_gather};
///
/// #[derive(Debug)]
/// struct Output {
///     logits: Tensor<2>,
///     loss: Mean<Tensor<1>>,
/// }
/// impl_gather!(Output { logits, loss });
///
/// let device = Device::flex();
/// let shards = Shards::new(3, &[device.clone(), device.clone()], None, 0, device.clone());
/// let part = |rows: usize, loss: f32| Output {
///     logits: Tensor::zeros([rows, 4], &device),
///     loss: Mean(Tensor::from_floats([loss], &device)),
/// };
/// let output = Output::gather(vec![part(2, 1.0), part(1, 4.0)], &shards).unwrap();
/// assert_eq!(output.logits.dims(), [3, 4]);
/// assert_eq!(output.loss.0.into_scalar::<f32>(), 2.0);
/// ```
#[macro_export]
macro_rules! impl_gather {
    ($name:ident { $($field:ident),+ $(,)? }) => {
        impl $crate::Gather for $name {
            fn gather(
                outputs: ::std::vec::Vec<Self>,
                shards: &$crate::Shards,
            ) -> ::core::result::Result<Self, $crate::DataParallelError> {
                $(let mut $field = ::std::vec::Vec::with_capacity(outputs.len());)+
                for output in outputs {
                    $($field.push(output.$field);)+
                }
                ::core::result::Result::Ok(Self {
                    $($field: $crate::Gather::gather($field, shards)?,)+
                })
            }
        }
    };
}
