#!/usr/bin/env bash
# CUDA checks of burn-dataparallel, built on a machine without a GPU, run on one with.
#
#   scripts/gpu-check.sh build           # here: build the CUDA test, bench and example
#                                        #       binaries into gpu-bundle/ (compressed;
#                                        #       BUILD_BINARIES="backends train_step" for some)
#   scripts/gpu-check.sh run LOG_DIR [tests|kernels|bench|models|strategies|overlap|cold|multi|threads|trust|repeat|vulkan|usage|all]
#                                        # on the GPU machine, from the repository root:
#                                        #       run them, write logs and the CubeCL caches
#                                        #       to LOG_DIR, print a short table last
#
# The modes live in scripts/gpu-check/: suites.sh (tests, trust, repeat, vulkan), benches.sh
# (kernels, models, multi, strategies, overlap, threads, bench), cold.sh (cold).
#
# Each check has a time limit (TESTS_LIMIT, BENCH_LIMIT, TORCH_LIMIT seconds) so that a call
# ends in time to bring its logs back (where the machine's call has a limit of its own, run
# the script under a `timeout` shorter than it and pack LOG_DIR after); ONLY="tests-cuda-fusion bench-models ..." runs only the
# checks named. BENCH_ARGS picks the step-time bench's backends (fusion, cube, cpu),
# MODELS_ARGS the train-step bench's backends and models (fusion, cube; mlp, resnet18,
# encoder); SKIP_EXAMPLE=1 skips the example, SKIP_STEP_TIME=1 the step-time bench. `models`
# runs the three-model train-step bench and its PyTorch companion, then the strategies bench
# (`strategies` runs that one alone), and writes
# LOG_DIR/train_step.csv, torch_models.csv and train_step.svg. `threads` runs the
# autodiff_threads bench on CUDA: two threads on one GPU, and on two GPUs when there are.
# `usage` runs the examples and the README's CUDA program on USAGE_DEVICES, then the
# exact-path bench. `repeat` runs a test filter many times in fresh processes (REPEAT_FILTER, REPEAT_RUNS,
# REPEAT_JOBS; REPEAT_STREAMS=1 on one CubeCL stream per device) and counts its failures.
# `vulkan` runs the generic tests' `wgpu_distinct` cases and the host-staged bench on two wgpu
# devices of the GPU through its Vulkan driver (WGPU_DEVICES, HOST_STAGED_ARGS).
# `overlap` runs the train-step bench with the overlapped gradient reduce on and off, in
# alternating processes. `trust` runs the cross-stream controls (upstream/cross_stream/;
# CONTROLS="late" for one of them, CONTROL_COUNT rounds) and
# the races' positive control (RACE_CONTROL_SECS),
# the CubeBackend suite SUITE_RUNS times (10; with SUITE_JOBS=N a process per test file, N
# at a time) and the Fusion suite FUSION_RUNS times (1, a process per test file,
# FUSION_JOBS at a time (1), then the expected failures), each in a fresh process, none
# started after TRUST_DEADLINE seconds (TRUST_TOGETHER=1: both suites at once;
# FRESH_ROUNDS=N: instead, N rounds, each on empty caches in a folder of its own, FRESH_SUITES
# of them (cube fusion), FRESH_AT_ONCE rounds at a time (1)); COMPARE_BUNDLE=DIR (a bundle
# built from another commit) adds that build's controls, alternating with this one's;
# BUNDLE=DIR runs another bundle than gpu-bundle/.
#
# gpu-bundle/ holds the binaries and a cubecl.toml that keeps CubeCL's compilation and
# autotune caches in gpu-bundle/work/; both are ignored by git. A run writes those caches back
# as LOG_DIR/aa-cubecl-cache.tgz.NN, parts of at most 15 MiB (a file coming back from the GPU
# machine may have 16 MiB; "aa-" sorts them before the logs, since at most 8 files come back).
# (SAVE_CACHE=0 skips writing them; FRESH_CACHES=1 ignores the carried ones.)
# Copy the parts into gpu-cache/ (also ignored) and carry it with the binaries the mode needs,
# e.g. carry ["gpu-bundle/train_step.xz", "gpu-bundle/cubecl.toml", "gpu-cache"]: binaries
# that did not travel are skipped. An older single gpu-bundle/cubecl-cache.tar.gz is read too.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-gpu-bundle}
BINARIES="backends half_precision kernels step_time concat learner_cnn train_mlp readme_cuda cross_stream train_step autodiff_threads strategies host_staged exact_path"

build() {
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
    mkdir -p "$BUNDLE"
    local json
    json=$(mktemp)
    # BUILD_BINARIES="backends train_step" builds only those (default: all of BINARIES).
    local wanted=${BUILD_BINARIES:-$BINARIES} bin tests=() benches=() examples=()
    for bin in $wanted; do
        case $bin in
            backends | half_precision | kernels) tests+=(--test "$bin") ;;
            step_time | concat | train_step | autodiff_threads | strategies | host_staged | exact_path) benches+=(--bench "$bin") ;;
            learner_cnn | train_mlp | cross_stream | readme_cuda) examples+=(--example "$bin") ;;
            *) echo "unknown binary $bin" >&2 && exit 2 ;;
        esac
    done
    : >"$json"
    # The README's CUDA program, as an example of this crate (removed after the build).
    local readme=examples/readme_cuda.rs
    [[ " ${examples[*]} " != *" readme_cuda "* ]] || awk '
        $0 == "<!-- new project: cuda src/main.rs -->" { found = 1; next }
        found && /^```/ { if (inside) exit; inside = 1; next }
        inside { print }
    ' README.md >"$readme"
    [ ${#tests[@]} -eq 0 ] || cargo test --release --features cuda "${tests[@]}" --no-run \
        --message-format=json >>"$json"
    [ ${#benches[@]} -eq 0 ] || cargo bench --features cuda "${benches[@]}" --no-run \
        --message-format=json >>"$json"
    [ ${#examples[@]} -eq 0 ] || cargo build --release --features cuda "${examples[@]}" \
        --message-format=json >>"$json"
    rm -f "$readme"
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
    for bin in $wanted; do
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

# The modes, in files of their own.
# shellcheck source=/dev/null
. scripts/gpu-check/suites.sh
# shellcheck source=/dev/null
. scripts/gpu-check/benches.sh
# shellcheck source=/dev/null
. scripts/gpu-check/cold.sh

run() {
    local logs
    logs=$(realpath "${1:?usage: gpu-check.sh run LOG_DIR}")
    mkdir -p "$logs"
    local work="$BUNDLE/work"
    # FRESH_CACHES=1 starts from empty CubeCL caches (what a first run on a new machine meets).
    [ "${FRESH_CACHES:-0}" = 0 ] || rm -rf "$work"
    mkdir -p "$work"
    cp "$BUNDLE/cubecl.toml" "$work/"
    if [ "${FRESH_CACHES:-0}" != 0 ]; then
        echo "fresh CubeCL caches"
    elif compgen -G "gpu-cache/aa-cubecl-cache.tgz.*" >/dev/null; then
        cat gpu-cache/aa-cubecl-cache.tgz.* | tar xzf - -C "$work"
    elif [ -f "$BUNDLE/cubecl-cache.tar.gz" ]; then
        tar xzf "$BUNDLE/cubecl-cache.tar.gz" -C "$work"
    fi
    # CubeCL keys its autotune cache by device index (`CubeTuneId`), so every further GPU
    # would tune every shape again; the GPUs of one machine here are identical, so device 0's
    # results are added to the others' (SHARE_AUTOTUNE=0 keeps them apart).
    local gpus tuned i file
    gpus=$(nvidia-smi -L | wc -l)
    if [ "${SHARE_AUTOTUNE:-1}" = 1 ]; then
        for tuned in "$work"/autotune/*/device-*-0-*; do
            [ -d "$tuned" ] || continue
            for ((i = 1; i < gpus; i++)); do
                local other
                other=$(sed -E "s#/device-([0-9]+)-0-([^/]*)\$#/device-\1-$i-\2#" <<<"$tuned")
                mkdir -p "$other"
                for file in "$tuned"/*; do
                    [ -f "$file" ] || continue
                    # One JSON entry per line: keep the other device's lines, add device 0's.
                    cat "$other/${file##*/}" "$file" 2>/dev/null | awk '!seen[$0]++' \
                        >"$other/${file##*/}.merged"
                    mv "$other/${file##*/}.merged" "$other/${file##*/}"
                done
            done
        done
    fi
    for bin in $BINARIES; do
        [ -f "$BUNDLE/$bin.xz" ] || continue
        # Through a new file: a binary a killed run's processes still execute cannot be
        # overwritten in place, but can be replaced.
        xz -dc "$BUNDLE/$bin.xz" >"$work/$bin.new"
        chmod +x "$work/$bin.new"
        mv -f "$work/$bin.new" "$work/$bin"
        # The same binary built from an older commit (COMPARE_BUNDLE), as NAME-before.
        [ -n "${COMPARE_BUNDLE:-}" ] && [ -f "$COMPARE_BUNDLE/$bin.xz" ] || continue
        xz -dc "$COMPARE_BUNDLE/$bin.xz" >"$work/$bin-before"
        chmod +x "$work/$bin-before"
    done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"

    local table="$logs/summary.md"
    echo "| check | result | seconds |" >"$table"
    echo "|---|---|---|" >>"$table"
    step() { # name, time limit, command...; ONLY="name..." runs only the steps named
        local name=$1 limit=$2
        shift 2
        if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
            return 0
        fi
        local start=$SECONDS status=pass
        (cd "$work" && timeout -k 10 "$limit" "$@") >"$logs/$name.log" 2>&1 || status="FAIL ($?)"
        echo "| $name | $status | $((SECONDS - start)) |" >>"$table"
    }
    export CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}"
    # A test's first step on a fresh CubeCL cache compiles and tunes for minutes: the tests'
    # own watchdog waits that long; each step's time limit still bounds the whole.
    export DATAPARALLEL_TEST_TIMEOUT="${DATAPARALLEL_TEST_TIMEOUT:-600}"
    local what=${2:-all} tests_limit=${TESTS_LIMIT:-250} bench_limit=${BENCH_LIMIT:-200}
    case $what in
        all) mode_tests; mode_kernels; mode_models; mode_bench ;;
        tests) mode_tests ;;
        kernels) mode_kernels ;;
        models) mode_models; mode_strategies ;;
        multi) mode_multi ;;
        strategies) mode_strategies ;;
        overlap) mode_overlap ;;
        trust) mode_trust ;;
        vulkan) mode_vulkan ;;
        repeat) mode_repeat ;;
        cold) cold_start "$logs" "$gpus" ;;
        threads) mode_threads ;;
        bench) mode_bench ;;
        usage) mode_usage ;;
        *) echo "unknown mode $what" >&2 && return 2 ;;
    esac

    if [ "${SAVE_CACHE:-1}" = 1 ]; then
        local exclude=(--exclude=cubecl.toml)
        for bin in $BINARIES; do exclude+=("--exclude=$bin" "--exclude=$bin-before"); done
        (cd "$work" && tar czf - "${exclude[@]}" .) |
            split -b 15M -d - "$logs/aa-cubecl-cache.tgz."
        ls -l "$logs"/aa-cubecl-cache.tgz.*
    fi
    echo
    local suites
    suites=$(cd "$logs" && ls suite-*.log 2>/dev/null | sed 's/\.log$//' | sort -V) || true
    for name in tests-cuda-fusion tests-cuda-cube tests-cuda-cube-half \
        tests-cuda-faults tests-cuda-half-backends \
        tests-kernels-cuda tests-multi-fusion tests-multi-cube tests-wgpu-distinct $suites; do
        [ -f "$logs/$name.log" ] || continue
        echo "$name: $(grep -E '^test result' "$logs/$name.log" || echo 'no result line')"
        # (--nocapture output shares the lines of half_precision's results: no count there.)
        [ "$name" = tests-cuda-half-backends ] ||
            grep -E '^test .* (FAILED|ok)$' "$logs/$name.log" | grep -c ' ok$' | sed 's/^/  passed: /' || true
        grep -E '^test .* FAILED$' "$logs/$name.log" | head -20 || true
    done
    [ -f "$logs/suite-fusion-expected.log" ] && echo "  (suite-fusion-expected: Burn 0.21" \
        "Fusion faults; FAILED is expected, ok means the fault is gone and its mark can go)"
    # half_precision prints one line per case (ok or FAIL), beside its tests' output.
    local cases=$logs/tests-cuda-half-backends.log
    [ -f "$cases" ] && echo "  half_precision cases: $(grep -c '^ok ' "$cases") ok," \
        "$(grep -c '^FAIL ' "$cases") FAIL (Fusion's are known to fail on Burn 0.21)"
    for name in $(cd "$logs" && ls controls-*.log 2>/dev/null | sed 's/\.log$//' | sort -V); do
        echo "$name:" && grep -E '^\|' "$logs/$name.log" | tail -n +3
    done
    for name in bench-autodiff-threads bench-threads-cube bench-threads-cube-distinct \
        bench-threads-fusion bench-threads-fusion-distinct step-time bench-concat bench-concat-torch \
        bench-models-torch bench-models bench-strategies bench-scaling-torch bench-scaling; do
        [ -f "$logs/$name.log" ] && { grep -E '^(\||median ratio)' "$logs/$name.log" || true; }
    done
    [ -f "$logs/bench-host-staged.log" ] && grep -E '^(\||MLP|distinct)' "$logs/bench-host-staged.log"
    [ -f "$logs/example-4-replicas.log" ] && tail -4 "$logs/example-4-replicas.log"
    for name in example-train-mlp example-learner-cnn readme-cuda; do
        [ -f "$logs/$name.log" ] && { echo "$name:" && grep -E 'samples/s|accuracy|step [0-9]+:|training on' "$logs/$name.log" | tail -6; }
    done
    [ -f "$logs/bench-exact-path.log" ] && { grep -E '^\|' "$logs/bench-exact-path.log" || true; }
    echo
    cat "$table"
}

case "${1:-}" in
    build) build ;;
    run) run "${2:-}" "${3:-all}" ;;
    *)
        echo "usage: $0 build | run LOG_DIR [tests|kernels|bench|models|strategies|overlap|cold|multi|threads|trust|repeat|vulkan|usage|all]" >&2
        exit 2
        ;;
esac
