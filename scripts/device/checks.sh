#!/usr/bin/env bash
# checks.sh - the GPU checks the open issues ask for, as named jobs, run ON the GPU machine from the checkout's root
# after install-on-device.sh has installed vLLM (same or earlier call on the warm machine).
#
#   bash scripts/device/checks.sh JOB [JOB...]
#
# JOBs (each writes into $OUT/JOB/ and prints one line `== JOB: exit N in S s`):
#   old-rank, old-parity   the rank-config decode benchmark / the GPU parity run (benchmarks.engine.compare run) on the
#                 pre-rebuild tree staged in .stage/old (`python -m benchmarks.engine.compare stage --commit bfd3b63
#                 --dest .stage/old`, carried); into $OUT/compare-old/
#   new-rank, new-parity   the same on this tree; into $OUT/compare-new/
#   prefix        prefix caching on the tiny checkpoint, eager and CUDA graphs (scripts/gpu_serving_checks.py prefix)
#   kv            FP8 KV pools of one TP2 rank against the budget (scripts/gpu_serving_checks.py kv)
#   dynamo        FP8 KV parity, the pool and the served reasoning budget (python -m benchmarks.engine.dynamo_checks)
#   parity        the GPU parity run on the tiny checkpoints (NVFP4 and BF16, eager and graphs)
#
# Environment: SITE (default /root/site, where install-on-device.sh put vLLM), DEADLINE_S (each job's own deadline,
# default 400). The Triton autotuning cache is kept between jobs on the same machine (TRITON_CACHE_AUTOTUNING=1).
set -uo pipefail
SITE=${SITE:-/root/site}
DEADLINE_S=${DEADLINE_S:-400}
OUT=${OUT:?set OUT (the device run sets it)}
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TRITON_CACHE_AUTOTUNING=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_USE_FLASHINFER_SAMPLER=0

job() {
  local name=$1; shift
  local t0=$SECONDS
  mkdir -p "$OUT/$name"
  echo "== $name: $*"
  "$@" > "$OUT/$name/driver.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name/driver.log"
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
}

for j in "$@"; do
  case $j in
    old-rank|old-parity|new-rank|new-parity)
      tree=.; [ "${j%%-*}" = old ] && tree=.stage/old
      job "$j" python3 -m benchmarks.engine.compare run --tree "$tree" --what "${j#*-}" --out "$OUT/compare-${j%%-*}" \
        --deadline-s "$DEADLINE_S" ;;
    prefix) job "$j" python3 scripts/gpu_serving_checks.py prefix --modes eager graphs --tokens 32 --out "$OUT/$j" --deadline-s "$DEADLINE_S" ;;
    kv) job "$j" python3 scripts/gpu_serving_checks.py kv --out "$OUT/$j" --deadline-s "$DEADLINE_S" ;;
    dynamo) job "$j" python3 -m benchmarks.engine.dynamo_checks --out "$OUT/$j" --deadline-s "$DEADLINE_S" ;;
    parity) job "$j" python3 -m benchmarks.engine.parity --cases compressed-tensors:eager:bfloat16 compressed-tensors:graphs:bfloat16 \
              bf16:eager:bfloat16 bf16:graphs:bfloat16 --out "$OUT/$j" --name "gpu_parity_vllm_$(python3 -c 'import vllm; print(vllm.__version__)')" \
              --deadline-s "$DEADLINE_S" ;;
    *) echo "checks.sh: unknown job '$j' (old-rank old-parity new-rank new-parity prefix kv dynamo parity)" >&2; exit 2 ;;
  esac
done
