#!/usr/bin/env bash
# The suite and the training-step bench on CUDA: built on a machine without a GPU, run on one with.
#
#   scripts/gpu.sh build              # here: the release test and bench binaries, CUDA with
#                                     # Burn's fusion and autotune (FEATURES to change), into
#                                     # gpu-bundle/ (stripped, xz-compressed; ignored by git;
#                                     # ONE_ARCHIVE packs several in one archive, below)
#   scripts/gpu.sh run LOG_DIR        # on the GPU machine, from the repository root:
#                                     # the suite on every device list of LISTS, each
#                                     # in a fresh process, logs in LOG_DIR
#   scripts/gpu.sh bench LOG_DIR      # on the GPU machine: benches/train_step's own loop,
#                                     # its Learner comparison, cold starts and devices of
#                                     # different speeds, parameters moved between two devices
#                                     # (BENCH_MODES: loop learner cold mix, and moves;
#                                     # cold: COLD_MODELS, COLD_REPLICAS, DRIVER_CACHE; what
#                                     # each cold process compiled: records-*.txt)
#   scripts/gpu.sh concat LOG_DIR     # on the GPU machine: benches/concat (the gather's kernel
#                                     # against Tensor::cat and a copy; CONCAT_BIN, CONCAT_ARGS),
#                                     # then torch.cat's figures for the same cases
#                                     # (benches/concat/torch_cat.py; TORCH=no skips them)
#   scripts/gpu.sh upstream LOG_DIR   # on the GPU machine: upstream/cross_stream.rs (CubeCL's
#                                     # cross-stream controls, UPSTREAM_ROUNDS rounds each)
#   scripts/gpu.sh compare LOG_DIR    # on the GPU machine: the ignored tests COMPARE_FILTER
#                                     # (equivalence::listed) of several builds (BUILDS: the
#                                     # binaries suite-NAME, built with SUFFIX=-NAME; NAME+ARM
#                                     # runs one under an arm: compare_one) on each
#                                     # list of LISTS, in fresh processes on a kept cache per
#                                     # build, 16 at a time, in blocks of BLOCK seconds (45)
#                                     # that alternate builds and lists, ROUNDS times (2);
#                                     # counts the failures per build and list, keeps their logs
#   scripts/gpu.sh concurrent LOG_DIR # on the GPU machine: upstream/concurrent_backward.rs
#                                     # (binaries concurrent-BUILD) in CONCURRENT_PROCS fresh
#                                     # processes per arm of CONCURRENT_ARMS (BUILD:ACTIVATION,
#                                     # "fusion:relu fusion:tanh"), the arms alternating, 16 at
#                                     # a time, each on an empty kernel cache of its own;
#                                     # counts the processes with wrong rounds per arm
#   scripts/gpu.sh repeat LOG_DIR     # on the GPU machine: the ignored tests REPEAT_FILTER
#                                     # matches (`learner`: the Learner steps) on REPEAT_LIST,
#                                     # in REPEAT_RUNS fresh processes, REPEAT_JOBS at a time,
#                                     # none started after REPEAT_SECONDS; counts the
#                                     # failures, keeps their logs
#
# LISTS (space-separated DeviceLists) defaults to "cuda:0,cuda:0 cuda:0,cpu cuda:0,cuda:0,cuda:0":
# replicas sharing the GPU, the GPU with the CPU (Flex), three replicas. RUNS repeats the
# whole set (1); FLOATS (e.g. "f32 f16 bf16") the float types each list runs in (f32); JOBS
# how many of those processes run at once (1). Every process starts on an empty kernel cache
# of its own (CACHE=kept shares the one Burn's `persistence` feature leaves in
# target/environment): its time includes compiling its kernels.
set -euo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-gpu-bundle}

build() {
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
    local features=${FEATURES:-cuda,fusion,autotune}
    bash scripts/llvm-from-pypi.sh
    mkdir -p "$BUNDLE"
    { cargo test --release --features "$features" --no-run --message-format=json
      cargo bench --features "$features" --no-run --message-format=json
      cargo build --release --features "$features" --examples --message-format=json; } \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] in (["test"], ["bench"], ["example"]):
        print(m["target"]["name"], m["executable"])
' | sort -u | while read -r name path; do
        # Stripped, a binary that links LLVM packs to about 33 MB: one a call's 64 MiB.
        # SUFFIX (e.g. -cube) names a second build's binaries apart from the first's.
        name=$name${SUFFIX:-}
        strip -o "$BUNDLE/$name" "$path"
        if [ -z "${ONE_ARCHIVE:-}" ]; then
            xz -T0 -6 -c "$BUNDLE/$name" > "$BUNDLE/$name.xz"
            rm "$BUNDLE/$name"
            echo "$BUNDLE/$name.xz: $(du -h "$BUNDLE/$name.xz" | cut -f1)"
        fi
    done
    # ONE_ARCHIVE="suite concat train_step": those binaries in one archive, with a dictionary
    # that spans them all, so that what they share (Burn, LLVM) packs once: three in about
    # 51 MB, one call (about 10 minutes on two cores). The other binaries are not kept.
    if [ -n "${ONE_ARCHIVE:-}" ]; then
        # shellcheck disable=SC2086
        tar -C "$BUNDLE" -cf - $ONE_ARCHIVE \
            | xz -T1 --lzma2=preset=6,dict=600MiB -c > "$BUNDLE/all.tar.xz"
        find "$BUNDLE" -maxdepth 1 -type f ! -name '*.xz' ! -name features -delete
        echo "$BUNDLE/all.tar.xz ($ONE_ARCHIVE): $(du -h "$BUNDLE/all.tar.xz" | cut -f1)"
    fi
    echo "$features" > "$BUNDLE/features"
}

run() {
    local log; log=$(log_dir "${1:?LOG_DIR}")
    unpack
    export RUST_BACKTRACE=1
    echo "features: $(cat "$BUNDLE/features" 2>/dev/null)" | tee "$log/summary.txt"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log/summary.txt"
    local lists=${LISTS:-cuda:0,cuda:0 cuda:0,cpu cuda:0,cuda:0,cuda:0}
    # An empty kernel cache for every process unless CACHE=kept (Burn's `persistence` keeps
    # it in target/environment): each process warms a CubeCL environment of its own.
    [ "${CACHE:-empty}" = kept ] || rm -rf target/environment
    for round in $(seq 1 "${RUNS:-1}"); do
        for float in ${FLOATS:-f32}; do
            for list in $lists; do
                echo "$round $float $list"
            done
        done
    done | xargs -P "${JOBS:-1}" -L1 bash "$SELF" run-one "$log"
    sort -o "$log/summary.txt" "$log/summary.txt"
    cat "$log/summary.txt"
    timeout 120 "$BUNDLE/bin/suite" --ignored a_gpu_that_does_not_exist \
        > "$log/unknown-device.log" 2>&1 && echo "unknown device: passed" | tee -a "$log/summary.txt" \
        || echo "unknown device: FAILED" | tee -a "$log/summary.txt"
}

# One suite process: LOG_DIR ROUND FLOAT LIST.
run_one() {
    local log=$1 round=$2 float=$3 list=$4
    local start; start=$(date +%s%N)
    local status=passed name=${list//[:,]/_}-$float
    local environment=default
    [ "${CACHE:-empty}" = kept ] || environment=suite-$round-$name
    # A test's watchdog (60 s) waits longer where processes compile side by side.
    local limit=60
    [ "${JOBS:-1}" -le 1 ] || limit=180
    DATAPARALLEL_TEST_LIMIT=${DATAPARALLEL_TEST_LIMIT:-$limit} \
    CUBECL_ENVIRONMENT=$environment DATAPARALLEL_FLOAT=$float DATAPARALLEL_DEVICES=$list \
        timeout "${SUITE_LIMIT:-300}" "$BUNDLE/bin/suite" --ignored listed:: --test-threads=1 \
        > "$log/suite-$round-$name.log" 2>&1 || status=FAILED
    local took=$(( ($(date +%s%N) - start) / 1000000 ))
    local counts; counts=$(grep -E "^test result" "$log/suite-$round-$name.log" | tail -1 || true)
    printf 'round %s %-22s %-4s %s in %s ms: %s\n' "$round" "$list" "$float" "$status" \
        "$took" "$counts" | tee -a "$log/summary.txt"
}

bench() {
    local log; log=$(log_dir "${1:?LOG_DIR}")
    unpack
    local bin=$BUNDLE/bin/train_step devices=${BENCH_DEVICES:-cuda:0}
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log/bench-gpu.txt"
    for mode in ${BENCH_MODES:-loop learner cold mix}; do
        case $mode in
            loop) timeout "${BENCH_LIMIT:-900}" "$bin" loop --devices "$devices" ${BENCH_ARGS:-} \
                    2>&1 | tee "$log/bench-loop.log" || true ;;
            learner) timeout "${BENCH_LIMIT:-900}" "$bin" learner --devices "$devices" \
                    --replicas "${LEARNER_REPLICAS:-2}" --rounds "${LEARNER_ROUNDS:-3}" ${BENCH_ARGS:-} \
                    2>&1 | tee "$log/bench-learner.log" || true ;;
            mix) timeout "${BENCH_LIMIT:-900}" "$bin" mix --devices "${MIX_DEVICES:-cuda:0,cpu}" \
                    --models "${MIX_MODELS:-mlp}" ${BENCH_ARGS:-} 2>&1 | tee "$log/bench-mix.log" || true ;;
            moves) timeout "${BENCH_LIMIT:-900}" "$bin" moves --devices "${MIX_DEVICES:-cuda:0,cpu}" \
                    ${BENCH_ARGS:-} 2>&1 | tee "$log/bench-moves.log" || true ;;
            cold)
                # A fresh process each, twice: on an empty kernel cache, then on the cache
                # the first left (CubeCL keeps one in target/environment with Burn's
                # `persistence` feature; without it, both runs are cold). The CUDA driver
                # keeps its own cache of the PTX it has compiled (CUDA_CACHE_PATH, here in
                # target/): DRIVER_CACHE=empty empties it with CubeCL's, to tell the two apart.
                export CUDA_CACHE_PATH=$PWD/target/cuda-driver-cache
                for model in ${COLD_MODELS:-mlp resnet18}; do
                    for replicas in ${COLD_REPLICAS:-0 1 2}; do
                        rm -rf target/environment
                        [ "${DRIVER_CACHE:-kept}" = kept ] || rm -rf "$CUDA_CACHE_PATH"
                        for cache in empty kept; do
                            echo -n "$cache cache: " >> "$log/bench-cold.log"
                            timeout 300 "$bin" cold --devices "$devices" --models "$model" \
                                --cold-replicas "$replicas" 2>&1 | tail -1 \
                                | tee -a "$log/bench-cold.log" || true
                        done
                        # What the two processes compiled and tuned, and what each took.
                        python3 scripts/kernel-records.py target/environment/*.db \
                            > "$log/records-$model-x$replicas.txt" 2>&1 || true
                    done
                done ;;
        esac
    done
}

concat() {
    local log; log=$(log_dir "${1:?LOG_DIR}")
    unpack
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$log/concat-gpu.txt"
    # CONCAT_BIN: the bench's binary (concat, or concat-NAME of a build with SUFFIX=-NAME);
    # CONCAT_ARGS: its arguments after the device; TORCH=no skips torch.cat's figures.
    # shellcheck disable=SC2086
    timeout "${BENCH_LIMIT:-300}" "$BUNDLE/bin/${CONCAT_BIN:-concat}" --device "${BENCH_DEVICES:-cuda:0}" \
        ${CONCAT_ARGS:-} 2>&1 | tee "$log/${CONCAT_BIN:-concat}.log" || true
    [ "${TORCH:-yes}" = no ] \
        || timeout "${BENCH_LIMIT:-300}" python3 benches/concat/torch_cat.py 2>&1 | tee "$log/torch_cat.log" || true
}

concurrent() {
    local log; log=$(log_dir "${1:?LOG_DIR}")
    unpack
    local arms=${CONCURRENT_ARMS:-fusion:relu fusion:tanh} procs=${CONCURRENT_PROCS:-8}
    rm -rf target/environment/concurrent-*
    for i in $(seq 1 "$procs"); do
        for arm in $arms; do echo "$arm $i"; done
    done | xargs -P 16 -L1 bash "$SELF" concurrent-one "$log"
    # A process counts as wrong where any of its rows has a wrong round; its largest error
    # is the largest of its rows'.
    for arm in $arms; do
        local name=${arm//:/-} wrong=0 ran=0 cut=0 worst=""
        for f in "$log/$name"-*.log; do
            [ -e "$f" ] || continue
            ran=$((ran + 1))
            grep -q 'fresh' "$f" || cut=$((cut + 1))
            awk -F'|' '$7 + 0 > 0 { found = 1 } END { exit !found }' "$f" && wrong=$((wrong + 1))
            worst="$worst $(awk -F'|' '$8 ~ /e/ { v = $8 + 0; if (v > m) m = v } END { printf "%.2e", m }' "$f")"
        done
        echo "concurrent $arm: $wrong of $ran processes with wrong rounds ($cut cut before the fresh row); largest errors:$worst" \
            | tee -a "$log/summary.txt"
    done
}

# One process of `concurrent`: LOG_DIR BUILD:ACTIVATION N.
concurrent_one() {
    local log=$1 arm=$2 n=$3
    local build=${arm%%:*} activation=${arm#*:}
    local args="cuda ${CONCURRENT_ROUNDS:-100} churn"
    [ "$activation" = tanh ] && args="$args tanh"
    # shellcheck disable=SC2086
    CUBECL_ENVIRONMENT=concurrent-${arm//:/-}-$n timeout "${CONCURRENT_LIMIT:-150}" \
        "$BUNDLE/bin/concurrent-$build" $args > "$log/${arm//:/-}-$n.log" 2>&1 || true
}

upstream() {
    local log; log=$(log_dir "${1:?LOG_DIR}")
    unpack
    timeout "${BENCH_LIMIT:-300}" "$BUNDLE/bin/cross_stream" all "${UPSTREAM_ROUNDS:-50}" \
        2>&1 | tee "$log/cross_stream.log" || true
}

# LOG_DIR, made if need be, as an absolute path.
log_dir() {
    mkdir -p "$1"
    (cd "$1" && pwd)
}

unpack() {
    mkdir -p "$BUNDLE/bin"
    # One archive of several binaries packs smaller than each alone (they share Burn and
    # LLVM); each archive unpacked once a machine.
    for packed in "$BUNDLE"/*.tar.xz; do
        local mark; mark="$BUNDLE/bin/.unpacked-$(basename "$packed")"
        if [ -e "$packed" ] && [ ! -e "$mark" ]; then
            tar -C "$BUNDLE/bin" -xJf "$packed"
            touch "$mark"
        fi
    done
    for packed in "$BUNDLE"/*.xz; do
        case $packed in *.tar.xz|*'*'*) continue ;; esac
        local name; name=$(basename "$packed" .xz)
        xz -dc "$packed" > "$BUNDLE/bin/$name"
        chmod +x "$BUNDLE/bin/$name"
    done
}

repeat() {
    local log; log=$(log_dir "${1:?LOG_DIR}")
    unpack
    local filter=${REPEAT_FILTER:-learner} runs=${REPEAT_RUNS:-300}
    export DATAPARALLEL_DEVICES=${REPEAT_LIST:-cuda:0,cuda:0}
    # Every process fresh, on one kernel cache that the first fills alone (a CubeCL
    # environment of its own), so that the others start in seconds.
    export CUBECL_ENVIRONMENT=repeat
    timeout 300 "$BUNDLE/bin/suite" --ignored "$filter" --test-threads=1 > "$log/repeat-0.log" 2>&1 \
        && rm "$log/repeat-0.log" || true
    local start; start=$(date +%s%N)
    # Each process's outcome goes to repeat-outcomes.txt as it ends; a failed one keeps its
    # log. None starts after REPEAT_SECONDS (unset: no deadline).
    local deadline=$(( $(date +%s) + ${REPEAT_SECONDS:-1000000000} ))
    touch "$log/repeat-outcomes.txt"
    seq 1 "$runs" | xargs -P "${REPEAT_JOBS:-8}" -I{} sh -c \
        "[ \$(date +%s) -lt $deadline ] || exit 0; \
         if timeout 300 '$BUNDLE/bin/suite' --ignored '$filter' --test-threads=1 > '$log/repeat-{}.log' 2>&1; \
         then rm '$log/repeat-{}.log'; echo '{} passed' >> '$log/repeat-outcomes.txt'; \
         else echo '{} FAILED' >> '$log/repeat-outcomes.txt'; fi"
    local failed ran
    failed=$(grep -c FAILED "$log/repeat-outcomes.txt" || true)
    ran=$(wc -l < "$log/repeat-outcomes.txt")
    local took=$(( ($(date +%s%N) - start) / 1000000000 ))
    [ ! -e "$log/repeat-0.log" ] || echo "repeat: the first process (filling the cache) FAILED" \
        | tee -a "$log/summary.txt"
    echo "repeat $filter on $DATAPARALLEL_DEVICES: $failed of $ran fresh processes failed ($runs asked) ($took s, features $(cat "$BUNDLE/features" 2>/dev/null))" \
        | tee -a "$log/summary.txt"
}

compare() {
    local log; log=$(log_dir "${1:?LOG_DIR}")
    unpack
    local block=${BLOCK:-45} builds=${BUILDS:-fusion cube} lists=${LISTS:-cuda:0,cpu cuda:0,cuda:0}
    # Each build's kernel cache filled by one process alone, so that the others start in
    # seconds.
    for build in $builds; do
        for list in $lists; do
            bash "$SELF" compare-one "$log" "$build" "$list" "fill-$build-${list//[:,]/_}" \
                >> "$log/fills.txt"
        done
    done
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for list in $lists; do
            for build in $builds; do
                local name=$build-${list//[:,]/_} deadline=$(( $(date +%s) + block ))
                seq 1 1000 | xargs -P 16 -I{} sh -c "[ \$(date +%s) -lt $deadline ] || exit 0; \
                    bash '$SELF' compare-one '$log' '$build' '$list' '$name-$round-{}'" \
                    >> "$log/outcomes.txt"
            done
        done
    done
    sort "$log/outcomes.txt" | uniq -c | tee "$log/summary.txt"
}

# One process of `compare`: LOG_DIR BUILD LIST NAME. BUILD is a binary's name (suite-BUILD),
# with `+blocking` (CUDA_LAUNCH_BLOCKING=1: every launch waits for its kernel) or `+single`
# (CubeCL's `[streaming] policy = "single"`: every thread on one stream) as an arm. Prints
# "BUILD LIST passed", or FAILED with the test's own words on which check failed; a failed
# process keeps its log (NAME.log).
compare_one() {
    local log=$1 build=$2 list=$3 name=$4 dir=$PWD
    local bin; bin=$(cd "$BUNDLE/bin" && pwd)/suite-${build%%+*}
    case $build in
        *+blocking) export CUDA_LAUNCH_BLOCKING=1 ;;
        *+single)
            # CubeCL reads cubecl.toml from the working directory or its parents.
            dir=$PWD/target/arm-single
            mkdir -p "$dir"
            printf '[streaming]\npolicy = "single"\n' > "$dir/cubecl.toml" ;;
        *+*) echo "unknown arm in $build (blocking, single)" >&2; exit 2 ;;
    esac
    if (cd "$dir" && CUBECL_ENVIRONMENT=compare-${build//+/-} DATAPARALLEL_DEVICES=$list \
        timeout 120 "$bin" --ignored "${COMPARE_FILTER:-equivalence::listed}" --test-threads=1) \
        > "$log/$name.log" 2>&1; then
        rm "$log/$name.log"
        echo "$build $list passed"
    else
        # The test's own words on which check failed (printed after the panic), else the panic.
        local why; why=$(grep -m1 'differs' "$log/$name.log" || grep -m1 'panicked' "$log/$name.log" || true)
        local tests; tests=$(grep -oE '^test [^ ]+ \.\.\. FAILED' "$log/$name.log" | sed -E 's/^test .*::([^: ]+) .*/\1/' | tr '\n' ' ')
        echo "$build $list FAILED ${tests}: $(echo "$why" | sed -E 's/^step [0-9]+ of [0-9]+: //' | cut -c1-100)"
    fi
}

case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    run-one) shift; run_one "$@" ;;
    repeat) shift; repeat "$@" ;;
    compare) shift; compare "$@" ;;
    compare-one) shift; compare_one "$@" ;;
    bench) shift; bench "$@" ;;
    concat) shift; concat "$@" ;;
    upstream) shift; upstream "$@" ;;
    concurrent) shift; concurrent "$@" ;;
    concurrent-one) shift; concurrent_one "$@" ;;
    *) sed -n 2,48p "$0"; exit 2 ;;
esac
