#!/usr/bin/env bash
# Pastes the README's dependency lines and quickstart program into a fresh `cargo new`
# project in a temporary folder, with this checkout as the crate's path, and builds and runs
# it: the first thing a new user does, checked as they would do it. Then the same program in
# a second project whose dependencies come from `cargo add`, as the README's note on
# systemstat tells a user (`cargo add burn@0.21 --features train,flex` first locks systemstat
# 0.2.8, with which burn-train 0.21 does not build and this crate does not resolve). Both
# share one target folder, so the second builds nothing but itself.
#
#   scripts/check-new-project.sh            # NEW_PROJECT_TARGET=DIR keeps its build in DIR
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The README's blocks that follow the markers `<!-- new project: Cargo.toml -->` and
# `<!-- new project: src/main.rs -->`, without their fences.
block() {
    awk -v marker="<!-- new project: $1 -->" '
        $0 == marker { found = 1; next }
        found && /^```/ { if (inside) exit; inside = 1; next }
        inside { print }
    ' README.md
}
deps=$(block Cargo.toml)
main=$(block src/main.rs)
[ -n "$deps" ] && [ -n "$main" ] || { echo "README markers not found" >&2; exit 1; }

export CARGO_TARGET_DIR="${NEW_PROJECT_TARGET:-$tmp/target}"

cargo new --quiet --vcs none --bin "$tmp/quickstart"
# The README names the crate's folder as `../burn-dataparallel`; here it is this checkout.
printf '%s\n' "$deps" | sed "s#\"\\.\\./burn-dataparallel\"#\"$repo\"#" |
    grep -v '^\[dependencies\]$' >>"$tmp/quickstart/Cargo.toml"
printf '%s\n' "$main" >"$tmp/quickstart/src/main.rs"
cat "$tmp/quickstart/Cargo.toml"
(cd "$tmp/quickstart" && cargo run --quiet)
echo "new project (README's dependency lines): built and ran"

# The `cargo add` path, the README's three commands: Burn first, then the downgrade, then
# this crate.
cargo new --quiet --vcs none --bin "$tmp/added"
cd "$tmp/added"
cargo add --quiet burn@0.21 --features train,flex
cargo update --quiet -p systemstat --precise 0.2.7
cargo add --quiet burn-dataparallel --path "$repo"
printf '%s\n' "$main" >src/main.rs
cargo run --quiet
echo "new project (cargo add): built and ran"
