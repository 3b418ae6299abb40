# The benchmark modes of scripts/gpu-check.sh (`kernels`, `models`, `multi`, `strategies`,
# `overlap`, `threads`, `bench`), sourced by it; each runs inside its `run`, whose `step`,
# `work`, `logs`, `table`, `gpus` and limits it uses.

# The concat and split kernels' tests, and the concat bench against Burn's `cat` and torch
# (`--bench`: a criterion binary run without it tests each case once and measures nothing).
# With COMPARE_BUNDLE's concat bench (`concat-before`), instead: the two builds alternating,
# CONCAT_ROUNDS (3) rounds each, criterion's filter CONCAT_FILTER (this crate's kernels on
# CubeBackend), for a kernel change's before and after.
mode_kernels() {
    step tests-kernels-cuda "$tests_limit" ./kernels --test-threads=1 cuda
    if [ -x "$work/concat-before" ]; then
        local round filter=${CONCAT_FILTER:-CubeBackend.*/ours: (concat|split, dim 1)}
        for ((round = 1; round <= ${CONCAT_ROUNDS:-3}; round++)); do
            step "bench-concat-before-$round" "$bench_limit" ./concat-before --bench "$filter"
            step "bench-concat-after-$round" "$bench_limit" ./concat --bench "$filter"
        done
        return
    fi
    step bench-concat "$bench_limit" ./concat --bench
    step bench-concat-torch "$bench_limit" python3 "$(pwd)/benches/torch_concat.py"
}

# The three-model train-step bench and its PyTorch companion.
mode_models() {
    step bench-models-torch "$bench_limit" python3 "$(pwd)/benches/torch_models.py" \
        "$logs/torch_models.csv"
    # shellcheck disable=SC2086 # MODELS_ARGS is a list of names
    TRAIN_STEP_CSV="$logs/train_step.csv" TRAIN_STEP_SVG="$logs/train_step.svg" \
        TORCH_CSV="$logs/torch_models.csv" \
        step bench-models "$bench_limit" ./train_step ${MODELS_ARGS:-}
}

mode_multi() {
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
}

mode_strategies() {
    # DataParallel (own loop and Learner) against burn-train's MultiDevice, one model and
    # global batch at a time (STRATEGIES_ARGS: models; STRATEGIES_* as in the bench).
    # shellcheck disable=SC2086 # STRATEGIES_ARGS is a list of names
    STRATEGIES_CSV="$logs/strategies.csv" \
        step bench-strategies "$bench_limit" ./strategies ${STRATEGIES_ARGS:-}
    # Speed-up over the bare Learner per strategy, from that run's rows.
    [ ! -f "$logs/strategies.csv" ] || step chart-strategies 30 ./train_step \
        plot-speedup-global "$logs/strategies.svg" "$logs/strategies.csv"
}

mode_overlap() {
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
}

mode_threads() {
    # Threads that share only the GPU, each launching a small model's kernels: one GPU
    # for all (CubeCL runs a device's launches on one server thread), and with several
    # GPUs one each.
    local backend
    for backend in cube fusion; do
        step "bench-threads-$backend" 150 ./autodiff_threads 2 "$backend"
        [ "$gpus" -lt 2 ] ||
            step "bench-threads-$backend-distinct" 150 ./autodiff_threads 2 "$backend" distinct
    done
}

# The README example on four replicas and the step-time bench.
mode_bench() {
    [ -n "${SKIP_EXAMPLE:-}" ] || step example-4-replicas "$bench_limit" ./learner_cnn 4
    # shellcheck disable=SC2086 # BENCH_ARGS is a list of backend names
    [ -n "${SKIP_STEP_TIME:-}" ] || step step-time "$bench_limit" ./step_time ${BENCH_ARGS:-}
}

mode_usage() {
    # What a user runs first: the examples and the README's CUDA program on USAGE_DEVICES
    # (cuda:0,cuda:0 by default: one GPU listed twice), then the exact path's cost
    # (EXACT_PATH_ARGS: the models, mlp resnet18 by default).
    local devices=${USAGE_DEVICES:-cuda:0,cuda:0}
    step example-train-mlp "$bench_limit" ./train_mlp --devices "$devices"
    step example-learner-cnn "$bench_limit" ./learner_cnn --devices "$devices"
    # shellcheck disable=SC2046 # one argument per GPU index
    step readme-cuda "$bench_limit" ./readme_cuda $(tr ',' ' ' <<<"${devices//cuda:/}")
    # shellcheck disable=SC2086 # EXACT_PATH_ARGS is a list of models
    step bench-exact-path "$bench_limit" ./exact_path ${EXACT_PATH_ARGS:-}
}

