"""How far vLLM's engine gets on the CPU platform with the plugin and the built-in tiny checkpoint.

    python scripts/cpu_engine_check.py [--format bf16] [--stand-ins] [--out result.json]

vLLM's CPU platform needs vLLM's own CPU build: its compiled `torch.ops._C` CPU kernels. PyPI's `vllm` wheels are the
CUDA build, so on a machine without a GPU the engine stops at the first compiled op it calls. The script forces the
CPU platform, starts `LLM(...)` in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and records each stage it
reaches: model built, weights loaded (the number of parameters `load_weights` filled), engine up, tokens generated.
`--stand-ins` lends the two compiled ops the engine meets before the model is built, with their contracts:
`init_cpu_memory_env` (binds the process's memory to a NUMA node: nothing to do on one node) and `silu_and_mul`
(bound, not called, on x86). The last line printed is the result as JSON; with vLLM 0.33.0 and `--stand-ins` the
engine builds the model, loads all of the tiny checkpoint, then stops in `process_weights_after_loading` of the
unquantized MoE at `torch.ops._C.prepack_moe_weight`, a kernel only the CPU build has.
"""
import argparse, functools, json, os, sys, time, traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1")): os.environ.setdefault(k, v)


def _lend_compiled_ops():
    import torch
    def silu_and_mul(out, x):                                               # out = silu(x[..., :d]) * x[..., d:]
        d = x.shape[-1] // 2
        out.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])
    lent = []
    for name, fn in (("init_cpu_memory_env", lambda nodes: None), ("silu_and_mul", silu_and_mul)):
        if not hasattr(torch.ops._C, name): setattr(torch.ops._C, name, fn); lent.append(name)
    return lent


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="bf16", help="tiny checkpoint format: bf16, compressed-tensors or modelopt")
    ap.add_argument("--stand-ins", action="store_true", help="lend the compiled ops met before the model is built")
    ap.add_argument("--out", help="also write the result JSON to this file")
    a = ap.parse_args(argv)
    t0, stages = time.time(), []
    def mark(s): stages.append([round(time.time() - t0, 1), s]); print("stage:", s, flush=True)

    from solar_open2.vllm.testing import force_cpu_platform
    force_cpu_platform()
    import vllm
    from solar_open2.checkpoint import tiny_checkpoint
    from solar_open2.vllm import register, model as M
    register()
    res = {"vllm": vllm.__version__, "format": a.format, "lent": _lend_compiled_ops() if a.stand_ins else []}
    cls = M.SolarOpen2ForCausalLM
    init, load = cls.__init__, cls.load_weights
    @functools.wraps(init)
    def traced_init(self, *args, **kw): init(self, *args, **kw); mark("model built")
    @functools.wraps(load)
    def traced_load(self, weights):
        r = load(self, weights); mark(f"weights loaded: {len(r)} parameters"); return r
    cls.__init__, cls.load_weights = traced_init, traced_load
    mark(f"vLLM {vllm.__version__} on the CPU platform")
    try:
        from vllm import LLM, SamplingParams
        llm = LLM(model=str(tiny_checkpoint(a.format)), dtype="bfloat16", enforce_eager=True, max_model_len=256,
                  max_num_seqs=2, seed=0, gpu_memory_utilization=0.05)
        mark("engine up")
        out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(max_tokens=4, temperature=0.0))
        mark(f"generated {list(out[0].outputs[0].token_ids)}")
        res["ok"] = True
    except Exception as e:                                                    # noqa: BLE001 (the point is where it stops)
        res["ok"] = False
        res["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        res["where"] = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
                        for f in traceback.extract_tb(e.__traceback__)[-6:]]
    res["stages"] = stages
    line = json.dumps(res)
    if a.out:
        with open(a.out, "w") as f: f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
