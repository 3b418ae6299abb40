# The `cold` mode of scripts/gpu-check.sh (time to first step), sourced by it.

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
