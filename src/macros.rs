//! Declarative macros that give user structs [`Scatter`](crate::Scatter) and
//! [`Gather`](crate::Gather) implementations.

/// Implements [`Scatter`](crate::Scatter) for a struct by scattering each named field.
///
/// List every field: a missing one is a compile error. Fields may be tensors, any other
/// [`Scatter`](crate::Scatter) value, or nested structs that use this macro too. Two forms are
/// accepted: `Name<B> { fields }` for a struct generic over the backend only, and
/// `Name { fields }` for a struct without generics. For other generics, implement the trait by
/// hand the same way.
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::{Int, Tensor, backend::Backend};
/// use burn_dataparallel::{Scatter, Shards, impl_scatter};
///
/// #[derive(Debug, Clone)]
/// struct ImageBatch<B: Backend> {
///     images: Tensor<B, 4>,
///     targets: Tensor<B, 1, Int>,
/// }
/// impl_scatter!(ImageBatch<B> { images, targets });
///
/// let device = Default::default();
/// let batch = ImageBatch::<Flex> {
///     images: Tensor::zeros([6, 3, 8, 8], &device),
///     targets: Tensor::zeros([6], &device),
/// };
/// let shards = Shards::<Flex>::new(6, &[device; 3], None, 0, device);
/// let parts = batch.scatter(&shards);
/// assert_eq!(parts.len(), 3);
/// assert_eq!(parts[2].images.dims(), [2, 3, 8, 8]);
/// ```
///
/// A loss that is not a plain mean over rows states each part's weight with
/// `loss_weight = |part| ...` after the fields ([`Scatter::loss_weight`](crate::Scatter::loss_weight)):
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::{ElementConversion, Int, Tensor, backend::Backend};
/// use burn_dataparallel::{Scatter, Shards, impl_scatter};
///
/// /// Tokens, with 1.0 where a token counts in the loss.
/// #[derive(Debug, Clone)]
/// struct Tokens<B: Backend> {
///     ids: Tensor<B, 2, Int>,
///     mask: Tensor<B, 2>,
/// }
/// // The loss is a mean over unmasked tokens: each part weighs its unmasked count.
/// impl_scatter!(Tokens<B> { ids, mask }, loss_weight = |part| {
///     part.mask.clone().sum().into_scalar().elem::<f64>()
/// });
///
/// let device = Default::default();
/// let mask = Tensor::<Flex, 2>::from_floats([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], &device);
/// let batch = Tokens::<Flex> { ids: Tensor::zeros([3, 2], &device), mask };
/// let shards = Shards::<Flex>::new(3, &[device; 2], None, 0, device);
/// let parts = batch.scatter(&shards);
/// assert_eq!(parts[0].loss_weight(), Some(3.0));
/// assert_eq!(parts[1].loss_weight(), Some(0.0));
/// ```
#[macro_export]
macro_rules! impl_scatter {
    ($name:ident < $backend:ident > { $($field:ident),+ $(,)? }
        $(, loss_weight = $weight:expr)? $(,)?) => {
        impl<$backend: $crate::ConcatBackend> $crate::Scatter<$backend> for $name<$backend> {
            $crate::impl_scatter!(@body $backend; $($field),+);
            $($crate::impl_scatter!(@weight $weight);)?
        }
    };
    ($name:ident { $($field:ident),+ $(,)? } $(, loss_weight = $weight:expr)? $(,)?) => {
        impl<B: $crate::ConcatBackend> $crate::Scatter<B> for $name {
            $crate::impl_scatter!(@body B; $($field),+);
            $($crate::impl_scatter!(@weight $weight);)?
        }
    };
    (@weight $weight:expr) => {
        fn loss_weight(&self) -> ::core::option::Option<f64> {
            let weight: fn(&Self) -> f64 = $weight;
            ::core::option::Option::Some(weight(self))
        }
    };
    (@body $backend:ident; $($field:ident),+) => {
        fn batch_size(
            &self,
            dim: usize,
        ) -> ::core::result::Result<::core::option::Option<usize>, $crate::DataParallelError> {
            let size = ::core::option::Option::None;
            $(
                let size = $crate::merge_batch_size(
                    size,
                    $crate::Scatter::<$backend>::batch_size(&self.$field, dim)?,
                    dim,
                )?;
            )+
            ::core::result::Result::Ok(size)
        }

        fn scatter(self, shards: &$crate::Shards<$backend>) -> ::std::vec::Vec<Self> {
            $(
                let mut $field = $crate::Scatter::<$backend>::scatter(self.$field, shards).into_iter();
            )+
            (0..shards.len())
                .map(|_| Self {
                    $($field: $field.next().expect("one piece per shard"),)+
                })
                .collect()
        }

        fn scatters_every_tensor(&self) -> bool {
            true $(&& $crate::Scatter::<$backend>::scatters_every_tensor(&self.$field))+
        }
    };
}

/// Implements [`Gather`](crate::Gather) for a struct by gathering each named field.
///
/// List every field: a missing one is a compile error. Fields may be tensors (concatenated),
/// [`Mean`](crate::Mean) or [`Sum`](crate::Sum) reductions, any other
/// [`Gather`](crate::Gather) value, or nested structs that use this macro too. The two forms
/// are those of [`impl_scatter!`](crate::impl_scatter).
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::tensor::{Tensor, backend::Backend};
/// use burn_dataparallel::{Gather, Mean, Shards, impl_gather};
///
/// #[derive(Debug, Clone)]
/// struct StepOutput<B: Backend> {
///     loss: Mean<Tensor<B, 1>>,
///     logits: Tensor<B, 2>,
/// }
/// impl_gather!(StepOutput<B> { loss, logits });
///
/// let device = Default::default();
/// let shards = Shards::<Flex>::new(4, &[device; 2], None, 0, device);
/// let part = |loss: f32| StepOutput::<Flex> {
///     loss: Mean(Tensor::from_floats([loss], &device)),
///     logits: Tensor::zeros([2, 10], &device),
/// };
/// let output = StepOutput::gather(vec![part(1.0), part(3.0)], &shards).unwrap();
/// assert_eq!(output.logits.dims(), [4, 10]);
/// assert_eq!(output.loss.0.into_scalar(), 2.0);
/// ```
#[macro_export]
macro_rules! impl_gather {
    ($name:ident < $backend:ident > { $($field:ident),+ $(,)? }) => {
        impl<$backend: $crate::ConcatBackend> $crate::Gather<$backend> for $name<$backend> {
            $crate::impl_gather!(@body $backend; $($field),+);
        }
    };
    ($name:ident { $($field:ident),+ $(,)? }) => {
        impl<B: $crate::ConcatBackend> $crate::Gather<B> for $name {
            $crate::impl_gather!(@body B; $($field),+);
        }
    };
    (@body $backend:ident; $($field:ident),+) => {
        fn gather(
            outputs: ::std::vec::Vec<Self>,
            shards: &$crate::Shards<$backend>,
        ) -> ::core::result::Result<Self, $crate::DataParallelError> {
            $(let mut $field = ::std::vec::Vec::with_capacity(outputs.len());)+
            for output in outputs {
                $($field.push(output.$field);)+
            }
            ::core::result::Result::Ok(Self {
                $($field: $crate::Gather::<$backend>::gather($field, shards)?,)+
            })
        }
    };
}
