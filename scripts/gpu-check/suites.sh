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
    # FRESH_ROUNDS=N instead: N rounds, each starting from empty CubeCL caches and an empty
    # CUDA driver cache, as on a new machine, each both suites at once a process per file
    # (SUITE_JOBS and FUSION_JOBS at a time, 8 by default); rows suite-cube-freshR and
    # suite-fusion-freshR. TRUST_TOGETHER=1 runs the two at the same time (on fresh caches,
    # most of their time is NVRTC compiling on the CPU cores, which one suite alone does not
    # fill).
    if [ -n "${FRESH_ROUNDS:-}" ]; then
        local fresh
        export CUDA_CACHE_PATH="$work/nv"
        for ((fresh = 1; fresh <= FRESH_ROUNDS; fresh++)); do
            [ "$SECONDS" -lt "$deadline" ] || break
            empty_caches
            by_module "suite-cube-fresh$fresh" cuda_cube "${SUITE_JOBS:-8}" &
            by_module "suite-fusion-fresh$fresh" cuda_fusion "${FUSION_JOBS:-8}" &
            wait
        done
    elif [ "${TRUST_TOGETHER:-0}" = 1 ]; then
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
}

# Empties the CubeCL caches in the run's work folder (everything but the binaries and
# cubecl.toml, as the saved caches leave out) and the CUDA driver's cache kept there.
empty_caches() {
    local entry keep=" cubecl.toml "
    for bin in $BINARIES; do keep+="$bin $bin-before "; done
    for entry in "$work"/* "$work"/.[!.]*; do
        [ -e "$entry" ] || continue
        [[ "$keep" == *" ${entry##*/} "* ]] || rm -rf "$entry"
    done
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
