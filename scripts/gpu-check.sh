#!/usr/bin/env bash
# CUDA checks of burn-dataparallel, built on a machine without a GPU, run on one with.
#
#   scripts/gpu-check.sh build           # here: build the CUDA test, bench and example
#                                        #       binaries into gpu-bundle/ (compressed;
#                                        #       BUILD_BINARIES="backends train_step" for some)
#   scripts/gpu-check.sh run LOG_DIR [tests|kernels|bench|models|strategies|overlap|cold|multi|threads|trust|repeat|vulkan|all]
#                                        # on the GPU machine, from the repository root:
#                                        #       run them, write logs and the CubeCL caches
#                                        #       to LOG_DIR, print a short table last
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
# `repeat` runs a test filter many times in fresh processes (REPEAT_FILTER, REPEAT_RUNS,
# REPEAT_JOBS; REPEAT_STREAMS=1 on one CubeCL stream per device) and counts its failures.
# `vulkan` runs the generic tests' `wgpu_distinct` cases and the host-staged bench on two wgpu
# devices of the GPU through its Vulkan driver (WGPU_DEVICES, HOST_STAGED_ARGS).
# `overlap` runs the train-step bench with the overlapped gradient reduce on and off, in
# alternating processes. `trust` runs the cross-stream controls (examples/cross_stream.rs;
# CONTROLS="late" for one of them, CONTROL_COUNT rounds) and
# the races' positive control (RACE_CONTROL_SECS),
# the CubeBackend suite SUITE_RUNS times (10; with SUITE_JOBS=N a process per test file, N
# at a time) and the Fusion suite FUSION_RUNS times (1, a process per test file,
# FUSION_JOBS at a time (1), then the expected failures), each in a fresh process, none
# started after TRUST_DEADLINE seconds (TRUST_TOGETHER=1: both suites at once); COMPARE_BUNDLE=DIR (a bundle
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
BINARIES="backends half_precision kernels step_time concat learner_cnn cross_stream train_step autodiff_threads strategies host_staged"

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
            step_time | concat | train_step | autodiff_threads | strategies | host_staged) benches+=(--bench "$bin") ;;
            learner_cnn | cross_stream) examples+=(--example "$bin") ;;
            *) echo "unknown binary $bin" >&2 && exit 2 ;;
        esac
    done
    : >"$json"
    [ ${#tests[@]} -eq 0 ] || cargo test --release --features cuda "${tests[@]}" --no-run \
        --message-format=json >>"$json"
    [ ${#benches[@]} -eq 0 ] || cargo bench --features cuda "${benches[@]}" --no-run \
        --message-format=json >>"$json"
    [ ${#examples[@]} -eq 0 ] || cargo build --release --features cuda "${examples[@]}" \
        --message-format=json >>"$json"
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

# Time to first step in fresh processes: for each configuration in COLD_CONFIGS ("backend
# model replicas batch", ';'-separated), a run on empty CubeCL caches, one with both caches
# kept, and one with only the autotune cache kept; counts the kernels compiled and the
# autotune entries written, from CubeCL's cache files. COLD_CACHES picks the runs, in order
# (default "fresh kept autotune-only"): "carried" starts from a copy of the caches carried
# into the call, "carried-autotune" from a copy of their autotune cache only (so the kept
# compilation cache after it holds this model's kernels alone), and "kept-nojit" reruns on
# the caches left with the CUDA driver's own cache of compiled PTX off (CUDA_CACHE_DISABLE=1).
# COLD_GPUS=N (N > 1) runs N configurations at once, configuration k on GPU k modulo the
# machine's GPUs (CUDA_VISIBLE_DEVICES), so that e.g. the bare model and four replicas start
# fresh side by side within one call's limit; rows keep the order of COLD_CONFIGS. Each
# configuration keeps the CUDA driver's cache of compiled PTX in its own folder
# (CUDA_CACHE_PATH), so "fresh" starts without it whatever ran before in the call.
cold_start() { # LOG_DIR, the machine's GPU count
    local logs=$1 devices=$2 at_once=${COLD_GPUS:-1}
    local configs=${COLD_CONFIGS:-"fusion mlp 0 256;fusion mlp 1 256;fusion mlp 2 512;fusion mlp 4 1024;cube mlp 0 256;cube mlp 2 512"}
    local out="$logs/cold.md"
    echo "| cache | model | configuration | batch | warm-up | first step done | steps 2 / 3 / 4 | steady from start | steady step | kernels compiled | autotune entries |" >"$out"
    echo "|---|---|---|---|---|---|---|---|---|---|---|" >>"$out"
    local config k=0 dirs=()
    IFS=';' read -ra list <<<"$configs"
    for config in "${list[@]}"; do
        read -r backend model replicas batch <<<"$config"
        local dir="$BUNDLE/cold/$k-$backend-$model-$replicas"
        dirs+=("$dir")
        if [ "$at_once" -gt 1 ]; then
            CUDA_VISIBLE_DEVICES=$((k % devices)) cold_config "$logs" "$dir" "$config" &
            # A wave is full: wait for it before the next one.
            [ $(((k + 1) % at_once)) -eq 0 ] && wait
        else
            cold_config "$logs" "$dir" "$config"
        fi
        k=$((k + 1))
    done
    wait
    for dir in "${dirs[@]}"; do cat "$dir/rows.md" >>"$out"; done
    # The shapes each configuration tuned last, one line per entry: file and key.
    for dir in "${dirs[@]}"; do
        (cd "$dir" && grep -r . autotune 2>/dev/null | sed "s#^#${dir##*/} #") || true
    done >"$logs/cold-autotune.txt"
    cat "$out"
}

# One configuration of `cold_start`, in its own folder; its table rows go to DIR/rows.md.
cold_config() {
    local logs=$1 dir=$2 limit=${COLD_LIMIT:-150} caches=${COLD_CACHES:-fresh kept autotune-only}
    local backend model replicas batch
    read -r backend model replicas batch <<<"$3"
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$BUNDLE/cubecl.toml" "$dir/"
    : >"$dir/rows.md"
    local cache
    for cache in $caches; do
        [ "$cache" = autotune-only ] && rm -rf "$dir/cuda" "$dir/nv"
        if [ "$cache" = carried ] || [ "$cache" = carried-autotune ]; then
            rm -rf "$dir"/{cuda,autotune}
            cp -r "$BUNDLE/work/autotune" "$dir/" 2>/dev/null || true
            [ "$cache" = carried ] && cp -r "$BUNDLE/work/cuda" "$dir/" 2>/dev/null
        fi
        local line nojit=0
        [ "$cache" = kept-nojit ] && nojit=1
        line=$(cd "$dir" && CUDA_CACHE_PATH="$(pwd)/nv" CUDA_CACHE_DISABLE=$nojit \
            timeout -k 10 "$limit" "../../work/train_step" cold "$backend" \
            "$model" "$replicas" "$batch" 2>>"$logs/cold.err" | grep '^cold' ||
            echo "cold | $model | $replicas replicas | $batch | timed out or failed |||||")
        local kernels=0 tuned=0
        [ -f "$dir/cuda/0.10.0/ptx/toc.json.log" ] &&
            kernels=$(wc -l <"$dir/cuda/0.10.0/ptx/toc.json.log")
        # No autotune log yet (a run that timed out early) counts as none.
        tuned=$(cat "$dir"/autotune/*/*/*.json.log 2>/dev/null | wc -l) || true
        echo "| $cache $backend ${line#cold } $kernels | $tuned |" >>"$dir/rows.md"
    done
}

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
        xz -dc "$BUNDLE/$bin.xz" >"$work/$bin"
        chmod +x "$work/$bin"
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
    if [ "$what" = tests ] || [ "$what" = all ]; then
        step tests-cuda-fusion "$tests_limit" ./backends --test-threads=1 cuda_fusion::
        step tests-cuda-cube "$tests_limit" ./backends --test-threads=1 cuda_cube::
        step tests-cuda-cube-half "$tests_limit" ./backends --test-threads=1 cuda_cube_half::
        step tests-cuda-faults "$tests_limit" ./backends --test-threads=1 --nocapture cuda_faults::
        # Burn's own f16 backends against f32, no wrapper; Fusion's known fault included, and
        # the wrapper's refusal of that backend.
        step tests-cuda-half-backends "$tests_limit" ./half_precision --test-threads=1 \
            --include-ignored --nocapture
    fi
    if [ "$what" = kernels ] || [ "$what" = all ]; then
        step tests-kernels-cuda "$tests_limit" ./kernels --test-threads=1 cuda
        step bench-concat "$bench_limit" ./concat
        step bench-concat-torch "$bench_limit" python3 "$(pwd)/benches/torch_concat.py"
    fi
    if [ "$what" = models ] || [ "$what" = all ]; then
        step bench-models-torch "$bench_limit" python3 "$(pwd)/benches/torch_models.py" \
            "$logs/torch_models.csv"
        # shellcheck disable=SC2086 # MODELS_ARGS is a list of names
        TRAIN_STEP_CSV="$logs/train_step.csv" TRAIN_STEP_SVG="$logs/train_step.svg" \
            TORCH_CSV="$logs/torch_models.csv" \
            step bench-models "$bench_limit" ./train_step ${MODELS_ARGS:-}
    fi
    if [ "$what" = multi ]; then
        # Several GPUs: the generic tests with replica i on GPU i (mod the count); PyTorch's
        # DataParallel and DDP with the GPU-to-GPU copy rate (TORCH_LIMIT seconds); the
        # scaling bench (per-replica batch kept; TRAIN_STEP_REPLICAS puts the all-GPU run
        # first, so that the GPUs tune at once).
        DATAPARALLEL_TEST_DEVICES=distinct \
            step tests-multi-fusion "$tests_limit" ./backends --test-threads=1 cuda_fusion::
        DATAPARALLEL_TEST_DEVICES=distinct \
            step tests-multi-cube "$tests_limit" ./backends --test-threads=1 cuda_cube::
        # Host cost of Burn's autodiff on one thread per GPU against one thread (CPU only).
        step bench-autodiff-threads 120 ./autodiff_threads "$gpus"
        # shellcheck disable=SC2086 # MODELS_ARGS is a list of names
        step bench-scaling-torch "${TORCH_LIMIT:-$bench_limit}" python3 \
            "$(pwd)/benches/torch_models.py" --scaling "$gpus" "$logs/torch_scaling.csv" \
            ${MODELS_ARGS:-}
        # shellcheck disable=SC2086 # MODELS_ARGS is a list of names
        TRAIN_STEP_DISTINCT=1 TRAIN_STEP_SCALE_BATCH=1 TRAIN_STEP_CSV="$logs/scaling.csv" \
            TRAIN_STEP_SVG="$logs/scaling.svg" TORCH_CSV="$logs/torch_scaling.csv" \
            TRAIN_STEP_REPLICAS="${TRAIN_STEP_REPLICAS:-$gpus,0,1,4}" \
            step bench-scaling "$bench_limit" ./train_step ${MODELS_ARGS:-fusion}
        # Speed-up against the GPU count per strategy, ours and PyTorch's, from this call.
        step chart-scaling 30 ./train_step plot-speedup "$logs/speedup.svg" \
            "$logs/scaling.csv" "$logs/torch_scaling.csv"
    fi
    if [ "$what" = strategies ] || [ "$what" = models ]; then
        # DataParallel (own loop and Learner) against burn-train's MultiDevice, one model and
        # global batch at a time (STRATEGIES_ARGS: models; STRATEGIES_* as in the bench).
        # shellcheck disable=SC2086 # STRATEGIES_ARGS is a list of names
        STRATEGIES_CSV="$logs/strategies.csv" \
            step bench-strategies "$bench_limit" ./strategies ${STRATEGIES_ARGS:-}
        # Speed-up over the bare Learner per strategy, from that run's rows.
        [ ! -f "$logs/strategies.csv" ] || step chart-strategies 30 ./train_step \
            plot-speedup-global "$logs/strategies.svg" "$logs/strategies.csv"
    fi
    if [ "$what" = overlap ]; then
        # The overlapped gradient reduce against the reduce after the replicas' backward, in
        # alternating processes (OVERLAP_ROUNDS pairs) on CubeBackend, the bare model beside;
        # OVERLAP_ARGS: models (ResNet-18 by default); each log ends with the stage profiles.
        local round overlap
        for ((round = 1; round <= ${OVERLAP_ROUNDS:-2}; round++)); do
            for overlap in 1 0; do
                # shellcheck disable=SC2086 # OVERLAP_ARGS is a list of names
                TRAIN_STEP_OVERLAP=$overlap TRAIN_STEP_REPLICAS="${TRAIN_STEP_REPLICAS:-0,2,4}" \
                    TRAIN_STEP_BATCHES="${TRAIN_STEP_BATCHES:-256}" \
                    step "bench-overlap-$overlap-$round" "$bench_limit" ./train_step cube \
                    ${OVERLAP_ARGS:-resnet18}
            done
        done
    fi
    if [ "$what" = trust ]; then
        # Whether CUDA results can be trusted: the cross-stream controls (and, where
        # COMPARE_BUNDLE brought an older build, the same controls on it, alternating), then
        # the CubeBackend suite SUITE_RUNS times, each in a fresh process, then the Fusion
        # suite once (FUSION_RUNS).
        local round run
        for ((round = 1; round <= ${CONTROL_ROUNDS:-1}; round++)); do
            # shellcheck disable=SC2086 # CONTROLS is a control's name and its arguments
            step "controls-$round" "$bench_limit" ./cross_stream ${CONTROLS:-all} \
                "${CONTROL_COUNT:-200}"
            # shellcheck disable=SC2086
            [ ! -x "$work/cross_stream-before" ] || step "controls-before-$round" \
                "$bench_limit" ./cross_stream-before ${CONTROLS:-all} "${CONTROL_COUNT:-200}"
        done
        # The races' positive control: Burn #5573's loops on the bare model, without the
        # wrapper, on every backend built, each until it loses a gradient or for
        # RACE_CONTROL_SECS (30; 0 skips it): the race stress's zeros bound something only
        # where these fail to pass.
        if [ "${RACE_CONTROL_SECS:-30}" != 0 ]; then
            DATAPARALLEL_CONTROL_SECS=${RACE_CONTROL_SECS:-30} step race-control "$tests_limit" \
                ./backends --test-threads=1 --ignored races::positive_control::
        fi
        # TRUST_DEADLINE (seconds since the script started) stops starting further runs, so
        # that a call ends in time to bring its logs and caches back.
        local deadline=${TRUST_DEADLINE:-1000000}
        # One test file (module) per process, JOBS files at a time: on fresh caches most of a
        # file's time is CubeCL compiling its kernels on the CPU, which several processes
        # share out over the cores; a fault that leaves a server unusable fails its own file.
        by_module() { # label, backend module (cuda_cube, cuda_fusion), jobs
            local label=$1 backend=$2 jobs=$3 names modules module began=$SECONDS failed
            names=$(cd "$work" && ./backends --list 2>/dev/null | sed -n 's/: test$//p' |
                grep "$backend::") || true
            # TRUST_FILES (a regular expression) keeps only the files it matches.
            modules=$(sed 's/::.*//' <<<"$names" | sort -u | grep -E "^(${TRUST_FILES:-.*})$") || true
            # Files named in SPLIT_FILES (races: its stress tests take minutes each on Fusion)
            # run a process per test.
            local split=" ${SPLIT_FILES:-races} " test
            for module in $modules; do
                [ "$SECONDS" -lt "$deadline" ] || break
                local tests
                tests=$(grep -E "^$module::([a-z_]+::)?$backend::" <<<"$names")
                if [[ "$split" == *" $module "* ]]; then
                    for test in $tests; do
                        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
                        step "$label-$module-${test##*::}" "$tests_limit" ./backends \
                            --test-threads=1 --exact "$test" &
                    done
                    continue
                fi
                while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
                # shellcheck disable=SC2086 # one argument per test name
                step "$label-$module" "$tests_limit" ./backends --test-threads=1 \
                    --exact $tests &
            done
            wait
            failed=$(grep -c "^| $label-[a-z_-]* | FAIL" "$table") || true
            echo "| $label, all files | $([ "$failed" = 0 ] && echo pass ||
                echo "$failed files FAIL") | $((SECONDS - began)) |" >>"$table"
        }
        # The CubeBackend suite in one process per run, or with SUITE_JOBS a process per file
        # (SUITE_JOBS files at a time).
        cube_suites() {
            for ((run = 1; run <= ${SUITE_RUNS:-10}; run++)); do
                [ "$SECONDS" -lt "$deadline" ] || break
                if [ -n "${SUITE_JOBS:-}" ]; then
                    by_module "suite-cube-$run" cuda_cube "$SUITE_JOBS"
                else
                    step "suite-cube-$run" "$tests_limit" ./backends --test-threads=1 cuda_cube::
                fi
            done
        }
        # The Fusion suite a process per file (FUSION_JOBS at a time, 1), then the tests
        # marked `fusion_fails` (ignored), to see whether Burn's faults still fail them
        # (FUSION_RUNS=0: neither).
        fusion_suites() {
            for ((run = 1; run <= ${FUSION_RUNS:-1}; run++)); do
                by_module "suite-fusion-$run" cuda_fusion "${FUSION_JOBS:-1}"
            done
        }
        # TRUST_TOGETHER=1 runs the two at the same time (on fresh caches, most of their time
        # is NVRTC compiling on the CPU cores, which one suite alone does not fill).
        if [ "${TRUST_TOGETHER:-0}" = 1 ]; then
            cube_suites &
            fusion_suites &
            wait
        else
            cube_suites
            fusion_suites
        fi
        local expected
        expected=$(cd "$work" && ./backends --list --ignored 2>/dev/null |
            sed -n 's/: test$//p' | grep 'cuda_fusion::') || true
        if [ -n "$expected" ] && [ "${FUSION_RUNS:-1}" != 0 ] && [ "$SECONDS" -lt "$deadline" ]; then
            # shellcheck disable=SC2046 # one argument per test name
            step "suite-fusion-expected" "$tests_limit" ./backends --test-threads=1 --ignored \
                --exact $expected
        fi
    fi
    if [ "$what" = vulkan ]; then
        # Replicas on distinct wgpu devices of a GPU through its Vulkan driver (tensors moved
        # through host memory): the generic suite's wgpu_distinct cases, then the host-staged
        # bench at a GPU's size. WGPU_DEVICES (default,discrete:0: one GPU as two devices)
        # names them as DATAPARALLEL_WGPU_DEVICES does; the Vulkan loader must be installed.
        local wgpu_devices=${WGPU_DEVICES:-default,discrete:0}
        DATAPARALLEL_WGPU_DEVICES=$wgpu_devices DATAPARALLEL_REQUIRE_WGPU=1 \
            step tests-wgpu-distinct "$tests_limit" ./backends --test-threads=1 wgpu_distinct::
        DATAPARALLEL_WGPU_DEVICES=$wgpu_devices \
            step bench-host-staged "$bench_limit" ./host_staged ${HOST_STAGED_ARGS:-large}
    fi
    if [ "$what" = repeat ]; then
        # How often an intermittent failure comes: the tests REPEAT_FILTER names (arguments
        # to the test binary) REPEAT_RUNS times (20), each in a fresh process, REPEAT_JOBS at
        # a time (4). REPEAT_STREAMS=N runs them with CubeCL's `[streaming] max_streams = N`
        # (1: every thread of a process on one stream per device, the control for faults
        # between streams). Each failing test is counted by name in LOG_DIR/LABEL.txt, LABEL
        # being repeat-streams-N or repeat-streams-default.
        local label="repeat-streams-${REPEAT_STREAMS:-default}" dir=$work run
        if [ -n "${REPEAT_STREAMS:-}" ]; then
            dir="$work-streams"
            rm -rf "$dir"
            cp -r "$work" "$dir"
            printf '\n[streaming]\nmax_streams = %s\n' "$REPEAT_STREAMS" >>"$dir/cubecl.toml"
        fi
        for ((run = 1; run <= ${REPEAT_RUNS:-20}; run++)); do
            while [ "$(jobs -rp | wc -l)" -ge "${REPEAT_JOBS:-4}" ]; do wait -n || true; done
            # shellcheck disable=SC2086 # REPEAT_FILTER is a list of arguments
            (cd "$dir" && timeout -k 10 "$tests_limit" ./backends --test-threads=1 \
                ${REPEAT_FILTER:?REPEAT_FILTER names the tests}) >"$logs/$label-$run.log" 2>&1 &
        done
        wait
        local failed
        failed=$(cat "$logs/$label"-*.log | sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' |
            sort | uniq -c | sort -rn) || true
        echo "$failed" >"$logs/$label.txt"
        echo "| $label, ${REPEAT_RUNS:-20} runs | $(grep -L '^test result: ok' "$logs/$label"-*.log |
            wc -l) runs failed | - |" >>"$table"
    fi
    if [ "$what" = cold ]; then
        cold_start "$logs" "$gpus"
    fi
    if [ "$what" = threads ]; then
        # Threads that share only the GPU, each launching a small model's kernels: one GPU
        # for all (CubeCL runs a device's launches on one server thread), and with several
        # GPUs one each.
        local backend
        for backend in cube fusion; do
            step "bench-threads-$backend" 150 ./autodiff_threads 2 "$backend"
            [ "$gpus" -lt 2 ] ||
                step "bench-threads-$backend-distinct" 150 ./autodiff_threads 2 "$backend" distinct
        done
    fi
    if [ "$what" = bench ] || [ "$what" = all ]; then
        [ -n "${SKIP_EXAMPLE:-}" ] || step example-4-replicas "$bench_limit" ./learner_cnn 4
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of backend names
        [ -n "${SKIP_STEP_TIME:-}" ] || step step-time "$bench_limit" ./step_time ${BENCH_ARGS:-}
    fi

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
    echo
    cat "$table"
}

case "${1:-}" in
    build) build ;;
    run) run "${2:-}" "${3:-all}" ;;
    *)
        echo "usage: $0 build | run LOG_DIR [tests|kernels|bench|models|strategies|overlap|cold|multi|threads|trust|vulkan|all]" >&2
        exit 2
        ;;
esac
