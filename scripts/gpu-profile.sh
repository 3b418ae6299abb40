#!/usr/bin/env bash
# Kernel profile of bare training steps, Burn (CubeCL's profiling logger) beside PyTorch
# (torch.profiler), on the GPU machine, from the repository root, with the bundle of
# `scripts/gpu-check.sh build`:
#
#   scripts/gpu-profile.sh LOG_DIR [BACKEND MODEL BATCH]     # default: fusion mlp 1024
#   PROFILE_CONFIGS="fusion resnet18 64;fusion encoder 32" scripts/gpu-profile.sh LOG_DIR
#
# Writes, per configuration, LOG_DIR/burn-MODEL-BATCH.log (CubeCL's per-step kernel
# summaries; the last ones are printed) and LOG_DIR/torch-MODEL-BATCH.log. The CubeCL caches
# carried in gpu-cache/ (see gpu-check.sh) are used when present, so that the Burn run does
# not spend its time compiling and tuning. PROFILE_LIMIT bounds each Burn run in seconds
# (default 240).
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(realpath "${1:?usage: gpu-profile.sh LOG_DIR [BACKEND MODEL BATCH]}")
configs=${PROFILE_CONFIGS:-"${2:-fusion} ${3:-mlp} ${4:-1024}"}
mkdir -p "$logs"
dir=gpu-bundle/profile
rm -rf "$dir"
mkdir -p "$dir"
if compgen -G "gpu-cache/aa-cubecl-cache.tgz.*" >/dev/null; then
    cat gpu-cache/aa-cubecl-cache.tgz.* | tar xzf - -C "$dir"
fi
xz -dc gpu-bundle/train_step.xz >"$dir/train_step"
chmod +x "$dir/train_step"
IFS=';' read -ra list <<<"$configs"
for config in "${list[@]}"; do
    read -r backend model batch <<<"$config"
    name="$model-$batch"
    cat gpu-bundle/cubecl.toml - >"$dir/cubecl.toml" <<TOML

[profiling.logger]
level = "basic"
file = "$logs/burn-$name.log"
append = false
TOML
    python3 benches/torch_models.py --profile "$model" "$batch" >"$logs/torch-$name.log" 2>&1 ||
        true
    (cd "$dir" && timeout -k 10 "${PROFILE_LIMIT:-240}" ./train_step cold "$backend" "$model" 0 \
        "$batch") >"$logs/burn-run-$name.log" 2>&1 || echo "burn run failed or timed out: $?"
    echo "== $backend $model $batch"
    grep '^cold' "$logs/burn-run-$name.log" || true
    # The last summaries CubeCL wrote (one per synchronisation).
    python3 - "$logs/burn-$name.log" <<'PY' | tee "$logs/burn-last-summary-$name.log"
import sys
text = open(sys.argv[1], errors="replace").read()
parts = [p for p in text.split("\n\n") if p.strip()]
print("\n\n".join(parts[-2:])[-5000:])
PY
    head -30 "$logs/torch-$name.log"
done
