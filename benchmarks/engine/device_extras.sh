#!/usr/bin/env bash
# Optional packages for the GPU machine that ../shared/device/prepare.sh does not ship, pinned and hash-checked.
#
#   cuda-tile 1.3.0        flashinfer 0.6.13's `flashinfer.comm` imports its cuTile kernels unconditionally; without
#                          this wheel the import fails and vLLM skips its all-reduce + RMSNorm fusion pass
#                          ("Flashinfer is not installed or comm module not found").
#   humming-kernels 0.1.10 vLLM 0.25.1's `moe_backend="humming"` (the version vLLM pins), a JIT (nvcc) GEMM library
#   pyelftools 0.33        needed by humming's JIT loader (the GPU image lacks it)
#
# Usage
#   bash benchmarks/engine/device_extras.sh download [DIR]        here (needs the package index): wheels into DIR (.stage/extra)
#   bash benchmarks/engine/device_extras.sh install [DIR] [TARGET] on the GPU machine, after install-on-device.sh install:
#                                                          --no-deps into TARGET (/root/site), then import checks
# Carry DIR with the run that installs (it is ~0.6 MiB). Nothing here touches the image's own site-packages.
set -euo pipefail
cmd=${1:-}; dir=${2:-.stage/extra}; target=${3:-/root/site}
WHEELS=(
  "cuda_tile-1.3.0-cp312-cp312-manylinux2014_x86_64.whl e4865acbff1172aaee304bf9c550586088d8b4545a384423597a590899386709"
  "humming_kernels-0.1.10-py3-none-any.whl 4ded0998ff085afeddde70baf93f97c2929969ec3d4a63a52cfec5072bc972b4"
  "pyelftools-0.33-py3-none-any.whl f215ad5f47d3f1373a21496a6c9e0707c622840d0622f23ff7ce08678b020036"
)
check() {   # every pinned wheel present with its sha256
  for w in "${WHEELS[@]}"; do
    set -- $w
    [[ -f "$dir/$1" ]] || { echo "device_extras: $dir/$1 is missing (run: $0 download $dir)" >&2; exit 1; }
    echo "$2  $dir/$1" | sha256sum -c --quiet - || { echo "device_extras: $dir/$1: sha256 mismatch" >&2; exit 1; }
  done
}
case "$cmd" in
  download)
    mkdir -p "$dir"
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
      -d "$dir" cuda-tile==1.3.0 humming-kernels==0.1.10 pyelftools==0.33
    check; echo "device_extras: ${#WHEELS[@]} wheels in $dir";;
  install)
    check
    python3 -m pip install -q --no-deps --no-index --target "$target" "$dir"/*.whl
    PYTHONPATH="$target:${PYTHONPATH:-}" python3 - <<'EOF'
import importlib, traceback
for mod in ("cuda.tile", "flashinfer.comm", "humming"):
    try: importlib.import_module(mod); print(f"device_extras: import {mod}: ok")
    except Exception as e: print(f"device_extras: import {mod}: FAILED {type(e).__name__}: {e}")
EOF
    ;;
  *) echo "usage: $0 download [DIR] | install [DIR] [TARGET]" >&2; exit 2;;
esac
