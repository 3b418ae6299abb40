#!/usr/bin/env bash
# CUDA checks of burn-dataparallel, built on a machine without a GPU, run on one with.
#
#   scripts/gpu-check.sh build           # here: build the CUDA test, bench and example
#                                        #       binaries into gpu-bundle/ (compressed)
#   scripts/gpu-check.sh run LOG_DIR [tests|kernels|bench|all]
#                                        # on the GPU machine, from the repository root:
#                                        #       run them, write logs and the CubeCL caches
#                                        #       to LOG_DIR, print a short table last
#
# Each check has a time limit (TESTS_LIMIT, BENCH_LIMIT seconds) so that a call ends in time
# to bring its logs back. BENCH_ARGS picks the bench's backends (fusion, cube, cpu);
# SKIP_EXAMPLE=1 skips the example, SKIP_STEP_TIME=1 the step-time bench.
#
# gpu-bundle/ holds the binaries, a cubecl.toml that keeps CubeCL's compilation and autotune
# caches in gpu-bundle/work/, and that cache from the last run when it is copied back
# (LOG_DIR/cubecl-cache.tar.gz into gpu-bundle/); it is ignored by git and travels as a whole.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=gpu-bundle
BINARIES="backends kernels step_time concat learner_cnn"

build() {
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
    mkdir -p "$BUNDLE"
    local json
    json=$(mktemp)
    cargo test --release --features cuda --test backends --test kernels --no-run \
        --message-format=json >"$json"
    cargo bench --features cuda --bench step_time --bench concat --no-run \
        --message-format=json >>"$json"
    cargo build --release --features cuda --example learner_cnn --message-format=json >>"$json"
    python3 - "$json" "$BUNDLE" <<'PY'
import json, shutil, sys
out = sys.argv[2]
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
        name = msg["target"]["name"]
        shutil.copy(msg["executable"], f"{out}/{name}")
        print(f"{out}/{name}")
PY
    rm -f "$json"
    for bin in $BINARIES; do
        strip "$BUNDLE/$bin"
        xz -T0 -6 -f "$BUNDLE/$bin"
    done
    cat >"$BUNDLE/cubecl.toml" <<'TOML'
[compilation]
cache = "local"

[autotune]
level = "minimal"
cache = "local"
TOML
    du -sh "$BUNDLE"
}

run() {
    local logs
    logs=$(realpath "${1:?usage: gpu-check.sh run LOG_DIR}")
    mkdir -p "$logs"
    local work="$BUNDLE/work"
    mkdir -p "$work"
    cp "$BUNDLE/cubecl.toml" "$work/"
    if [ -f "$BUNDLE/cubecl-cache.tar.gz" ]; then
        tar xzf "$BUNDLE/cubecl-cache.tar.gz" -C "$work"
    fi
    for bin in $BINARIES; do
        xz -dc "$BUNDLE/$bin.xz" >"$work/$bin"
        chmod +x "$work/$bin"
    done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"

    local table="$logs/summary.md"
    echo "| check | result | seconds |" >"$table"
    echo "|---|---|---|" >>"$table"
    step() { # name, time limit, command...
        local name=$1 limit=$2
        shift 2
        local start=$SECONDS status=pass
        (cd "$work" && timeout -k 10 "$limit" "$@") >"$logs/$name.log" 2>&1 || status="FAIL ($?)"
        echo "| $name | $status | $((SECONDS - start)) |" >>"$table"
    }
    export CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}"
    local what=${2:-all} tests_limit=${TESTS_LIMIT:-250} bench_limit=${BENCH_LIMIT:-200}
    if [ "$what" != bench ] && [ "$what" != kernels ]; then
        step tests-cuda-fusion "$tests_limit" ./backends --test-threads=1 cuda_fusion::
        step tests-cuda-cube "$tests_limit" ./backends --test-threads=1 cuda_cube::
    fi
    if [ "$what" = kernels ] || [ "$what" = all ]; then
        step tests-kernels-cuda "$tests_limit" ./kernels --test-threads=1 cuda
        step bench-concat "$bench_limit" ./concat
        step bench-concat-torch "$bench_limit" python3 "$(pwd)/benches/torch_concat.py"
    fi
    if [ "$what" = bench ] || [ "$what" = all ]; then
        [ -n "${SKIP_EXAMPLE:-}" ] || step example-4-replicas "$bench_limit" ./learner_cnn 4
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of backend names
        [ -n "${SKIP_STEP_TIME:-}" ] || step step-time "$bench_limit" ./step_time ${BENCH_ARGS:-}
    fi

    local exclude=(--exclude=cubecl.toml)
    for bin in $BINARIES; do exclude+=("--exclude=$bin"); done
    (cd "$work" && tar czf "$logs/cubecl-cache.tar.gz" "${exclude[@]}" .)
    echo
    for name in tests-cuda-fusion tests-cuda-cube tests-kernels-cuda; do
        [ -f "$logs/$name.log" ] || continue
        echo "$name: $(grep -E '^test result' "$logs/$name.log" || echo 'no result line')"
        grep -E '^test .* (FAILED|ok)$' "$logs/$name.log" | grep -c ' ok$' | sed 's/^/  passed: /' || true
        grep -E '^test .* FAILED$' "$logs/$name.log" | head -20 || true
    done
    for name in step-time bench-concat bench-concat-torch; do
        [ -f "$logs/$name.log" ] && grep -E '^\|' "$logs/$name.log"
    done
    [ -f "$logs/example-4-replicas.log" ] && tail -4 "$logs/example-4-replicas.log"
    echo
    cat "$table"
}

case "${1:-}" in
    build) build ;;
    run) run "${2:-}" "${3:-all}" ;;
    *)
        echo "usage: $0 build | run LOG_DIR [tests|kernels|bench|all]" >&2
        exit 2
        ;;
esac
