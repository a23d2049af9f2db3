#!/usr/bin/env python
"""The GPU checks of the Dynamo chapter (nbs/10b_dynamo.ipynb) on the tiny checkpoint, one H200:

    python -m benchmarks.engine.dynamo_checks [--out DIR] [--tokens 48] [--pool-bytes 1G] [--skip-serve]
                                             [--cases NAME ...] [--deadline-s 560]

1. FP8 KV parity. vLLM with the plugin, greedy, the prompts of `prompts()` (5 of 5..200 tokens) one at a time and
   `--tokens` new tokens each, with the top-20 logprobs, in a fresh process per case (`CASES`): KV `auto` (BF16) in
   eager mode, FP8 KV through FlashInfer in eager mode and with CUDA graphs, and FP8 KV with the backend vLLM picks
   by itself (informational: on an H200 vLLM 0.25.1 is expected to pick FlashAttention 3, which quantizes the queries
   to FP8 too). Each sequence is teacher-forced through the fp32 reference (`solar_open2.model`): every vLLM token
   must be the reference's argmax (near-ties under `--tie-nats` apart), and each FP8 case's mean |dlogprob| over
   vLLM's top-20 and its max must stay within `--noise-factor` (2) x the BF16-KV case's + `--slack-nats` (0.05), and the
   chosen tokens' max |dlogprob| within `--max-nats` (0.5). The tolerance, and why, is in the chapter ("On the GPU").
   `--rejudge REPORT...` re-applies the checks to saved reports without a GPU.
2. The pool. Every engine gets `kv_cache_memory_bytes` = `--pool-bytes`; the two lines it logs ("GPU KV cache size:
   N tokens", "Maximum concurrency for L tokens per request: Cx") must equal `solar_open2.budget.plan` for the tiny
   config, TP1, that pool, `--max-model-len` and the case's KV dtype.
3. The reasoning budget served. `vllm serve` on the tiny checkpoint (FP8 KV, FlashInfer, the solar_open2 reasoning
   parser, `--logits-processors solar_open2.vllm.logits:SolarOpen2TemplateLogitsProcessor`), one chat request with
   `vllm_xargs: {"solar_open2_reasoning_budget": B}` and `allowed_token_ids` limited to plain word tokens (so the
   random model cannot close its thought itself): token B of the answer (0-based) must be `<|think:end|>` (131), once,
   with `reasoning` the text before it and `content` the text after; with budget `none` there is no `<|think:end|>`.

Writes `dynamo_checks.json` and one log per engine to `--out` (default `$OUT`, else benchmarks/results/incoming/),
prints the JSON, exits 0 when 1-3 hold (the informational case apart), 1 when not, 2 on bad arguments.

The plugin reaches every vLLM process through an entry point: when the checkout is not pip-installed, a throw-away
`*.dist-info` declaring `vllm.general_plugins: solar_open2 = solar_open2.vllm:register` goes on the children's
PYTHONPATH together with the repository root.
"""
from __future__ import annotations
import argparse, importlib.metadata, json, os, platform, re, signal, socket, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPK = 20
THINK_END_ID = 131
LOGITS_PROCESSOR = "solar_open2.vllm.logits:SolarOpen2TemplateLogitsProcessor"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
       "VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONUNBUFFERED": "1"}
# name -> (kv_cache_dtype, attention backend or None for vLLM's choice, mode, part of the verdict)
CASES = {"bf16kv_eager": ("auto", None, "eager", True),
         "fp8_flashinfer_eager": ("fp8", "FLASHINFER", "eager", True),
         "fp8_flashinfer_graphs": ("fp8", "FLASHINFER", "graphs", True),
         "fp8_vllm_choice_eager": ("fp8", None, "eager", False)}
LOG_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
LOG_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
LOG_BACKEND = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z_0-9]+) (?:attention )?backend", re.I)


def prompts(vocab: int = 1024, first: int = 142) -> list:
    "Deterministic token-id prompts of 5, 17, 64, 130 and 200 tokens, no special token among them."
    out = []
    for n, (a, b) in zip((5, 17, 64, 130, 200), ((3, 7), (5, 11), (7, 13), (11, 17), (13, 19))):
        out.append([first + (a * i * i + b * i + n) % (vocab - first) for i in range(n)])
    return out


def predicted_lines(pool: int, max_model_len: int, kv_cache_dtype: str) -> list:
    "The two lines the budget chapter says vLLM logs for the tiny model at TP1 with this pool."
    from solar_open2.budget import plan
    from solar_open2.config import SolarOpen2Config
    return plan(tp=1, kv_cache_memory_bytes=pool, max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype,
                cfg=SolarOpen2Config.tiny(), spark_headroom=False).log_lines


def logged_lines(log: str) -> dict:
    "The pool lines and the attention backends an engine log holds."
    t, c = LOG_TOKENS.findall(log), LOG_CONC.findall(log)
    return {"kv_cache_size": f"GPU KV cache size: {t[-1]} tokens" if t else None,
            "max_concurrency": f"Maximum concurrency for {c[-1][0]} tokens per request: {c[-1][1]}x" if c else None,
            "attention_backends": sorted(set(m.upper() for m in LOG_BACKEND.findall(log)))}


def compare(lp, tokens: list, topk: list, tie_nats: float) -> dict:
    """vLLM's greedy tokens and top-k logprobs against the reference's log-softmax `lp` [n, V] at the same positions:
    the chosen tokens' |dlogprob| (vLLM always returns the sampled token's logprob) and those over the whole top-k."""
    top2 = lp.topk(2, -1)
    mism, ties, dk, dc = [], [], [], []
    for i, t in enumerate(tokens):
        if t != int(top2.indices[i, 0]):
            (ties if float(top2.values[i, 0] - lp[i, t]) < tie_nats else mism).append(i)
        row = {int(j): v for j, v in topk[i].items()}                   # JSON keys come back as strings
        dk += [abs(v - float(lp[i, j])) for j, v in row.items()]
        dc.append(abs(row[t] - float(lp[i, t])))
    return {"mismatches": mism, "near_ties": ties, "topk_mean_abs_dlogprob": sum(dk) / len(dk), "topk_max_abs_dlogprob": max(dk),
            "chosen_mean_abs_dlogprob": sum(dc) / len(dc), "chosen_max_abs_dlogprob": max(dc)}


def verdict(results: dict, noise_factor: float, slack_nats: float, max_nats: float) -> list:
    """Problems of the parity and pool checks, one line each ([] = pass); informational cases are not judged.
    An FP8 case passes when its chosen tokens' max |dlogprob| is at most `max_nats` and its top-k mean and max are at most
    `noise_factor` x the BF16-KV case's + `slack_nats`: the top-k tail of a random model sits where BF16 logits are
    coarse (the BF16-KV run itself is nats off there), so the tail is judged against that floor, not in absolute nats."""
    out = []
    base = results.get("bf16kv_eager", {}).get("parity")
    for name, r in results.items():
        if not CASES[name][3]: continue
        if r.get("error"): out.append(f"{name}: {r['error']}"); continue
        if r["parity"]["mismatches"]: out.append(f"{name}: {r['parity']['mismatches']} tokens are not the reference's argmax")
        if r["pool"]["logged"] != r["pool"]["predicted"]:
            out.append(f"{name}: vLLM logged {r['pool']['logged']}, the budget predicts {r['pool']['predicted']}")
        if CASES[name][0] == "fp8" and base:
            for stat in ("mean", "max"):
                key = f"topk_{stat}_abs_dlogprob"
                lim = noise_factor * base[key] + slack_nats
                if r["parity"][key] > lim: out.append(f"{name}: {stat} top-{TOPK} |dlogprob| {r['parity'][key]:.4f} > {lim:.4f}")
            got = r["parity"].get("chosen_max_abs_dlogprob")
            if got is None: out.append(f"{name}: no chosen-token |dlogprob| in the report (re-judge it with --rejudge)")
            elif got > max_nats: out.append(f"{name}: max chosen-token |dlogprob| {got:.4f} > {max_nats}")
        elif CASES[name][0] == "fp8": out.append(f"{name}: no BF16-KV case to judge it against")
    return out


def plain_word_ids(tokenizer_json: dict) -> list:
    "Ids of the vocabulary's plain lowercase word pieces (no special token, no marker characters), for allowed_token_ids."
    vocab = tokenizer_json["model"]["vocab"]
    items = vocab.items() if isinstance(vocab, dict) else ((t, i) for i, (t, _) in enumerate(vocab))
    ids = sorted(i for t, i in items if re.fullmatch(r"\u2581?[a-z]{2,}", t) and i > 200)
    if not ids: raise ValueError("tokenizer.json: no plain word tokens for allowed_token_ids")
    return ids


def budget_problems(answer: dict, budget) -> list:
    "What is wrong with one served answer for that budget ([] = right)."
    ids = answer.get("token_ids") or []
    if budget is None:
        return [f"budget none: <|think:end|> at {ids.index(THINK_END_ID)}"] if THINK_END_ID in ids else []
    if ids.count(THINK_END_ID) != 1: return [f"budget {budget}: <|think:end|> {ids.count(THINK_END_ID)} times in {ids}"]
    out = [] if ids.index(THINK_END_ID) == budget else [f"budget {budget}: <|think:end|> at token {ids.index(THINK_END_ID)}"]
    if not answer.get("reasoning"): out.append(f"budget {budget}: no reasoning in the answer")
    if not answer.get("content"): out.append(f"budget {budget}: no content after the marker")
    return out


# ---- the plugin in every vLLM process ---------------------------------------------------------------------------

def child_env(shim_dir: Path) -> dict:
    env = {**os.environ, **ENV}
    paths = [str(ROOT)]
    if not any(ep.value == "solar_open2.vllm:register" for ep in importlib.metadata.entry_points(group="vllm.general_plugins")):
        d = shim_dir / "solar_open2_dynamo_checks_shim-0.0.0.dist-info"
        d.mkdir(parents=True, exist_ok=True)
        (d / "METADATA").write_text("Metadata-Version: 2.1\nName: solar_open2_dynamo_checks_shim\nVersion: 0.0.0\n")
        (d / "entry_points.txt").write_text("[vllm.general_plugins]\nsolar_open2 = solar_open2.vllm:register\n")
        paths.append(str(shim_dir))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


# ---- child: one engine ------------------------------------------------------------------------------------------

def child(model: str, case: str, tokens: int, pool: int, max_model_len: int, out: str,
          gpu_memory_utilization: float | None = None) -> int:
    from vllm import LLM, SamplingParams
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(model, case, pool, max_model_len, gpu_memory_utilization))
    init_s = time.perf_counter() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, detokenize=False, logprobs=TOPK)
    res = []
    for p in prompts():
        c = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0].outputs[0]
        res.append({"tokens": list(c.token_ids), "topk": [{int(i): float(x.logprob) for i, x in lp.items()} for lp in c.logprobs]})
    cfg = llm.llm_engine.vllm_config
    Path(out).write_text(json.dumps({"init_s": round(init_s, 1), "runs": res, "block_size": cfg.cache_config.block_size,
                                     "cache_dtype": cfg.cache_config.cache_dtype}))
    return 0


def run_case(name: str, a, model: Path, env: dict, deadline: float) -> dict:
    out, log = Path(a.out) / f"{name}.child.json", Path(a.out) / f"dynamo_checks_{name}.log"
    cmd = [sys.executable, "-m", "benchmarks.engine.dynamo_checks", "--child", name, "--child-model", str(model),
           "--child-out", str(out), "--tokens", str(a.tokens), "--pool-bytes", str(a.pool_bytes), "--max-model-len", str(a.max_model_len)]
    if a.gpu_memory_utilization: cmd += ["--gpu-memory-utilization", str(a.gpu_memory_utilization)]
    with open(log, "w") as f:
        try: rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=max(30, deadline - time.time())).returncode
        except subprocess.TimeoutExpired: rc = "timeout"
    text = log.read_text(errors="replace")
    r = {"log": log.name, "logged": logged_lines(text)}
    if rc != 0 or not out.exists(): return {**r, "error": f"engine exited {rc}: {(text.strip().splitlines() or ['no output'])[-1][:300]}"}
    return {**r, **json.loads(out.read_text())}


def reference_parity(model: Path, runs: list, tie_nats: float, device: str = "cuda") -> dict:
    import torch
    from solar_open2.model import SolarOpen2ForCausalLM
    m = SolarOpen2ForCausalLM.from_pretrained(model, dtype=torch.float32, device=device, cache_experts=True)
    per = []
    with torch.no_grad():
        for p, r in zip(prompts(), runs):
            n = len(r["tokens"])
            logits, _ = m(torch.tensor([p + r["tokens"]], device=device))                 # [1, T, V]
            lp = torch.log_softmax(logits[0].float(), -1)[len(p) - 1: len(p) - 1 + n]      # [n, V]
            per.append(compare(lp, r["tokens"], r["topk"], tie_nats))
    return {"mismatches": sum(len(x["mismatches"]) for x in per), "near_ties": sum(len(x["near_ties"]) for x in per),
            "topk_mean_abs_dlogprob": sum(x["topk_mean_abs_dlogprob"] for x in per) / len(per),
            "topk_max_abs_dlogprob": max(x["topk_max_abs_dlogprob"] for x in per),
            "chosen_mean_abs_dlogprob": sum(x["chosen_mean_abs_dlogprob"] for x in per) / len(per),
            "chosen_max_abs_dlogprob": max(x["chosen_max_abs_dlogprob"] for x in per), "per_prompt": per}


# ---- the served reasoning budget --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r: return json.loads(r.read())


def serve_args(port: int, pool: int, gpu_memory_utilization: float | None = None) -> list:
    "The server's options: the manifests' worker flags that apply to one GPU and the tiny model."
    util = ["--gpu-memory-utilization", str(gpu_memory_utilization)] if gpu_memory_utilization else []
    return util + ["--served-model-name", "solar-tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
            "--enforce-eager", "--kv-cache-dtype", "fp8", "--attention-backend", "FLASHINFER",
            "--kv-cache-memory-bytes", str(pool), "--reasoning-parser", "solar_open2",
            "--logits-processors", LOGITS_PROCESSOR, "--no-enable-prefix-caching"]


def engine_kwargs(model: str, case: str, pool: int, max_model_len: int, gpu_memory_utilization: float | None = None) -> dict:
    """The `vllm.LLM` keyword arguments of one case. With the pool fixed, `gpu_memory_utilization` only sets the free
    memory vLLM demands at start-up (lower it when other checks share the GPU)."""
    kv, backend, mode, _ = CASES[case]
    kw = dict(model=model, tokenizer=model, skip_tokenizer_init=True, dtype="bfloat16", seed=0, max_model_len=max_model_len,
              max_num_seqs=8, kv_cache_memory_bytes=pool, kv_cache_dtype=kv, enable_prefix_caching=False)
    if gpu_memory_utilization: kw["gpu_memory_utilization"] = gpu_memory_utilization
    if backend: kw["attention_config"] = {"backend": backend}
    if mode == "eager": kw["enforce_eager"] = True
    else: kw["compilation_config"] = {"cudagraph_capture_sizes": [1, 2, 4, 8]}
    return kw


def serve_check(model: Path, a, env: dict, deadline: float) -> dict:
    "Start vllm serve with the processor, send one budgeted and one unbudgeted chat request, stop the server."
    port, log = _free_port(), Path(a.out) / "dynamo_checks_serve.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model)] + serve_args(port, a.pool_bytes, a.gpu_memory_utilization)
    allowed = plain_word_ids(json.loads((model / "tokenizer.json").read_text()))
    res = {"command": " ".join(cmd[2:]), "log": log.name, "answers": {}, "problems": []}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while time.time() < deadline:
                if proc.poll() is not None: res["problems"].append(f"the server exited {proc.returncode}"); return res
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2); break
                except OSError: time.sleep(2)
            else: res["problems"].append("the server did not come up before the deadline"); return res
            for budget in (a.budget, None):
                body = {"model": "solar-tiny", "messages": [{"role": "user", "content": "Think, then answer."}],
                        "max_tokens": a.budget + 8, "temperature": 0, "allowed_token_ids": allowed, "return_token_ids": True,
                        "skip_special_tokens": False,
                        "vllm_xargs": {"solar_open2_reasoning_budget": budget if budget is not None else "none"}}
                ch = _post(f"http://127.0.0.1:{port}/v1/chat/completions", body)["choices"][0]
                msg = ch.get("message", {})
                ans = {"token_ids": ch.get("token_ids"), "reasoning": msg.get("reasoning") or msg.get("reasoning_content"),
                       "content": msg.get("content"), "finish_reason": ch.get("finish_reason")}
                res["answers"][str(budget)] = ans
                res["problems"] += budget_problems(ans, budget)
        except Exception as e: res["problems"].append(f"{type(e).__name__}: {e}")
        finally:
            try: os.killpg(proc.pid, signal.SIGTERM); proc.wait(timeout=60)
            except Exception:
                try: os.killpg(proc.pid, signal.SIGKILL)
                except Exception: pass
    return res


def rejudge(a) -> int:
    """Re-apply the checks to saved reports (no GPU): each report's `NAME.child.json` files next to it are compared
    again with the fp32 reference (CUDA if present, else CPU), cases and the served check merged in report order."""
    import torch
    from solar_open2.checkpoint import make_tiny
    reports = [Path(r).resolve() for r in a.rejudge]
    dest = Path(a.out).resolve() / "dynamo_checks.json"
    if dest in reports: print(f"--rejudge: would overwrite {dest}; choose another --out", file=sys.stderr); return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = make_tiny(Path(tempfile.mkdtemp(prefix="dynamo_rejudge_")) / "tiny-compressed-tensors", "compressed-tensors")
    res = None
    for rp in reports:
        try: d = json.loads(rp.read_text())
        except (OSError, json.JSONDecodeError) as e: print(f"--rejudge {rp}: {e}", file=sys.stderr); return 2
        if res is None: res = {**d, "cases": {}, "rejudged_from": [], "rejudge": {"command": " ".join(sys.argv), "reference_device": device}}
        res["rejudged_from"].append({"report": str(rp), "command": d.get("command"), "commit": d.get("commit"), "wall_s": d.get("wall_s")})
        for name, r in d["cases"].items():
            child_json = rp.parent / f"{name}.child.json"
            if not r.get("error"):
                if not child_json.exists(): print(f"--rejudge {rp}: {child_json.name} is missing", file=sys.stderr); return 2
                r = {**r, "parity": reference_parity(model, json.loads(child_json.read_text())["runs"], a.tie_nats, device)}
            res["cases"][name] = r
        if "serve" in d: res["serve"] = d["serve"]
    res["settings"] = {**res.get("settings", {}), "tie_nats": a.tie_nats, "noise_factor": a.noise_factor, "slack_nats": a.slack_nats, "max_nats": a.max_nats}
    res["problems"] = verdict(res["cases"], a.noise_factor, a.slack_nats, a.max_nats)
    if "serve" in res: res["problems"] += [f"serve: {p}" for p in res["serve"]["problems"]]
    res["pass"] = not res["problems"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("problems", "pass")}, indent=1))
    return 0 if res["pass"] else 1


# ---- parent -----------------------------------------------------------------------------------------------------

def _size(s: str) -> int:
    from solar_open2.budget import parse_size
    try: return parse_size(s)
    except ValueError as e: raise argparse.ArgumentTypeError(str(e)) from None


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks/results/incoming"))
    ap.add_argument("--workdir", help="where the tiny checkpoint goes (default: a temporary directory)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--pool-bytes", type=_size, default=2**30, help="kv_cache_memory_bytes of every engine (vLLM notation)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="every engine's gpu_memory_utilization: with the fixed pool, only the free memory vLLM demands at "
                    "start-up (default: vLLM's own); lower it when other checks share the GPU")
    ap.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    ap.add_argument("--budget", type=int, default=8, help="the served request's reasoning budget")
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--tie-nats", type=float, default=0.05)
    ap.add_argument("--noise-factor", type=float, default=2.0)
    ap.add_argument("--slack-nats", type=float, default=0.05)
    ap.add_argument("--max-nats", type=float, default=0.5, help="FP8 cases: the chosen tokens' max |dlogprob|")
    ap.add_argument("--rejudge", nargs="+", metavar="JSON", help="re-apply the checks to saved dynamo_checks.json reports "
                    "(their NAME.child.json beside them), merged in order; no GPU needed")
    ap.add_argument("--deadline-s", type=float, default=560)
    ap.add_argument("--child", choices=tuple(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--child-model", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    ap = parser()
    try: a = ap.parse_args(argv)
    except SystemExit as e: return int(e.code or 0)
    if a.rejudge: return rejudge(a)
    if a.child: return child(a.child_model, a.child, a.tokens, a.pool_bytes, a.max_model_len, a.child_out, a.gpu_memory_utilization)
    if a.tokens < 1 or a.budget < 0 or a.budget + 8 > 2048: print("--tokens >= 1 and 0 <= --budget <= 2040", file=sys.stderr); return 2
    t0 = time.time(); deadline = t0 + a.deadline_s
    Path(a.out).mkdir(parents=True, exist_ok=True)
    from solar_open2 import chat
    from solar_open2.checkpoint import make_tiny
    work = Path(a.workdir or tempfile.mkdtemp(prefix="dynamo_checks_"))
    model = make_tiny(work / "tiny-compressed-tensors", "compressed-tensors")
    tc = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**tc, "chat_template": chat.CHAT_TEMPLATE}))
    env = child_env(work / "shim")
    res = {"script": "benchmarks/engine/dynamo_checks.py", "command": " ".join(sys.argv), "gpu": None, "versions": {},
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
           "settings": {k: v for k, v in vars(a).items() if not k.startswith("child")}, "cases": {}}
    for pkg in ("vllm", "torch", "flashinfer-python", "transformers"):
        try: res["versions"][pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError: res["versions"][pkg] = None
    res["versions"]["python"] = platform.python_version()
    try:
        import torch
        res["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception: pass
    for name in a.cases:
        r = run_case(name, a, model, env, deadline)
        if not r.get("error"):
            r["parity"] = reference_parity(model, r.pop("runs"), a.tie_nats)
            pred = predicted_lines(a.pool_bytes, a.max_model_len, CASES[name][0])
            r["pool"] = {"predicted": pred, "logged": [r["logged"]["kv_cache_size"], r["logged"]["max_concurrency"]]}
        res["cases"][name] = r
    res["problems"] = verdict(res["cases"], a.noise_factor, a.slack_nats, a.max_nats)
    if not a.skip_serve:
        res["serve"] = serve_check(model, a, env, deadline)
        res["problems"] += [f"serve: {p}" for p in res["serve"]["problems"]]
    res["wall_s"] = round(time.time() - t0, 1)
    res["pass"] = not res["problems"]
    (Path(a.out) / "dynamo_checks.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
