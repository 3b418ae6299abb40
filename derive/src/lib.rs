//! `#[derive(Scatter)]` and `#[derive(Gather)]` for burn-dataparallel: use them through that
//! crate (`burn_dataparallel::{Scatter, Gather}`), whose docs describe the traits.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Expr, Fields, Ident, Type, parse_macro_input, parse_quote};

/// Implements `burn_dataparallel::Scatter` for a struct with named fields by scattering each
/// field; `#[scatter(loss_weight = f)]` on the struct states each part's loss weight with
/// `f: fn(&Self) -> f64` (a function or a closure that captures nothing).
#[proc_macro_derive(Scatter, attributes(scatter))]
pub fn derive_scatter(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    scatter(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Implements `burn_dataparallel::Gather` for a struct with named fields by gathering each
/// field.
#[proc_macro_derive(Gather)]
pub fn derive_gather(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    gather(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// The struct's named fields and their types.
fn fields<'a>(input: &'a DeriveInput, derive: &str) -> syn::Result<Vec<(&'a Ident, &'a Type)>> {
    let refused = || {
        syn::Error::new_spanned(
            &input.ident,
            format!(
                "#[derive({derive})] needs a struct with named fields; for another type, \
                 implement `burn_dataparallel::{derive}` by hand"
            ),
        )
    };
    match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(named) if !named.named.is_empty() => Ok(named
                .named
                .iter()
                .map(|field| (field.ident.as_ref().expect("a named field"), &field.ty))
                .collect()),
            _ => Err(refused()),
        },
        _ => Err(refused()),
    }
}

/// The struct's generics with `Type: trait_path` added for every field's type.
fn bounded(input: &DeriveInput, types: &[&Type], bound: Tokens) -> syn::Generics {
    let mut generics = input.generics.clone();
    let clause = generics.make_where_clause();
    for ty in types {
        clause.predicates.push(parse_quote!(#ty: #bound));
    }
    generics
}

/// The fields' names, a local per field named apart from them (a field may be called `dim`
/// or `shards`, as the impls' own locals), and the struct's generics bounded by `bound` for
/// every field's type.
fn split(
    fields: &[(&Ident, &Type)],
    input: &DeriveInput,
    bound: Tokens,
) -> (Vec<Ident>, Vec<Ident>, syn::Generics) {
    let names: Vec<Ident> = fields.iter().map(|(name, _)| (*name).clone()).collect();
    let parts = names
        .iter()
        .map(|name| format_ident!("__parts_{}", name))
        .collect();
    let types: Vec<&Type> = fields.iter().map(|(_, ty)| *ty).collect();
    (names, parts, bounded(input, &types, bound))
}

/// `loss_weight = EXPR` from `#[scatter(..)]`, if given.
fn loss_weight(input: &DeriveInput) -> syn::Result<Option<Expr>> {
    let mut weight = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("scatter")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("loss_weight") {
                weight = Some(meta.value()?.parse::<Expr>()?);
                Ok(())
            } else {
                Err(meta.error("#[scatter(..)] takes `loss_weight = f`, f: fn(&Self) -> f64"))
            }
        })?;
    }
    Ok(weight)
}

fn scatter(input: &DeriveInput) -> syn::Result<Tokens> {
    let fields = fields(input, "Scatter")?;
    let weight = loss_weight(input)?;
    let name = &input.ident;
    let (names, parts, generics) = split(&fields, input, quote!(::burn_dataparallel::Scatter));
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let weight = weight.map(|weight| {
        quote! {
            fn loss_weight(&self) -> ::core::option::Option<f64> {
                let weight: fn(&Self) -> f64 = #weight;
                ::core::option::Option::Some(weight(self))
            }
        }
    });
    Ok(quote! {
        impl #impl_generics ::burn_dataparallel::Scatter for #name #ty_generics #where_clause {
            fn batch_size(
                &self,
                __dim: usize,
            ) -> ::core::result::Result<
                ::core::option::Option<usize>,
                ::burn_dataparallel::DataParallelError,
            > {
                let __size = ::core::option::Option::None;
                #(
                    let __size = ::burn_dataparallel::merge_batch_size(
                        __size,
                        ::burn_dataparallel::Scatter::batch_size(&self.#names, __dim)?,
                        __dim,
                    )?;
                )*
                ::core::result::Result::Ok(__size)
            }

            fn scatter(self, __shards: &::burn_dataparallel::Shards) -> ::std::vec::Vec<Self> {
                #(
                    let mut #parts =
                        ::burn_dataparallel::Scatter::scatter(self.#names, __shards).into_iter();
                )*
                (0..__shards.len())
                    .map(|_| Self {
                        #(#names: #parts.next().expect("one piece per shard"),)*
                    })
                    .collect()
            }

            fn carries_gradients(&self) -> bool {
                false #(|| ::burn_dataparallel::Scatter::carries_gradients(&self.#names))*
            }

            #weight
        }
    })
}

fn gather(input: &DeriveInput) -> syn::Result<Tokens> {
    let fields = fields(input, "Gather")?;
    let name = &input.ident;
    let (names, parts, generics) = split(&fields, input, quote!(::burn_dataparallel::Gather));
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::burn_dataparallel::Gather for #name #ty_generics #where_clause {
            fn gather(
                __outputs: ::std::vec::Vec<Self>,
                __shards: &::burn_dataparallel::Shards,
            ) -> ::core::result::Result<Self, ::burn_dataparallel::DataParallelError> {
                #(let mut #parts = ::std::vec::Vec::with_capacity(__outputs.len());)*
                for __output in __outputs {
                    #(#parts.push(__output.#names);)*
                }
                ::core::result::Result::Ok(Self {
                    #(#names: ::burn_dataparallel::Gather::gather(#parts, __shards)?,)*
                })
            }
        }
    })
}
