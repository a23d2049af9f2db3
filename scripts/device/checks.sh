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
#   parity        the GPU parity run on the tiny checkpoints (NVFP4 and BF16, eager and graphs; with TOGETHER=1 the eager
#                 and the graphs engines at once, into $OUT/parity-eager/ and $OUT/parity-graphs/); PARITY_ARGS: more
#                 options (e.g. "--weights /root/best/best.safetensors"; "--traps": the eager engines also answer the
#                 behaviour tasks with each negative control planted, chapter train's margins)
#   spec-rank     the verify step's cost at one TP2 rank of the real model (timed: never TOGETHER): decode at 2K with a
#                 random EAGLE-3 head proposing K tokens (every draft rejected, so each step verifies 1 + K tokens), one
#                 engine per K of SPEC_KS (default "0 1 3"; 0: no speculation), full graphs (--spec-full-graphs), as an A/B of
#                 benchmarks.engine.perf into $OUT/spec-rank/ (about 150 s an engine on a warm machine: split the Ks over calls;
#                 SPEC_RANK_METHOD=ngram: vLLM's GPU ngram proposer padded to K instead of the head (no draft model in memory,
#                 so it fits an H100 beside the rank's weights, and the step holds no drafting model's time;
#                 SPEC_RANK_SPEC_ARGS: more perf options for those K > 0 engines only, e.g. "--spec-skip-draft-sync");
#                 then benchmarks.engine.verify_sweep: verify_sweep.json and .png, each K against k0 and its floor in bytes;
#                 give every 1 + K a CUDA graph size, e.g. "--capture-sizes 1,2,3,4,6,8" for SPEC_KS="0 1 2 3 5 7";
#                 SPEC_RANK_ARGS: more perf options; on an H100, whose 79.6 GiB leave 8 GiB beside the rank's 71.6 GiB of
#                 weights: "--kv-cache-memory-bytes 2G --max-model-len 8192 --max-num-seqs 2 --batch-sizes 2
#                 --max-num-batched-tokens 2048 --capture-sizes 1,2,4,8", and the ceilings are then the H100's (perf reads the GPU's name))
#   spec-e2e      end-to-end ngram decode at one TP2 rank of the real model (timed: never TOGETHER): one stream at 2K
#                 (a prompt of one 64-token block repeated, --prompt-period 64), 256 greedy tokens, vLLM's stats on in every
#                 variant (--log-stats: the ngram ones need them for their counters), without speculation,
#                 with ngram k = 3 under the plugin's piecewise guard and with full graphs (--spec-full-graphs), as an A/B
#                 of benchmarks.engine.perf into $OUT/spec-e2e/: tok/s, acceptance, mean accepted length (about 150 s an engine;
#                 SPEC_E2E_ARGS: more perf options; SPEC_E2E_VARIANTS: which ngram engines follow the baseline (default
#                 "ngram_pad ngram_gpu_pad"; of ngram: piecewise guard, ngram_full: full graphs, ngram_pad: full graphs with
#                 drafts padded to K (option spec_pad_drafts), ngram_gpu_pad: the same with vLLM's GPU proposer, which
#                 keeps asynchronous scheduling, ngram_gpu_pad_unfused: that with the option kda_verify_kernel off,
#                 ngram_gpu_pad_nosync: that with the option spec_skip_draft_sync on); SPEC_E2E_DRAFT_KS="3": also spec-rank's random EAGLE-3 head of K tokens per K, every
#                 draft rejected, so that one job and one baseline give the verify step's cost too)
#   spec-profile  the speculative step at one TP2 rank of the real model, torch-profiled (timed: never TOGETHER): ngram
#                 k = SPEC_E2E_K (default 3) with vLLM's GPU proposer, drafts padded, full graphs, one stream at 2K (the
#                 spec-e2e prompt), 64 tokens, 8 steps profiled by kernel family with the trace kept, into
#                 $OUT/spec-profile/ (SPEC_PROFILE_ARGS: more perf options, e.g. the H100's of spec-rank)
#   slice         the GPU parity run on a real-shapes slice (the real model's first 2 layers, drawn on the GPU: 9.1 GB),
#                 NVFP4 eager and graphs, prompts up to 4K tokens, every kernel the plugin gives the model must launch
#                 (benchmarks.engine.parity --slice 2; timed nothing: may run TOGETHER with the tiny-checkpoint jobs; PARITY_ARGS
#                 as for parity, e.g. "--moe-backend emulation" for the plugin's MoE kernels, which vLLM's default backend skips,
#                 and "--slice-rank" for a slice of one TP2 rank, whose shapes the GEMV pairs' table names)
#   tail          the float32 tail at long prompts: the BF16 tiny checkpoint in float32, eager, prompts of 700 and 4,096
#                 tokens (benchmarks.engine.parity --long --cases bf16:eager:float32; PARITY_ARGS as for parity), twice:
#                 Triton's fp32 dots in TF32 (TRITON_F32_DEFAULT=tf32: the control, which fails the fp32 limits) and with
#                 the variable empty, so that the plugin's fp32_ieee_dots sets IEEE fp32 (the report's
#                 triton_f32_default says what the engine ran with), into $OUT/tail-tf32/ and $OUT/tail-plugin/ (the two
#                 at once when TOGETHER=1); TAIL_HALVES (default "tf32 plugin") picks the halves, e.g. "plugin" alone
#   moe-batch     one MoE layer's routed experts at the rank shapes, 1 to 8,192 tokens (benchmarks.kernels.moe_batch, issue
#                 28): vLLM's Marlin, vLLM's emulation kernel as the plugin launches it and with explicit tiles, the plugin's
#                 decode kernels, each checked against fp32 first (timed: never TOGETHER; fits an H100; MOE_BATCH_ARGS: more)
#   moe-rank      issue 28's table at one TP2 rank of the real model (timed: never TOGETHER; needs an H200): single-stream
#                 decode at 2K, batch decode at 8, 32 and 64 streams, prefill at 8K, CUDA graphs, three engines in one job
#                 (benchmarks.engine.perf --phase ab): no MoE flag (today Marlin alone), Marlin with the plugin's decode
#                 kernels over its copy (--moe-marlin-kernels) and the emulation backend (--moe-backend emulation), into
#                 $OUT/moe-rank/ (MOE_RANK_ARGS: more perf options; about 150 s an engine on a warm machine)
#   prefill-profile  issue 33: one TP2 rank of the real model (needs an H200), CUDA graphs, prefill at 8K and 32K timed
#                 and each profiled once (benchmarks.engine.perf --profile-prefill: time by kernel family against the
#                 compute ceiling, prefill_profiles in the JSON), into $OUT/prefill-profile/ (PREFILL_PROFILE_ARGS: more)
#   moe-profile   Nsight Compute on the raw-layout and the Marlin-layout decode kernels at 1 and 8 tokens (issue 28;
#                 benchmarks.kernels.moe_profile: ncu --set full, each path checked against fp32 first; about a minute; never
#                 TOGETHER; MOE_PROFILE_ARGS: more, e.g. "--tokens 1,2,4,8")
#   kda-verify    one KDA layer's speculative verify step at the rank shapes (benchmarks.kernels.kda_verify, issue 27): the
#                 verify kernel and the op body's unfused path (vLLM's conv-update and FLA recurrent kernels, o_norm), 1 to 8
#                 requests of 1 + 1, 3, 7 tokens, the split forms (each head's value rows over 2, 4, 8 programs, then a
#                 finishing launch) and the one-token decode kernel, each checked first (DEADLINE_S for the timings after
#                 the checks, whose compiles took 120 s on an H100; timed: never TOGETHER; KDA_VERIFY_ARGS:
#                 more, e.g. "--requests 1,4 --drafts 3" when the call is short)
#   spec          speculative decoding on the tiny checkpoints (benchmarks.engine.spec): ngram k = 1, 3, 5 and a random
#                 EAGLE-3 head of the published draft's shape against the non-speculative run, NVFP4 and BF16, eager
#                 and graphs, four engines at a time (SPEC_ARGS: more options, e.g. "--weights /root/best/best.safetensors")
#
# Environment: SITE (default /root/site, where install-on-device.sh put vLLM), DEADLINE_S (each job's own deadline,
# default 400). The Triton autotuning cache is kept between jobs on the same machine (TRITON_CACHE_AUTOTUNING=1).
# Triton's autotuning results also travel between machines: at the end checks.sh copies every `*.autotune.json` of
# its cache (TRITON_CACHE_DIR, default /root/triton-cache) and of the plugin's own (VLLM_CACHE_ROOT/solar_open2/triton,
# where the KDA warm-up tunes vLLM's FLA kernels) into $OUT/triton-autotune/GPU/ (GPU: the card's name, e.g.
# NVIDIA_H100_80GB_HBM3; a few hundred kB). Keep that folder here as .stage-autotune/GPU/ and carry
# ".stage-autotune" into the next call: checks.sh seeds both caches from the folder of this machine's card before the
# jobs (AUTOTUNE_SEED, default .stage-autotune), so the fresh machine's engines skip the 120-200 s of cold autotuning
# (Triton's key holds its own version, the backend's target, the kernel's source and the configs, so a stale file is
# never used; only the card's own folder is seeded, so an H200 never runs an H100's picks).
# At the start checks.sh stops GPU processes an earlier call left behind (a `timeout` that killed this script leaves
# its engines running, holding the GPU's memory, and the next engines then fail to start).
# TOGETHER=1 runs the jobs at the same time on the one GPU (device time is short; none of these jobs times anything):
# the tiny-checkpoint engines then get a fixed 2 GiB KV pool (vLLM skips its memory profiling, which the other
# processes' allocations would upset) and demand 8 % of the GPU free at start-up; the kv job's rank engines (71.6 GiB
# of weights + a pool of at most 26 GiB) demand 74 %. The rank decode benchmarks (*-rank) time steps: never TOGETHER.
set -uo pipefail
SITE=${SITE:-/root/site}
DEADLINE_S=${DEADLINE_S:-400}
OUT=${OUT:?set OUT (the device run sets it)}
mkdir -p "$OUT"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TRITON_CACHE_AUTOTUNING=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_USE_FLASHINFER_SAMPLER=0

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr -c 'A-Za-z0-9_.\n-' '_')
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/root/triton-cache}
# the plugin's KDA warm-up tunes vLLM's FLA kernels in a cache of its own (solar_open2.vllm.kda.stable_triton_cache)
PLUGIN_TRITON=${VLLM_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm}/solar_open2/triton
SEED=${AUTOTUNE_SEED:-.stage-autotune}/$GPU_NAME
if [ -n "$GPU_NAME" ] && [ -d "$SEED" ]; then                          # results are found by hash folder: both caches get all
  for d in "$TRITON_CACHE_DIR" "$PLUGIN_TRITON"; do mkdir -p "$d" && cp -rn "$SEED"/. "$d"/; done
  echo "checks.sh: seeded Triton's caches with $(find "$SEED" -name '*.autotune.json' | wc -l) autotuning results from $SEED"
fi
collect_autotune() {                                                  # every tuning result, by hash folder, for the next machine
  [ -n "$GPU_NAME" ] || return 0
  local dest="$OUT/triton-autotune/$GPU_NAME" d
  for d in "$TRITON_CACHE_DIR" "$PLUGIN_TRITON"; do
    [ -d "$d" ] || continue
    (cd "$d" && find . -name '*.autotune.json' -print0 | while IFS= read -r -d '' f; do
       mkdir -p "$dest/$(dirname "$f")" && cp "$f" "$dest/$f"; done)
  done
  echo "checks.sh: $(find "$dest" -name '*.autotune.json' 2>/dev/null | wc -l) autotuning results in $dest (keep as .stage-autotune/$GPU_NAME)"
}
CHILD=
on_term() {                                                           # `timeout` or a Ctrl-C: no engine outlives the call
  echo "checks.sh: stopped by a signal; stopping the running job and its engines"
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2> /dev/null; sleep 2
  [ -n "$CHILD" ] && kill -9 "$CHILD" 2> /dev/null; pkill -9 -f '^VLLM::'
  collect_autotune; exit 143
}
trap on_term TERM INT
stale=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -dc '0-9\n' | tr '\n' ' ')
if [ -n "${stale// /}" ] || pgrep -f '^VLLM::' > /dev/null; then
  echo "checks.sh: stopping GPU processes an earlier call left running (pids: ${stale:-none listed} $(pgrep -f '^VLLM::' | tr '\n' ' '))"
  [ -n "${stale// /}" ] && kill -9 $stale 2> /dev/null; pkill -9 -f '^VLLM::'; sleep 5
fi

TOGETHER=${TOGETHER:-0}
TINY_MEM=(); KV_MEM=(); DYN_MEM=()
if [ "$TOGETHER" = 1 ]; then
  TINY_MEM=(--gpu-memory-utilization 0.08 --kv-cache-memory-bytes 2147483648); KV_MEM=(--gpu-memory-utilization 0.74)
  DYN_MEM=(--gpu-memory-utilization 0.08)                              # its engines have a fixed pool already
  for j in "$@"; do case $j in *-rank|spec-e2e|spec-profile|moe-batch|moe-profile|prefill-profile|kda-verify) echo "checks.sh: $j times or profiles kernels; run it alone, not with TOGETHER=1" >&2; exit 2 ;; esac; done
fi

draft_ab() { printf '%s=--draft-head %s --spec-full-graphs' "$1" "$2"; }   # a random EAGLE-3 head of K tokens, full graphs

job() {
  local name=$1; shift
  local t0=$SECONDS
  mkdir -p "$OUT/$name"
  echo "== $name: $*"
  "$@" > "$OUT/$name/driver.log" 2>&1 &                               # in the background: a signal reaches on_term at once
  CHILD=$!; wait "$CHILD"
  local rc=$?; CHILD=
  tail -n 25 "$OUT/$name/driver.log"
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
}

run_one() {
  local j=$1
  case $j in
    old-rank|old-parity|new-rank|new-parity)
      tree=.; [ "${j%%-*}" = old ] && tree=.stage/old
      job "$j" python3 -m benchmarks.engine.compare run --tree "$tree" --what "${j#*-}" --out "$OUT/compare-${j%%-*}" \
        --deadline-s "$DEADLINE_S" ;;
    prefix) job "$j" python3 scripts/gpu_serving_checks.py prefix --modes eager graphs --tokens 32 --out "$OUT/$j" --deadline-s "$DEADLINE_S" \
              "${TINY_MEM[@]}" ;;
    kv) job "$j" python3 scripts/gpu_serving_checks.py kv --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${KV_MEM[@]}" ;;
    dynamo) job "$j" python3 -m benchmarks.engine.dynamo_checks --out "$OUT/$j" --deadline-s "$DEADLINE_S" \
              "${DYN_MEM[@]}" ;;
    parity) read -r -a PARITY_EXTRA <<< "${PARITY_ARGS:-}"
            v=$(python3 -c 'import vllm; print(vllm.__version__)')
            groups=("eager graphs"); [ "$TOGETHER" = 1 ] && groups=(eager graphs)  # TOGETHER: the two modes at once, a report each
            for g in "${groups[@]}"; do
              cases=(); for m in $g; do cases+=(compressed-tensors:$m:bfloat16); done
              for m in $g; do cases+=(bf16:$m:bfloat16); done
              sfx=; [ ${#groups[@]} = 2 ] && sfx=-$g
              job "$j$sfx" python3 -m benchmarks.engine.parity --cases "${cases[@]}" --out "$OUT/$j$sfx" \
                --name "gpu_parity_vllm_$v${sfx/-/_}" --deadline-s "$DEADLINE_S" "${TINY_MEM[@]}" "${PARITY_EXTRA[@]}" &
              [ "$TOGETHER" = 1 ] || wait
            done; wait ;;
    tail) read -r -a PARITY_EXTRA <<< "${PARITY_ARGS:-}"                 # Triton's fp32 dots in TF32, then as the plugin sets them
          for prec in ${TAIL_HALVES:-tf32 plugin}; do                    # TOGETHER=1: both at once
            case $prec in tf32|plugin) ;; *) echo "checks.sh tail: TAIL_HALVES takes tf32 and plugin, got '$prec'" >&2; continue ;; esac
            f32=$prec; [ "$prec" = plugin ] && f32=                      # unset: the plugin's fp32_ieee_dots decides (IEEE)
            TRITON_F32_DEFAULT=$f32 job "$j-$prec" python3 -m benchmarks.engine.parity --long --cases bf16:eager:float32 \
              --out "$OUT/$j-$prec" --name "gpu_parity_tail_${prec}_vllm_$(python3 -c 'import vllm; print(vllm.__version__)')" \
              --deadline-s "$DEADLINE_S" "${TINY_MEM[@]}" "${PARITY_EXTRA[@]}" &
            [ "$TOGETHER" = 1 ] || wait
          done; wait ;;
    slice) read -r -a PARITY_EXTRA <<< "${PARITY_ARGS:-}"               # e.g. "--moe-backend emulation": the MoE kernels too
           job "$j" python3 -m benchmarks.engine.parity --slice 2 --out "$OUT/$j" \
             --name "gpu_parity_slice_vllm_$(python3 -c 'import vllm; print(vllm.__version__)')" --deadline-s "$DEADLINE_S" \
             --gpu-memory-utilization "${SLICE_GPU_UTIL:-0.5}" "${PARITY_EXTRA[@]}" ;;
    spec-rank) read -r -a SR_EXTRA <<< "${SPEC_RANK_ARGS:-}"
      ab=(); for k in ${SPEC_KS:-0 1 3}; do
        if [ "$k" = 0 ]; then ab+=(--ab "k0=")
        elif [ "${SPEC_RANK_METHOD:-draft}" = ngram ]; then ab+=(--ab "k$k=--ngram $k --ngram-gpu --spec-full-graphs --spec-pad-drafts${SPEC_RANK_SPEC_ARGS:+ $SPEC_RANK_SPEC_ARGS}")
        else ab+=(--ab "$(draft_ab "k$k" "$k")"); fi
      done
      job "$j" python3 -m benchmarks.engine.perf --config rank --phase ab --only decode --decode-contexts 2048 \
        --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${SR_EXTRA[@]}" "${ab[@]}"
      job "$j-sweep" python3 -m benchmarks.engine.verify_sweep "$OUT/$j/perf_h200_rank_ab.json" --out "$OUT/$j" ;;
    moe-batch) read -r -a MB_EXTRA <<< "${MOE_BATCH_ARGS:-}"
      job "$j" python3 -m benchmarks.kernels.moe_batch --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${MB_EXTRA[@]}" ;;
    moe-rank) read -r -a MR_EXTRA <<< "${MOE_RANK_ARGS:-}"
      job "$j" python3 -m benchmarks.engine.perf --config rank --phase ab --only decode,batch,prefill --decode-contexts 2048 \
        --batch-sizes 8,32,64 --prefill-contexts 8192 --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${MR_EXTRA[@]}" \
        --ab "default=" --ab "marlin_decode=--moe-marlin-kernels" --ab "emulation=--moe-backend emulation" ;;
    spec-e2e) read -r -a SE_EXTRA <<< "${SPEC_E2E_ARGS:-}"
      K=${SPEC_E2E_K:-3}; vs=(--ab "base=")
      for v in ${SPEC_E2E_VARIANTS:-ngram_pad ngram_gpu_pad}; do case $v in
        ngram) vs+=(--ab "ngram$K=--ngram $K") ;;
        ngram_full) vs+=(--ab "ngram${K}_full=--ngram $K --spec-full-graphs") ;;
        ngram_pad) vs+=(--ab "ngram${K}_pad=--ngram $K --spec-full-graphs --spec-pad-drafts") ;;
        ngram_gpu_pad) vs+=(--ab "ngram${K}_gpu_pad=--ngram $K --ngram-gpu --spec-full-graphs --spec-pad-drafts") ;;
        ngram_gpu_pad_unfused) vs+=(--ab "ngram${K}_gpu_pad_unfused=--ngram $K --ngram-gpu --spec-full-graphs --spec-pad-drafts --no-kda-verify-kernel") ;;
        ngram_gpu_pad_nosync) vs+=(--ab "ngram${K}_gpu_pad_nosync=--ngram $K --ngram-gpu --spec-full-graphs --spec-pad-drafts --spec-skip-draft-sync") ;;
        *) echo "checks.sh: SPEC_E2E_VARIANTS takes ngram, ngram_full, ngram_pad, ngram_gpu_pad, ngram_gpu_pad_unfused and ngram_gpu_pad_nosync, got '$v'" >&2; return 2 ;;
      esac; done
      for k in ${SPEC_E2E_DRAFT_KS:-}; do vs+=(--ab "$(draft_ab "draft$k" "$k")"); done
      job "$j" python3 -m benchmarks.engine.perf --config rank --phase ab --only decode --decode-contexts 2048 \
        --decode-tokens 256 --prompt-period 64 --log-stats --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${SE_EXTRA[@]}" "${vs[@]}" ;;
    spec-profile) read -r -a SP_EXTRA <<< "${SPEC_PROFILE_ARGS:-}"
          K=${SPEC_E2E_K:-3}
          job "$j" python3 -m benchmarks.engine.perf --config rank --phase graphs --only decode,profile --profile \
            --decode-contexts 2048 --decode-tokens 64 --prompt-period 64 --ngram "$K" --ngram-gpu --spec-full-graphs \
            --spec-pad-drafts --keep-trace --variant "ngram${K}_gpu_pad_profile" --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${SP_EXTRA[@]}" ;;
    prefill-profile) read -r -a PP_EXTRA <<< "${PREFILL_PROFILE_ARGS:-}"
          job "$j" python3 -m benchmarks.engine.perf --config rank --phase graphs --only prefill,profile --prefill-contexts 8192,32768 \
            --profile-prefill --keep-trace --variant prefill_profile --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${PP_EXTRA[@]}" ;;
    kda-verify) read -r -a KV_EXTRA <<< "${KDA_VERIFY_ARGS:-}"
          job "$j" python3 -m benchmarks.kernels.kda_verify --out "$OUT/$j" --deadline-s "$DEADLINE_S" "${KV_EXTRA[@]}" ;;
    moe-profile) read -r -a PROF_EXTRA <<< "${MOE_PROFILE_ARGS:-}"
          job "$j" python3 -m benchmarks.kernels.moe_profile --out "$OUT/$j" "${PROF_EXTRA[@]}" ;;
    spec) read -r -a SPEC_EXTRA <<< "${SPEC_ARGS:-}"
          job "$j" python3 -m benchmarks.engine.spec --out "$OUT/$j" --name "gpu_spec_vllm_$(python3 -c 'import vllm; print(vllm.__version__)')" \
              --deadline-s "$DEADLINE_S" "${SPEC_EXTRA[@]}" ;;
  esac
}

JOBS=" old-rank old-parity new-rank new-parity prefix kv dynamo parity tail slice spec spec-rank spec-e2e spec-profile moe-batch moe-rank moe-profile prefill-profile kda-verify "
for j in "$@"; do
  [[ $JOBS == *" $j "* ]] || { echo "checks.sh: unknown job '$j' ($JOBS)" >&2; exit 2; }
done
if [ "$TOGETHER" = 1 ]; then
  for j in "$@"; do run_one "$j" > "$OUT/$j.summary" 2>&1 & done
  wait
  for j in "$@"; do cat "$OUT/$j.summary"; done
else
  for j in "$@"; do run_one "$j"; done
fi
collect_autotune
