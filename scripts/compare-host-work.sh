#!/usr/bin/env bash
# The host-work bench (benches/host_work.rs) of this tree against the same bench on commit
# REV, in alternating processes, so that both builds see the same drift of the machine.
#
#   scripts/compare-host-work.sh REV [RUNS] [-- MODEL...]
#
# REV's sources are checked out in target/compare-REV (a git worktree) with this tree's
# benches/ copied in, so that only the crate differs; both build into this tree's target/.
# Each of RUNS (default 3) alternations runs REV's build, then this tree's, with
# HOST_WORK_ROUNDS=1 unless set; every row is printed, tagged with its build and run.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/compare-host-work.sh REV [RUNS] [-- MODEL...]}
runs=${2:-3}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
root=$PWD
export CARGO_TARGET_DIR=$root/target
tree=$root/target/compare-$rev
if [ ! -d "$tree" ]; then
    git worktree add --detach "$tree" "$rev" >/dev/null
fi
rm -rf "$tree/benches" && cp -r benches "$tree/benches"
grep -q 'name = "host_work"' "$tree/Cargo.toml" ||
    printf '\n[[bench]]\nname = "host_work"\nharness = false\nrequired-features = ["flex"]\n' \
        >>"$tree/Cargo.toml"

binary() { # the bench's executable built from the sources in $1
    (cd "$1" && cargo bench --bench host_work --no-run --message-format=json 2>/dev/null) |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line) if line.startswith("{") else {}
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])'
}
before=$(binary "$tree")
after=$(binary "$root")
[ -n "$before" ] && [ -n "$after" ] || { echo "build failed" >&2; exit 1; }
export HOST_WORK_ROUNDS=${HOST_WORK_ROUNDS:-1}
echo "| build | model | batch | replicas | replicate (ms) | calling thread's CPU in backward (ms) | backward (ms) | step (ms) |"
echo "|---|---|---|---|---|---|---|---|"
for run in $(seq "$runs"); do
    HOST_WORK_TAG="$rev run $run" "$before" "$@" | grep -v '^|---' | sed -n '2,$p'
    HOST_WORK_TAG="this tree run $run" "$after" "$@" | grep -v '^|---' | sed -n '2,$p'
done
