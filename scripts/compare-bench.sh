#!/usr/bin/env bash
# A bench of this tree against the same bench on commit REV, in alternating processes, so
# that both builds see the same drift of the machine.
#
#   scripts/compare-bench.sh REV BENCH [RUNS] [-- ARGS...]
#   e.g. scripts/compare-bench.sh 28c91eb host_work 3
#        STRATEGIES_ROUNDS=1 scripts/compare-bench.sh 28c91eb strategies 2 -- resnet18
#
# REV's sources are checked out in target/compare-REV (a git worktree) with this tree's
# benches/ copied in, so that only the crate differs; both build into this tree's target/.
# Each of RUNS (default 3) alternations runs REV's build, then this tree's; the bench's table
# rows are printed with a first column naming the build and the run, the header once.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/compare-bench.sh REV BENCH [RUNS] [-- ARGS...]"
rev=${1:?$usage}
bench=${2:?$usage}
runs=3
shift 2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then runs=$1 && shift; fi
[ "${1:-}" = "--" ] && shift
root=$PWD
export CARGO_TARGET_DIR=$root/target
tree=$root/target/compare-$rev
if [ ! -d "$tree" ]; then
    git worktree add --detach "$tree" "$rev" >/dev/null
fi
rm -rf "$tree/benches" && cp -r benches "$tree/benches"
# The bench's [[bench]] entry, if REV predates it.
grep -q "name = \"$bench\"" "$tree/Cargo.toml" ||
    awk -v b="$bench" '$0 == "name = \"" b "\"" {p = 1; print "\n[[bench]]"} p && /^$/ {p = 0}
        p' Cargo.toml >>"$tree/Cargo.toml"

binary() { # the bench's executable built from the sources in $1
    (cd "$1" && cargo bench --bench "$bench" --no-run --message-format=json 2>/dev/null) |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line) if line.startswith("{") else {}
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])'
}
before=$(binary "$tree")
after=$(binary "$root")
[ -n "$before" ] && [ -n "$after" ] || { echo "build failed" >&2; exit 1; }
header=1
for run in $(seq "$runs"); do
    for build in "$rev" "this tree"; do
        exe=$before
        [ "$build" = "this tree" ] && exe=$after
        # A table's first two lines are its header: kept once, with the build column.
        "$exe" "$@" 2>/dev/null | grep '^|' | awk -v b="$build run $run" -v h=$header '
            /^\|---/ { if (h && !sep) print "|---" $0; sep = 1; next }
            !seen { seen = 1; if (h) print "| build " $0; next }
            { print "| " b " " $0 }'
        header=0
    done
done
