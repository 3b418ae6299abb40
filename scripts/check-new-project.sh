#!/usr/bin/env bash
# Pastes the README's dependency lines and programs into fresh `cargo new` projects in a
# temporary folder, as a new user would, and builds them:
#
#   1. the path form and the CPU program: built and run;
#   2. the git form, against a bare clone of this checkout's HEAD (`file://`, as no git host
#      is reached here): built and run;
#   3. the `cargo add` commands of the README's note on systemstat, with the same program:
#      built and run.
#
# The projects share one target folder, so each after the first builds little but itself.
#
#   scripts/check-new-project.sh            # NEW_PROJECT_TARGET=DIR keeps the builds in DIR
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The README's block that follows the marker `<!-- new project: $1 -->`, without its fences.
block() {
    awk -v marker="<!-- new project: $1 -->" '
        $0 == marker { found = 1; next }
        found && /^```/ { if (inside) exit; inside = 1; next }
        inside { print }
    ' README.md
}
main=$(block src/main.rs)
[ -n "$main" ] || { echo "README marker 'src/main.rs' not found" >&2; exit 1; }

target="${NEW_PROJECT_TARGET:-$tmp/target}"
export CARGO_TARGET_DIR="$target/cpu"

# A new project named $1 with the README's dependency block $2 (its `[dependencies]` line
# dropped: `cargo new` wrote one), the crate's folder or URL replaced by $3, and program $4.
project() {
    local name=$1 deps source=$3 program=$4
    deps=$(block "$2")
    [ -n "$deps" ] || { echo "README marker '$2' not found" >&2; exit 1; }
    cargo new --quiet --vcs none --bin "$tmp/$name"
    printf '%s\n' "$deps" |
        sed -e "s#path = \"\\.\\./burn-dataparallel\"#path = \"$repo\"#" \
            -e "s#git = \"[^\"]*\"#git = \"$source\"#" |
        grep -v '^\[dependencies\]$' >>"$tmp/$name/Cargo.toml"
    printf '%s\n' "$program" >"$tmp/$name/src/main.rs"
    cat "$tmp/$name/Cargo.toml"
}

project quickstart Cargo.toml "" "$main"
(cd "$tmp/quickstart" && cargo run --quiet)
echo "new project (README's path form): built and ran"

git clone --quiet --bare "$repo" "$tmp/repo.git"
project git "git Cargo.toml" "file://$tmp/repo.git" "$main"
(cd "$tmp/git" && cargo run --quiet)
echo "new project (README's git form, a clone of HEAD): built and ran"

# The `cargo add` path, the README's three commands: Burn first, then the downgrade, then
# this crate.
cargo new --quiet --vcs none --bin "$tmp/added"
(
    cd "$tmp/added"
    cargo add --quiet burn@0.22.1 --features train,flex
    cargo update --quiet -p systemstat --precise 0.2.7
    cargo add --quiet burn-dataparallel --path "$repo"
    printf '%s\n' "$main" >src/main.rs
    cargo run --quiet
)
echo "new project (cargo add): built and ran"
