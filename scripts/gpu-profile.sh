#!/usr/bin/env bash
# Kernel profile of bare training steps, Burn (CubeCL's profiling logger) beside PyTorch
# (torch.profiler), on the GPU machine, from the repository root, with the bundle of
# `scripts/gpu-check.sh build`:
#
#   scripts/gpu-profile.sh LOG_DIR [BACKEND MODEL BATCH]     # default: fusion mlp 1024
#
# Writes LOG_DIR/burn-profile.log (CubeCL's per-step kernel summaries; the last one is printed)
# and LOG_DIR/torch-profile.log. PROFILE_LIMIT bounds the Burn run in seconds (default 240).
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(realpath "${1:?usage: gpu-profile.sh LOG_DIR [BACKEND MODEL BATCH]}")
backend=${2:-fusion} model=${3:-mlp} batch=${4:-1024}
mkdir -p "$logs"
dir=gpu-bundle/profile
rm -rf "$dir"
mkdir -p "$dir"
xz -dc gpu-bundle/train_step.xz >"$dir/train_step"
chmod +x "$dir/train_step"
cat gpu-bundle/cubecl.toml - >"$dir/cubecl.toml" <<TOML

[profiling.logger]
level = "basic"
file = "$logs/burn-profile.log"
append = false
TOML
python3 benches/torch_models.py --profile "$model" "$batch" >"$logs/torch-profile.log" 2>&1 || true
(cd "$dir" && timeout -k 10 "${PROFILE_LIMIT:-240}" ./train_step cold "$backend" "$model" 0 "$batch") \
    >"$logs/burn-run.log" 2>&1 || echo "burn run failed or timed out: $?"
cat "$logs/burn-run.log" | grep '^cold' || true
# The last summary CubeCL wrote (one per synchronisation).
python3 - "$logs/burn-profile.log" <<'PY' | tee "$logs/burn-last-summary.log"
import sys
text = open(sys.argv[1], errors="replace").read()
parts = [p for p in text.split("\n\n") if p.strip()]
print("\n\n".join(parts[-3:])[-6000:])
PY
head -30 "$logs/torch-profile.log"
