//! Training across processes with burn-collective, continuing a `DataParallel` run from its
//! checkpoint: the multi-node half of the hand-off in the crate docs' chapter "Outgrowing one
//! machine", built against burn-collective 0.21.0 with its barrier fixed
//! (`patches/burn-collective-0.21.0.patch`, applied by `scripts/patch-collective.sh`). The
//! model, the wrapper's run and the peers' loop come from `burn-dataparallel-handoff`
//! (`../handoff`).
//!
//! A workspace of its own because `[patch.crates-io]` applies to a whole workspace: a project
//! that depends on burn-dataparallel keeps the published crates.

pub mod nodes;
