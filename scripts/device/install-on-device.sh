#!/usr/bin/env bash
# install-on-device.sh - runs ON the GPU machine, from the repository root
# of the tree a device call sends. Companion of prepare.sh (see README.md).
#
#   bash .stage-VERSION/pK/install-on-device.sh (or /root/stage/install-on-device.sh once collected) collect .stage-VERSION/pK
#       move one carried part into $STAGE_DIR (outside the repo; survives the
#       next call only while the machine stays warm, i.e. <= 30 s between calls)
#   bash .stage-VERSION/pK/install-on-device.sh (or /root/stage/install-on-device.sh once collected) install
#       check that every part is there, reassemble, verify the sha256, install
#       the wheels and the slim vLLM tree into $SITE, run `import vllm`, and
#       print the PYTHONPATH export line to use in the same or later calls
#   bash .stage-VERSION/pK/install-on-device.sh (or /root/stage/install-on-device.sh once collected) smoke [CASE...]
#       dummy-weight generation with tiny hybrid linear-attention models;
#       CASE is kimi-eager (default), kimi-graphs, qwen3next-eager or
#       qwen3next-graphs (KimiLinear: KDA + MLA + MoE; Qwen3-Next: Gated
#       DeltaNet + attention + MoE). Cases share SMOKE_DEADLINE_S; one log
#       per case goes to $OUT when it is set
#   bash .stage-VERSION/pK/install-on-device.sh (or /root/stage/install-on-device.sh once collected) status
#       what is staged / installed on this machine
#
# Environment: STAGE_DIR (default /root/stage), SITE (default /root/site),
#              PY (default python3), SMOKE_DEADLINE_S (default 560).
set -uo pipefail

STAGE_DIR=${STAGE_DIR:-/root/stage}
SITE=${SITE:-/root/site}
PY=${PY:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "[install-on-device $(date +%T)] $*"; }

cmd_collect() {
  local src=${1:?usage: collect .stage-VERSION/pK}
  [ -d "$src" ] || { log "ERROR: $src was not carried (name it in carry)"; return 1; }
  mkdir -p "$STAGE_DIR"
  local t0=$(date +%s%N)
  for f in "$src"/*; do
    case $(basename "$f") in
      MANIFEST) cp -f "$f" "$STAGE_DIR/MANIFEST" ;;
      install-on-device.sh) cp -f "$f" "$STAGE_DIR/install-on-device.sh" ;;
      *) mv -f "$f" "$STAGE_DIR/" ;;
    esac
  done
  log "collected $src in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  cmd_status
}

cmd_status() {
  if [ -f "$STAGE_DIR/MANIFEST" ]; then
    local want have
    want=$(sed -n 's/^parts=//p' "$STAGE_DIR/MANIFEST")
    have=$(ls "$STAGE_DIR"/bundle.tar.part-* 2>/dev/null | wc -l)
    log "staged parts: $have of $want in $STAGE_DIR ($(du -sm "$STAGE_DIR" | cut -f1) MiB)"
  else
    log "nothing staged in $STAGE_DIR"
  fi
  if [ -f "$SITE/vllm/__init__.py" ]; then log "installed: $SITE (vllm present)"; fi
}

cmd_install() {
  set -e
  local t0=$(date +%s)
  [ -f "$STAGE_DIR/MANIFEST" ] || { log "ERROR: no MANIFEST in $STAGE_DIR: the machine was not warm, or no part was collected"; return 1; }
  local want sha have
  want=$(sed -n 's/^parts=//p' "$STAGE_DIR/MANIFEST")
  sha=$(sed -n 's/^sha256=//p' "$STAGE_DIR/MANIFEST")
  have=$(ls "$STAGE_DIR"/bundle.tar.part-* 2>/dev/null | wc -l)
  if [ "$have" != "$want" ]; then
    log "ERROR: $have of $want parts staged; missing parts mean the machine went cold between calls - start again from part 1"
    ls -la "$STAGE_DIR"
    return 1
  fi
  cat "$STAGE_DIR"/bundle.tar.part-* > "$STAGE_DIR/bundle.tar"
  echo "$sha  $STAGE_DIR/bundle.tar" | sha256sum -c --quiet - || { log "ERROR: sha256 mismatch"; return 1; }
  rm -f "$STAGE_DIR"/bundle.tar.part-*
  rm -rf "$STAGE_DIR/bundle"
  tar -C "$STAGE_DIR" -xf "$STAGE_DIR/bundle.tar"
  rm -f "$STAGE_DIR/bundle.tar"
  log "reassembled and verified in $(( $(date +%s) - t0 )) s"

  mkdir -p "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --disable-pip-version-check --root-user-action=ignore --upgrade --target "$SITE" "$STAGE_DIR"/bundle/whl/*.whl
  log "wheels installed in $(( $(date +%s) - t0 )) s"
  # the slim vLLM tree (xz; Python's tarfile needs no xz binary)
  "$PY" - "$STAGE_DIR/bundle/vllm-slim.tar.xz" "$SITE" <<'PYEOF'
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2], filter="data")
PYEOF
  # a `vllm` command for the CLI (the tree was unpacked, not pip-installed)
  mkdir -p "$SITE/bin"
  printf '#!/bin/sh\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$PY" > "$SITE/bin/vllm"
  chmod +x "$SITE/bin/vllm"
  rm -rf "$STAGE_DIR/bundle"
  log "vllm unpacked; install took $(( $(date +%s) - t0 )) s; $(du -sm "$SITE" | cut -f1) MiB in $SITE"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  "$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
  # the offline-inference import closure (fails fast on a missing package)
  "$PY" -c 'from vllm import LLM, SamplingParams; import vllm.v1.engine.core, vllm.v1.worker.gpu_model_runner, vllm.model_executor.models.kimi_linear; print("offline LLM imports: ok")'
  "$PY" - <<'PYEOF'
from importlib.metadata import version
def v(n):
    try:
        return version(n)
    except Exception:
        return "absent"
names = "numba protobuf setuptools typing_extensions pydantic transformers huggingface_hub triton flashinfer-python anyio httpx".split()
print("versions in effect:", ", ".join(f"{n} {v(n)}" for n in names))
PYEOF
  set +e
  echo "export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH} PATH=$SITE/bin:\$PATH"
}

write_smoke_py() {  # the smoke program, kept inside this script
  cat > "$1" <<'PYEOF'
import json, os, sys, time

KIMI = {  # KimiLinearForCausalLM: 3 KDA layers + 1 MLA layer, 8-expert MoE
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2048,
    "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
    "model_max_length": 8192, "tie_word_embeddings": False, "dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 512,
    "num_shared_experts": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "use_grouped_topk": True,
    "num_expert_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
    "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4],
                           "num_heads": 16, "head_dim": 128,
                           "short_conv_kernel_size": 4},
}
QWEN3_NEXT = {  # Qwen3NextForCausalLM: 3 GatedDeltaNet layers + 1 full attention
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2048,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
    "tie_word_embeddings": False, "dtype": "bfloat16",
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 4,
    "linear_num_value_heads": 8, "decoder_sparse_step": 1,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 2, "num_experts": 8, "norm_topk_prob": True,
    "mlp_only_layers": [], "full_attention_interval": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
}


def write_configs(root):
    for name, cfg in (("kimi_linear_tiny", KIMI), ("qwen3_next_tiny", QWEN3_NEXT)):
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        print("wrote", d)


def run(model_dir, mode):
    from vllm import LLM, SamplingParams

    kw = dict(model=model_dir, load_format="dummy", max_model_len=4096,
              gpu_memory_utilization=0.5, skip_tokenizer_init=True,
              dtype="bfloat16", seed=0)
    if mode == "eager":
        kw["enforce_eager"] = True
    else:
        kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}
    if "qwen3_next" in model_dir:
        # FlashInfer's GDN prefill would JIT-compile with nvcc for minutes
        kw["additional_config"] = {"gdn_prefill_backend": "triton"}
    t0 = time.perf_counter()
    llm = LLM(**kw)
    t_init = time.perf_counter() - t0
    prompt = {"prompt_token_ids": list(range(100, 164))}
    greedy = dict(temperature=0.0, ignore_eos=True, detokenize=False)
    sp1 = SamplingParams(max_tokens=1, **greedy)
    sp32 = SamplingParams(max_tokens=32, **greedy)
    llm.generate([prompt], sp32, use_tqdm=False)  # warm-up
    t = time.perf_counter(); llm.generate([prompt], sp1, use_tqdm=False)
    t1 = time.perf_counter() - t
    t = time.perf_counter(); out = llm.generate([prompt], sp32, use_tqdm=False)
    t32 = time.perf_counter() - t
    toks = list(out[0].outputs[0].token_ids)
    print("TOKENS", toks, flush=True)
    # a batch: 64 prompts of 128 tokens, 128 new tokens each
    batch = [{"prompt_token_ids": [(7 * i + 13 * j) % 31000 + 500 for j in range(128)]}
             for i in range(64)]
    spb = SamplingParams(max_tokens=128, **greedy)
    t = time.perf_counter(); outs = llm.generate(batch, spb, use_tqdm=False)
    tb = time.perf_counter() - t
    nb = sum(len(o.outputs[0].token_ids) for o in outs)
    res = {"model": os.path.basename(model_dir), "mode": mode,
           "init_s": round(t_init, 1), "n_tokens": len(toks),
           "latency_1tok_s": round(t1, 4), "latency_32tok_s": round(t32, 4),
           "decode_tok_s_bs1": round(31 / max(t32 - t1, 1e-9), 1),
           "e2e_tok_s_bs1": round(32 / t32, 1),
           "batch64_out_tok_s": round(nb / tb, 1), "batch64_s": round(tb, 2)}
    print("RESULT", json.dumps(res), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "write-configs":
        write_configs(sys.argv[2])
    else:
        try:
            run(sys.argv[2], sys.argv[3])
        except BaseException as e:
            import traceback
            traceback.print_exc()
            print("ERROR", type(e).__name__, str(e)[:500], flush=True)
            sys.exit(1)
PYEOF
}

cmd_smoke() {  # cases: kimi-eager kimi-graphs qwen3next-eager qwen3next-graphs
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  export PATH=$SITE/bin:$PATH
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  export PYTHONUNBUFFERED=1
  # keep Triton autotuning results in the Triton cache (~/.triton/cache), so a
  # second engine start on the same machine skips the FLA kernel autotuning
  export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
  local W=${SMOKE_DIR:-/root/smoke}
  mkdir -p "$W"
  local deadline=$(( $(date +%s) + ${SMOKE_DEADLINE_S:-560} ))
  local logdir=${OUT:-$W}
  write_smoke_py "$W/smoke_hybrid.py"
  "$PY" "$W/smoke_hybrid.py" write-configs "$W" > /dev/null
  local cases=("$@")
  [ ${#cases[@]} -eq 0 ] && cases=(kimi-eager)
  local c model mode left rc t0 ok=0
  for c in "${cases[@]}"; do
    case $c in
      kimi-*) model=$W/kimi_linear_tiny ;;
      qwen3next-*) model=$W/qwen3_next_tiny ;;
      *) log "unknown case $c"; continue ;;
    esac
    mode=${c#*-}
    left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt 60 ]; then log "skip $c: only ${left}s left"; continue; fi
    log "case $c: timeout ${left}s"
    t0=$(date +%s)
    timeout -k 10 "$left" "$PY" "$W/smoke_hybrid.py" run "$model" "$mode" > "$logdir/smoke-$c.log" 2>&1
    rc=$?
    log "case $c rc=$rc after $(( $(date +%s) - t0 )) s${OUT:+ (log: \$OUT/smoke-$c.log)}"
    grep -E '^(RESULT|TOKENS|ERROR)' "$logdir/smoke-$c.log"
    grep -E 'attention backend|MoE backend|GDN prefill|init engine|torch.compile took|Graph capturing finished' "$logdir/smoke-$c.log" | cut -c1-200
    if [ $rc -ne 0 ]; then
      log "case $c failed; last lines:"
      grep -vE '^\s*$' "$logdir/smoke-$c.log" | tail -15 | cut -c1-300
    else
      ok=$((ok+1))
    fi
  done
  log "smoke: $ok of ${#cases[@]} cases passed"
}

case "${1:-}" in
  collect) shift; cmd_collect "$@" ;;
  install) cmd_install ;;
  smoke) shift; cmd_smoke "$@" ;;
  status) cmd_status ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
