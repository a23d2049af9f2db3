#!/usr/bin/env bash
# prepare.sh - build the staging parts that bring one vLLM release onto the GPU
# machine (no network there; its image has Python 3.12 and torch 2.11.0+cu130).
# Run HERE, on a developer machine that can reach the Python package index,
# from anywhere inside the git checkout whose tree the device calls send.
# Idempotent: downloads are skipped when already present and the bundle is
# rebuilt byte-for-byte identically.
#
#   bash scripts/device/prepare.sh [VERSION]     VERSION: 0.25.1 (default) or 0.26.0
#   bash scripts/device/prepare.sh fla           FLA's wheels (fla-core, einops) into .stage-fla/, for train_tiny.sh
#
# Both pin torch==2.11.0, the image's. 0.33.0 pins torch==2.14.0, which the
# image does not have and cannot download: it is refused.
#
# Output: .stage-VERSION/p1 .. pN (each <= 60 MiB) in the repository root, and
# /.stage-*/ appended to .git/info/exclude so that the parts travel only when a
# device call names them in `carry`.
#
# Environment knobs:
#   PART_MB=18        size of one part in MiB (the repository tree, 41 MiB on 2026-12-07 with the trained tiny weights
#                     and the kept traces, plus one part must stay under 64 MiB per run; the script says when they do not)
#   WITH_FLASHINFER=1 also ship flashinfer-python (JIT only: no cubin
#                     package, kernels are built with nvcc on first use;
#                     set 0 to leave FlashInfer out)
#   WITH_EXTRAS=1     also ship structured-output and OpenAI-server extras
#   PY=python3        the interpreter whose pip does the downloads
set -euo pipefail

PART_MB=${PART_MB:-18}
WITH_FLASHINFER=${WITH_FLASHINFER:-1}
WITH_EXTRAS=${WITH_EXTRAS:-1}
PY=${PY:-python3}
VLLM_VERSION=${1:-0.25.1}
if [ "$VLLM_VERSION" = fla ]; then   # FLA's KDA kernels (forward and backward) for training the tiny model there (06a_train)
  D="$(git rev-parse --show-toplevel)/.stage-fla"
  mkdir -p "$D"
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$D" "fla-core==${FLA_VERSION:-0.5.2}" "einops==${EINOPS_VERSION:-0.8.2}"
  ls -l "$D"
  echo "carry [\".stage-fla\"] and run scripts/device/train_tiny.sh with TRAIN_ARGS='--kda-kernel fla'"
  exit 0
fi
case "$VLLM_VERSION" in
  0.25.1) FLASHINFER_PIN=flashinfer-python==0.6.13 ;;
  0.26.0) FLASHINFER_PIN=flashinfer-python==0.6.14 ;;   # 0.26.0 pins 0.6.14 (and apache-tvm-ffi 0.1.10, shipped for both)
  0.33.0) echo "prepare.sh: vLLM 0.33.0 pins torch==2.14.0; the GPU image has torch 2.11.0 and no network, so it cannot run there" >&2; exit 2 ;;
  *) echo "prepare.sh: unsupported vLLM version '$VLLM_VERSION' (0.25.1 or 0.26.0)" >&2; exit 2 ;;
esac

ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
GITDIR=$(git rev-parse --git-common-dir)   # info/exclude is read from the common dir (worktrees too)
mkdir -p "$GITDIR/info"
grep -qxF '/.stage-*/' "$GITDIR/info/exclude" 2>/dev/null || echo '/.stage-*/' >> "$GITDIR/info/exclude"

STAGE=$ROOT/.stage-$VLLM_VERSION
DL=$STAGE/dl            # vLLM wheel + slim tarball (does not travel)
WHL=$STAGE/whl          # dependency wheels (travel inside the bundle)
mkdir -p "$DL" "$WHL"

# Target: the device image (Python 3.12, x86-64, glibc 2.3x).
PIPDL=(-m pip download --no-deps --only-binary=:all: --python-version 3.12
       --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
       --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
       --platform manylinux2014_x86_64 --platform manylinux1_x86_64
       --platform manylinux_2_31_x86_64 --platform any
       --disable-pip-version-check -q)

# Requirements of vllm 0.25.1 that the device image lacks (checked against the
# image's package list), pinned to the versions that ran there (2026-11-29).
# vllm 0.26.0 asks for the same ones (its METADATA differs only in flashinfer,
# cutlass-dsl, quack-kernels and tokenspeed-mla, of which only flashinfer is shipped).
# Left out on purpose (size, or features not needed for offline inference):
#   flashinfer-cubin (458 MB), nvidia-cutlass-dsl[cu13] (75 MB+; CuTe-DSL
#   kernels, mostly Blackwell), quack-kernels, tilelang, humming-kernels,
#   tokenspeed-mla, nvidia-cudnn-frontend, torchcodec, PyNvVideoCodec,
#   fastsafetensors, mistral_common, anthropic, mcp, opentelemetry-*.
CORE=(
  # imported by `import vllm` / the offline LLM path. Not shipped on purpose:
  # typing-extensions (the image has 4.16.0, which its anyio needs; an older
  # copy first on PYTHONPATH breaks `import fastapi`)
  pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0
  # the plugin's modules use fastcore's `@patch` (a declared requirement; pure Python, the image lacks it)
  fastcore==1.13.10
  typing-inspection==0.4.2
  msgspec==0.19.0 pyzmq==27.1.0 cbor2==5.7.1 cachetools==6.2.4
  fastapi==0.135.3 starlette==1.0.1
  # openai: vllm 0.25.1 imports openai.types.responses.NamespaceTool, which
  # 2.8.1 lacks; 3.x needs httpx2, which the image lacks
  openai==2.54.0 distro==1.9.0 jiter==0.12.0 sniffio==1.3.1
  openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 pybase64==1.4.2
  blake3==1.0.8 setproctitle==1.3.7 python-json-logger==4.0.0
  depyf==0.20.0 astor==0.8.1 dill==0.4.0 nvtx==0.2.15
  compressed-tensors==0.17.0 loguru==0.7.3
  # structured-output backends whose classes are built at import time.
  # xgrammar 0.2.6 needs apache-tvm-ffi>=0.1.10 (vllm pins 0.1.9; the only
  # xgrammar builds for 0.1.9 are 45-48 MB wheels); flashinfer accepts 0.1.10
  xgrammar==0.2.6 apache-tvm-ffi==0.1.10 llguidance==1.7.6
)
FLASHINFER=( "$FLASHINFER_PIN" )
EXTRAS=(
  # the other structured-output backends (outlines, lm-format-enforcer)
  outlines-core==0.2.14
  lm-format-enforcer==0.11.3 interegular==0.3.3 diskcache==5.6.3 lark==1.2.2
  # OpenAI-compatible server (`vllm serve`), not tried on the device
  uvicorn==0.38.0 watchfiles==1.1.1 prometheus-fastapi-instrumentator==8.0.0
  model-hosting-container-standards==0.1.16 jmespath==1.0.1 supervisor==4.3.0
  python-multipart==0.0.20 ijson==3.4.0
)
REQS=("${CORE[@]}")
[ "$WITH_FLASHINFER" = 1 ] && REQS+=("${FLASHINFER[@]}")
[ "$WITH_EXTRAS" = 1 ] && REQS+=("${EXTRAS[@]}")

echo "== downloading ${#REQS[@]} dependency wheels into $WHL"
# drop wheels that are not in the current list (keeps one version of each)
for f in "$WHL"/*.whl; do
  [ -e "$f" ] || continue
  n=$(basename "$f" | cut -d- -f1-2 | tr A-Z a-z)
  keep=0
  for r in "${REQS[@]}"; do
    rn=$(echo "${r%%==*}" | sed 's/[-_.]\+/_/g' | tr A-Z a-z); rv=${r##*==}
    [ "$n" = "${rn}-${rv}" ] && keep=1
  done
  [ $keep = 1 ] || { echo "   removing stale $(basename "$f")"; rm -f "$f"; }
done
$PY "${PIPDL[@]}" -d "$WHL" "${REQS[@]}" 2> >(grep -v '^WARNING: Location' >&2)
n_whl=$(ls "$WHL"/*.whl | wc -l)
[ "$n_whl" -eq "${#REQS[@]}" ] || { echo "expected ${#REQS[@]} wheels, have $n_whl" >&2; exit 1; }

VWHL=$DL/vllm-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl
if [ ! -s "$VWHL" ]; then
  echo "== downloading vllm==$VLLM_VERSION (about 250 MB)"
  $PY "${PIPDL[@]}" -d "$DL" vllm==$VLLM_VERSION 2> >(grep -v '^WARNING: Location' >&2)
fi

SLIM=$DL/vllm-$VLLM_VERSION-slim.tar.xz
if [ ! -s "$SLIM" ]; then
  echo "== building the slim vLLM tree (xz -9, takes a few minutes)"
  T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
  (cd "$T" && unzip -q "$VWHL")
  # Removed: the Ampere-only FlashAttention-2 library (H200 uses FA3), the
  # vendored DeepGEMM (JIT headers + .so, FP8 block GEMM only) and fmha_sm100
  # (Blackwell only), and the Rust HTTP front end binary vllm-rs.
  rm -rf "$T/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
         "$T/vllm/third_party/deep_gemm" "$T/vllm/third_party/fmha_sm100" \
         "$T/vllm/vllm-rs"
  (cd "$T" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
      -cf - vllm vllm-$VLLM_VERSION.dist-info) | xz -9 -T0 -c > "$SLIM.tmp"
  mv "$SLIM.tmp" "$SLIM"
  rm -rf "$T"; trap - EXIT
fi

TREE_MB=$(git ls-files -z | du -c --apparent-size -m --files0-from=- | tail -1 | cut -f1)   # what each device call copies
if [ $((TREE_MB + PART_MB)) -ge 64 ]; then
  echo "prepare.sh: the checkout's tracked files take ${TREE_MB} MiB; with ${PART_MB} MiB parts a device call would carry" \
       "$((TREE_MB + PART_MB)) MiB, over its 64 MiB: set PART_MB=$((63 - TREE_MB)) or less" >&2; exit 2
fi
echo "== bundling and splitting into ${PART_MB} MiB parts (the checkout: ${TREE_MB} MiB)"
BUNDLE=$DL/bundle.tar
T=$(mktemp -d)
mkdir -p "$T/bundle/whl"
cp "$WHL"/*.whl "$T/bundle/whl/"
cp "$SLIM" "$T/bundle/vllm-slim.tar.xz"
(cd "$T" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$BUNDLE" bundle)
rm -rf "$T"
rm -rf "$STAGE"/p[0-9]*
SPLIT=$DL/split; rm -rf "$SPLIT"; mkdir -p "$SPLIT"
split -b "${PART_MB}M" -d -a 2 "$BUNDLE" "$SPLIT/bundle.tar.part-"
SHA=$(sha256sum "$BUNDLE" | cut -d' ' -f1)
i=0
for f in "$SPLIT"/bundle.tar.part-*; do
  i=$((i+1))
  mkdir -p "$STAGE/p$i"
  mv "$f" "$STAGE/p$i/"
done
NP=$i
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for k in $(seq 1 $NP); do
  printf 'parts=%s\nsha256=%s\nbytes=%s\n' "$NP" "$SHA" "$(stat -c%s "$BUNDLE")" > "$STAGE/p$k/MANIFEST"
done
# The installer travels inside the staging area too: a checkout's ../shared does not reach the GPU machine.
mkdir -p "$STAGE/bin"
cp -f "$HERE/install-on-device.sh" "$STAGE/bin/install-on-device.sh"
for k in $(seq 1 $NP); do cp -f "$HERE/install-on-device.sh" "$STAGE/p$k/install-on-device.sh"; done
rm -rf "$SPLIT"
echo "bundle: $(du -m "$BUNDLE" | cut -f1) MiB, sha256 $SHA"
for k in $(seq 1 $NP); do echo "  .stage-$VLLM_VERSION/p$k  $(du -sm "$STAGE/p$k" | cut -f1) MiB"; done
echo "PARTS=$NP"
