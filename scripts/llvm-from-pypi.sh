#!/usr/bin/env bash
# Supplies the LLVM 23.1 that Burn 0.22's CUDA backend links (cubecl-llvm, through
# tracel-llvm-bundler 23.1.0-4), from PyPI instead of the bundler's download, for machines that
# reach PyPI but not that download. The bundler skips its download when its install folder holds the
# marker file `.tracel-llvm-installed`; PyPI's `mlc-llvm-static` wheels are a static LLVM
# 23.1.1 (NVPTX included) with headers and a `bin/llvm-config`.
#
#   scripts/llvm-from-pypi.sh [PREFIX]     # default PREFIX: ~/.cache/llvm-23-pypi
#
# Then build as usual (`CUDARC_CUDA_VERSION=13000 cargo build --release ...`). Verified
# 2026-12-05: Burn 0.22.1 `cuda` + `autodiff` built with it, ran on an H100 (kernels compiled
# by LLVM at run time need the CUDA toolkit's nvvm/libdevice/libdevice.10.bc there, which the
# GPU machine has under /usr/local/cuda).
set -euo pipefail
version=23.1.1.post0
prefix=${1:-$HOME/.cache/llvm-23-pypi}
data=${XDG_DATA_HOME:-$HOME/.local/share}
target="$data/tracel/tracel-llvm-23.1.0-4"
if [ -e "$target/.tracel-llvm-installed" ] && [ -x "$target/bin/llvm-config" ]; then
  echo "LLVM already in place: $target"; exit 0
fi
wheels=$(mktemp -d)
python3 -m pip download --quiet --no-deps -d "$wheels" \
  "mlc-llvm-static==$version" "mlc-llvm-static-extra-targets==$version"
mkdir -p "$prefix"
for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$prefix"; done
rm -rf "$wheels"
sdk="$prefix/mlc_llvm_static/static"
chmod +x "$sdk"/bin/llvm-config*
touch "$sdk/.tracel-llvm-installed"
mkdir -p "$data/tracel"
rm -rf "$target"
ln -s "$sdk" "$target"
echo "LLVM $("$target/bin/llvm-config" --version) in place: $target -> $sdk"
