#!/usr/bin/env bash
# Pastes the README's dependency lines and quickstart program into a fresh `cargo new`
# project in a temporary folder, with this checkout as the crate's path, and builds and runs
# it: the first thing a new user does, checked as they would do it.
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

cargo new --quiet --vcs none --bin "$tmp/quickstart"
# The README names the crate's folder as `../burn-dataparallel`; here it is this checkout.
printf '%s\n' "$deps" | sed "s#\"\\.\\./burn-dataparallel\"#\"$repo\"#" |
    grep -v '^\[dependencies\]$' >>"$tmp/quickstart/Cargo.toml"
printf '%s\n' "$main" >"$tmp/quickstart/src/main.rs"
cat "$tmp/quickstart/Cargo.toml"
cd "$tmp/quickstart"
export CARGO_TARGET_DIR="${NEW_PROJECT_TARGET:-$tmp/target}"
cargo run --quiet
echo "new project: built and ran"
