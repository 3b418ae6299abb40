# The correctness modes of scripts/gpu-check.sh (`tests`, `trust`, `repeat`, `vulkan`),
# sourced by it; each runs inside its `run`, whose `step`, `work`, `logs`, `table`, `gpus`
# and limits it uses.

# The CUDA suites once each, and Burn's f16 backends against f32.
mode_tests() {
    step tests-cuda-fusion "$tests_limit" ./backends --test-threads=1 cuda_fusion::
    step tests-cuda-cube "$tests_limit" ./backends --test-threads=1 cuda_cube::
    step tests-cuda-cube-half "$tests_limit" ./backends --test-threads=1 cuda_cube_half::
    step tests-cuda-faults "$tests_limit" ./backends --test-threads=1 --nocapture cuda_faults::
    # Burn's own f16 backends against f32, no wrapper; Fusion's known fault included, and
    # the wrapper's refusal of that backend.
    step tests-cuda-half-backends "$tests_limit" ./half_precision --test-threads=1 \
        --include-ignored --nocapture
}

mode_trust() {
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
        local split=" ${SPLIT_FILES:-races} " test cut=0
        for module in $modules; do
            [ "$SECONDS" -lt "$deadline" ] || { cut=$((cut + 1)) && continue; }
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
        # Files left unstarted at TRUST_DEADLINE make the round's row say so, not pass.
        local result=pass
        [ "$failed" = 0 ] || result="$failed files FAIL"
        [ "$cut" = 0 ] || result+=", $cut files not run (TRUST_DEADLINE)"
        echo "| $label, all files | $result | $((SECONDS - began)) |" >>"$table"
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
    # The CubeBackend suite in f16, a process per file (HALF_RUNS times, 0 by default).
    half_suites() {
        for ((run = 1; run <= ${HALF_RUNS:-0}; run++)); do
            by_module "suite-half-$run" cuda_cube_half "${SUITE_JOBS:-1}"
        done
    }
    # FRESH_ROUNDS=N instead: N rounds, each in a folder of its own with empty CubeCL caches
    # and an empty CUDA driver cache, as on a new machine; each runs the suites FRESH_SUITES
    # names (cube, fusion, half: CubeBackend in f16; cube and fusion by default) at once, a process per file (SUITE_JOBS and
    # FUSION_JOBS at a time, 8 by default; each file under TESTS_LIMIT, 540 s by default here);
    # rows suite-cube-freshR and suite-fusion-freshR.
    # FRESH_AT_ONCE=K runs K rounds at the same time (1): on fresh caches a round's time is
    # mostly NVRTC compiling on the CPU, and its longest files (equivalence, graphs) leave
    # most cores idle.
    if [ -n "${FRESH_ROUNDS:-}" ]; then
        local fresh
        for ((fresh = 1; fresh <= FRESH_ROUNDS; fresh++)); do
            [ "$SECONDS" -lt "$deadline" ] || break
            while [ "$(jobs -rp | wc -l)" -ge "${FRESH_AT_ONCE:-1}" ]; do wait -n || true; done
            fresh_round "$fresh" &
        done
        wait
    elif [ "${TRUST_TOGETHER:-0}" = 1 ]; then
        cube_suites &
        fusion_suites &
        half_suites &
        wait
    else
        cube_suites
        fusion_suites
        half_suites
    fi
    local expected
    expected=$(cd "$work" && ./backends --list --ignored 2>/dev/null |
        sed -n 's/: test$//p' | grep 'cuda_fusion::') || true
    if [ -n "$expected" ] && [ "${FUSION_RUNS:-1}" != 0 ] && [ "$SECONDS" -lt "$deadline" ]; then
        # shellcheck disable=SC2046 # one argument per test name
        step "suite-fusion-expected" "$tests_limit" ./backends --test-threads=1 --ignored \
            --exact $expected
    fi
}

# One fresh-cache round of mode_trust (FRESH_ROUNDS): the suites FRESH_SUITES names, in a
# work folder of its own that holds only the binaries and cubecl.toml; removed after.
fresh_round() { # round
    local round=$1 base=$work suite bin
    # Fresh caches need a longer limit per file than run's 250 s: on 2026-12-03 the longest
    # files took 318 s (`CubeBackend` `equivalence`, five rounds at once) and 359 s
    # (Fusion's four-replica race stress, compiling on its one thread).
    local tests_limit=${TESTS_LIMIT:-540}
    local work="$base-fresh$round"
    rm -rf "$work"
    mkdir -p "$work"
    cp "$base/cubecl.toml" "$work/"
    for bin in $BINARIES; do
        [ ! -f "$base/$bin" ] || ln "$base/$bin" "$work/$bin" 2>/dev/null || cp "$base/$bin" "$work/$bin"
    done
    export CUDA_CACHE_PATH="$work/nv"
    for suite in ${FRESH_SUITES:-cube fusion}; do
        case $suite in
            cube) by_module "suite-cube-fresh$round" cuda_cube "${SUITE_JOBS:-8}" & ;;
            fusion) by_module "suite-fusion-fresh$round" cuda_fusion "${FUSION_JOBS:-8}" & ;;
            half) by_module "suite-half-fresh$round" cuda_cube_half "${SUITE_JOBS:-8}" & ;;
            *) echo "unknown suite $suite in FRESH_SUITES" >&2 ;;
        esac
    done
    wait
    rm -rf "$work"
}

mode_vulkan() {
    # Replicas on distinct wgpu devices of a GPU through its Vulkan driver (tensors moved
    # through host memory): the generic suite's wgpu_distinct cases, then the host-staged
    # bench at a GPU's size. WGPU_DEVICES (default,discrete:0: one GPU as two devices)
    # names them as DATAPARALLEL_WGPU_DEVICES does; the Vulkan loader must be installed.
    local wgpu_devices=${WGPU_DEVICES:-default,discrete:0}
    DATAPARALLEL_WGPU_DEVICES=$wgpu_devices DATAPARALLEL_REQUIRE_WGPU=1 \
        step tests-wgpu-distinct "$tests_limit" ./backends --test-threads=1 wgpu_distinct::
    DATAPARALLEL_WGPU_DEVICES=$wgpu_devices \
        step bench-host-staged "$bench_limit" ./host_staged ${HOST_STAGED_ARGS:-large}
}

mode_repeat() {
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
}
