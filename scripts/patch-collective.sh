#!/usr/bin/env bash
# Copies the published sources of burn-collective 0.21.0 and burn-communication 0.21.0 from
# cargo's registry into OUT (default target/patched) and applies
# patches/burn-collective-0.21.0.patch, for the multinode/ workspace's [patch.crates-io].
#
#   scripts/patch-collective.sh [OUT]
#
# The repository carries only the fix; the sources come from crates.io (fetched here with
# `cargo fetch` when the registry does not have them yet). Run it again after `cargo clean`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/patched}
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
find_crate() {
    find "$registry" -maxdepth 2 -type d -name "$1" 2>/dev/null | head -1
}
if [ -z "$(find_crate burn-collective-0.21.0)" ] || [ -z "$(find_crate burn-communication-0.21.0)" ]; then
    cargo fetch --quiet
fi
rm -rf "$out"
mkdir -p "$out"
for crate in burn-collective-0.21.0 burn-communication-0.21.0; do
    source=$(find_crate "$crate")
    [ -n "$source" ] || { echo "$crate is not in $registry after cargo fetch" >&2; exit 1; }
    cp -r "$source" "$out/$crate"
done
patch --quiet -p1 -d "$out" <patches/burn-collective-0.21.0.patch
echo "patched: $out/burn-collective-0.21.0 $out/burn-communication-0.21.0"
