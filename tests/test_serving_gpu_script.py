"""The CPU parts of `scripts/gpu_serving_checks.py`: what the GPU jobs expect (from the budget) and the checks that
judge their results, run here on synthetic results so that each check is seen to fail."""
import copy, json, os, subprocess, sys, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_serving_checks as g  # noqa: E402

from solar_open2.config import SolarOpen2Config  # noqa: E402


def test_expect_command():
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_serving_checks.py"), "expect"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["prefix"] == {"block_size": 272, "shared_tokens": 816, "len_a": 856, "len_b": 872, "saved_after_a": [816],
                           "hit_b": 816}
    kv = j["kv"]
    assert list(kv) == list(g.KV_CASES) and all(v["rank_model_plan_identical"] and v["fits"] for v in kv.values())
    assert kv["fp8:28g:1M"]["log_lines"] == ["GPU KV cache size: 2,262,049 tokens",
                                             "Maximum concurrency for 1,048,576 tokens per request: 2.16x"]
    assert kv["fp8:8g:256K"]["log_lines"][1] == "Maximum concurrency for 262,144 tokens per request: 2.40x"
    assert (kv["fp8+pc:28g:1M"]["gpu_kv_cache_tokens"], kv["fp8+pc:8g:256K"]["gpu_kv_cache_tokens"]) == (2_248_449, 615_030)
    assert {v["block_size"] for v in kv.values()} == {2128}


@pytest.mark.parametrize("bad,msg", [("fp8:28g", "is not DTYPE[+pc]:POOL:LEN"), ("fp8+xx:28g:1M", "only '+pc'"),
                                     ("fp4:28g:1M", "unknown --kv-cache-dtype"), ("fp8:28e9:1M", "'28e9' is not an integer")])
def test_bad_cases(bad, msg):
    with pytest.raises(ValueError, match=None) as e: g.parse_kv_case(bad)
    assert msg in str(e.value)


def test_prompts_fit_and_share_exactly_the_prefix():
    cfg = SolarOpen2Config.tiny()
    exp = g.prefix_expectation(cfg)
    a, b = g.prefix_prompts(exp, cfg.vocab_size)
    n = exp["shared_tokens"]
    assert a[:n] == b[:n] and a[n] != b[n] and (len(a), len(b)) == (exp["len_a"], exp["len_b"])
    assert max(len(a), len(b)) + 64 <= g.PREFIX_MAX_MODEL_LEN and all(142 <= t < cfg.vocab_size for t in a + b)
    assert exp["block_size"] <= g.MAX_NUM_BATCHED_TOKENS      # vLLM's align-mode assertion


def _runs(exp):
    def run(pc):
        hit = exp["hit_b"] if pc == "on" else 0
        return {"a": {"tokens": [1, 2, 3], "num_cached_tokens": 0}, "b": {"tokens": [4, 5, 6], "num_cached_tokens": hit},
                "metrics_after": {"a": {"hits": 0, "queries": 856}, "b": {"hits": hit, "queries": 1728}},
                "block_size": exp["block_size"], "mamba_cache_mode": "align" if pc == "on" else "none"}
    return {(m, pc): run(pc) for m in g.MODES for pc in ("on", "off")}


def test_judge_prefix_passes_and_fails():
    exp = g.prefix_expectation(SolarOpen2Config.tiny())
    ok = {"mismatches": []}
    cmps = {(m, pc, q): ok for m in g.MODES for pc in ("on", "off") for q in "ab"}
    assert g.judge_prefix(_runs(exp), exp, cmps) == []
    faults = {
        "cached tokens": lambda r, c: r[("eager", "on")]["b"].update(num_cached_tokens=544),
        "prefix_cache_hits": lambda r, c: r[("graphs", "on")]["metrics_after"]["b"].update(hits=0),
        "not 'align'": lambda r, c: r[("eager", "on")].update(mamba_cache_mode="all"),
        "differ with caching on and off": lambda r, c: r[("eager", "on")]["b"].update(tokens=[4, 5, 7]),
        "between eager and CUDA graphs": lambda r, c: [r[("graphs", k)]["a"].update(tokens=[9]) for k in ("on", "off")],
        "fp32 reference's argmax": lambda r, c: c.update({("graphs", "on", "b"): {"mismatches": [3]}}),
        "with caching off": lambda r, c: r[("eager", "off")]["b"].update(num_cached_tokens=272),
    }
    for msg, fault in faults.items():
        r, c = _runs(exp), dict(cmps)
        fault(r, c)
        fails = g.judge_prefix(r, exp, c)
        assert any(msg in f for f in fails), (msg, fails)


def test_judge_kv_passes_and_fails():
    exp = g.kv_expectation(g.parse_kv_case("fp8+pc:28g:1M"))
    logged = {"block_size": 2128, "kv_cache_tokens": 2_248_449, "max_concurrency": 2.14}
    engine = {"block_size": 2128, "num_gpu_blocks": 1070}
    assert g.judge_kv("c", exp, logged, engine) == []
    assert any("GPU KV cache size 2248450" in f for f in g.judge_kv("c", exp, {**logged, "kv_cache_tokens": 2_248_450}, engine))
    assert any("num_gpu_blocks 1069" in f for f in g.judge_kv("c", exp, logged, {**engine, "num_gpu_blocks": 1069}))
    assert any("block size (log) None" in f for f in g.judge_kv("c", exp, {**logged, "block_size": None}, engine))
    bad = copy.deepcopy(exp); bad["rank_model_plan_identical"] = False
    assert any("rank model" in f for f in g.judge_kv("c", bad, logged, engine))


def test_parser_takes_the_lead_commands():
    ap = g.build_parser()
    a = ap.parse_args(["prefix", "--modes", "eager", "graphs", "--tokens", "32"])
    assert (a.job, a.modes, a.format) == ("prefix", ["eager", "graphs"], "compressed-tensors")
    a = ap.parse_args(["kv", "--cases", *g.KV_CASES])
    assert a.cases == list(g.KV_CASES) and a.moe_backend == "auto"


def test_memory_flags_reach_the_engines():
    "The sharing options (checks.sh TOGETHER=1) are handed to each engine's process, and only when given."
    ap = g.build_parser()
    assert g._memory_flags(ap.parse_args(["prefix"])) == []
    a = ap.parse_args(["prefix", "--gpu-memory-utilization", "0.08", "--kv-cache-memory-bytes", "2147483648"])
    assert g._memory_flags(a) == ["--gpu-memory-utilization", "0.08", "--kv-cache-memory-bytes", "2147483648"]
    assert g._memory_flags(ap.parse_args(["kv", "--gpu-memory-utilization", "0.74"])) == ["--gpu-memory-utilization", "0.74"]
    r = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_serving_checks.py"), "kv", "--kv-cache-memory-bytes", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "the kv cases name their own pools" in r.stderr



def fake_site(tmp_path, args:bool=False)->tuple:
    """A `$SITE` whose `bin/python3` (checks.sh puts it first on PATH) answers `-c` with version 9.9.9 and records every
    other call in the returned log: one line per call, `F32=<TRITON_F32_DEFAULT or unset> ARGS`, or with `args` the
    last call's arguments one per line (and call N's in `args-N.txt` beside it, from 0)."""
    site = tmp_path / "site"; (site / "bin").mkdir(parents=True)
    log = tmp_path / ("args.txt" if args else "calls.txt")
    record = (f"printf '%s\\n' \"$@\" > '{log}'\n"                              # and each call's into args-N.txt
              f"n=$(ls '{tmp_path}' | grep -c '^args-'); printf '%s\\n' \"$@\" > '{tmp_path}'/args-$n.txt\n") if args else f"echo \"F32=${{TRITON_F32_DEFAULT-unset}} $*\" >> '{log}'\n"
    fake = site / "bin" / "python3"
    fake.write_text("#!/usr/bin/env bash\nif [ \"$1\" = -c ]; then echo 9.9.9; exit 0; fi\n" + record)
    fake.chmod(0o755)
    return site, log


def test_checks_script_refuses_timed_jobs_together_and_unknown_jobs(tmp_path):
    "checks.sh: the rank benchmarks time steps, so TOGETHER=1 refuses them; an unknown job stops before anything runs."
    sh = ROOT / "scripts/device/checks.sh"
    env = {**os.environ, "OUT": str(tmp_path), "TOGETHER": "1"}
    r = subprocess.run(["bash", str(sh), "parity", "new-rank"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "new-rank times or profiles kernels" in r.stderr
    r = subprocess.run(["bash", str(sh), "parity", "nope"], capture_output=True, text=True, env={**env, "TOGETHER": "0"})
    assert r.returncode == 2 and "unknown job 'nope'" in r.stderr and not list(tmp_path.iterdir())


def test_checks_script_tail_and_slice_jobs_run_the_parity_script_as_documented(tmp_path):
    "checks.sh tail: the long float32 parity twice (TF32, then as the plugin sets the dots: the variable empty); slice: the parity on a 2-layer real-shapes slice."
    site, log = fake_site(tmp_path)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "77"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "tail", "slice"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 3, calls
    for line, prec, f32 in zip(calls[:2], ("tf32", "plugin"), ("tf32", "")):   # the plugin half: set and empty, so fp32_ieee_dots decides
        assert line.startswith(f"F32={f32} -m benchmarks.engine.parity --long --cases bf16:eager:float32 "), line
        assert f"--name gpu_parity_tail_{prec}_vllm_9.9.9" in line and "--deadline-s 77" in line
    assert calls[2].startswith("F32=unset -m benchmarks.engine.parity --slice 2 ") and "gpu_parity_slice_vllm_9.9.9" in calls[2], calls[2]
    assert "== tail-tf32: exit 0" in r.stdout and "== tail-plugin: exit 0" in r.stdout and "== slice: exit 0" in r.stdout
    log.unlink()                                                                # PARITY_ARGS reach the slice too
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "slice"], capture_output=True, text=True,
                       env={**env, "PARITY_ARGS": "--moe-backend emulation"})
    assert r.returncode == 0 and log.read_text().rstrip().endswith("--moe-backend emulation"), log.read_text()


def test_checks_script_together_splits_parity_by_mode_and_runs_both_tail_precisions(tmp_path):
    """checks.sh with TOGETHER=1: parity runs its eager and its graphs engines as two reports (each with the sharing
    options and PARITY_ARGS), tail its TF32 and IEEE engines at once; every engine is started exactly once. Alone,
    parity is one report over all four cases."""
    site, log = fake_site(tmp_path)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "77", "TOGETHER": "1",
           "PARITY_ARGS": "--traps"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "parity", "tail"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    calls = sorted(log.read_text().splitlines())
    assert len(calls) == 4, calls
    par = [c for c in calls if "--long" not in c]
    for m in ("eager", "graphs"):
        line = next(c for c in par if f"--name gpu_parity_vllm_9.9.9_{m} " in c)
        assert f"--cases compressed-tensors:{m}:bfloat16 bf16:{m}:bfloat16 --out {tmp_path}/out/parity-{m} " in line, line
        assert line.endswith("--kv-cache-memory-bytes 2147483648 --traps"), line
    assert sorted(c.split()[0] for c in calls if "--long" in c) == ["F32=", "F32=tf32"]
    for j in ("parity-eager", "parity-graphs", "tail-tf32", "tail-plugin"): assert f"== {j}: exit 0" in r.stdout, r.stdout
    log.unlink()                                                                 # alone: one report over the four cases
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "parity"], capture_output=True, text=True,
                       env={**env, "TOGETHER": "0", "PARITY_ARGS": ""})
    assert r.returncode == 0 and "== parity: exit 0" in r.stdout, r.stderr
    assert log.read_text().splitlines() == [
        "F32=unset -m benchmarks.engine.parity --cases compressed-tensors:eager:bfloat16 compressed-tensors:graphs:bfloat16 "
        f"bf16:eager:bfloat16 bf16:graphs:bfloat16 --out {tmp_path}/out/parity --name gpu_parity_vllm_9.9.9 --deadline-s 77"]


def test_checks_script_seeds_and_collects_autotuning_and_stops_stale_gpu_processes(tmp_path):
    """checks.sh: Triton's autotuning results of this card's folder (and no other card's) seed the cache before the jobs,
    every `*.autotune.json` of the cache (no compiled kernels) comes back under $OUT/triton-autotune/CARD/, and a GPU
    process an earlier call left running is stopped first."""
    site, log = fake_site(tmp_path)
    stale = subprocess.Popen(["sleep", "300"])                                  # an engine a killed call left behind
    smi = site / "bin" / "nvidia-smi"
    smi.write_text("#!/usr/bin/env bash\ncase $1 in --query-gpu=name) echo 'NVIDIA H100 80GB HBM3' ;;\n"
                   f"--query-compute-apps=pid) echo {stale.pid} ;; esac\n")
    smi.chmod(0o755)
    seed = tmp_path / "seed"
    for card, name in (("NVIDIA_H100_80GB_HBM3", "kda_gate_fwd_kernel"), ("NVIDIA_H200", "h200_only_kernel")):
        (seed / card / "abc").mkdir(parents=True); (seed / card / "abc" / f"{name}.autotune.json").write_text("{}")
    cache = tmp_path / "cache"
    (cache / "def").mkdir(parents=True); (cache / "def" / "k.cubin").write_bytes(b"x")
    (cache / "def" / "chunk_gla_fwd_kernel_o.autotune.json").write_text("{}")   # tuned on this machine
    plugin = tmp_path / "vllm-cache" / "solar_open2" / "triton"                 # the plugin's KDA warm-up's own cache
    (plugin / "ghi").mkdir(parents=True); (plugin / "ghi" / "chunk_kda_fwd_kernel.autotune.json").write_text("{}")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "AUTOTUNE_SEED": str(seed), "TRITON_CACHE_DIR": str(cache),
           "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    try:
        r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "kda-verify"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert stale.wait(timeout=10) == -9 and f"pids: {stale.pid}" in r.stdout, r.stdout
    finally:
        stale.kill()
    for d in (cache, plugin):                                                   # both caches seeded, with this card's only
        assert (d / "abc" / "kda_gate_fwd_kernel.autotune.json").exists() and not list(d.rglob("h200_only_kernel*"))
    assert "seeded Triton's caches with 1 autotuning results" in r.stdout, r.stdout
    got = tmp_path / "out" / "triton-autotune" / "NVIDIA_H100_80GB_HBM3"
    assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == [
        "abc/kda_gate_fwd_kernel.autotune.json", "def/chunk_gla_fwd_kernel_o.autotune.json", "ghi/chunk_kda_fwd_kernel.autotune.json"]
    assert "-m benchmarks.kernels.kda_verify" in log.read_text() and "--deadline-s 400" in log.read_text()   # the job's deadline


def test_checks_script_under_timeout_stops_its_job_and_still_returns_the_autotuning(tmp_path):
    """`timeout` around checks.sh: the running job (here a python3 that sleeps) is stopped with the script, not left
    holding the GPU, and the autotuning results gathered so far still come back."""
    site, _ = fake_site(tmp_path)
    pidfile = tmp_path / "job.pid"
    (site / "bin" / "python3").write_text("#!/usr/bin/env bash\nif [ \"$1\" = -c ]; then echo 9.9.9; exit 0; fi\n"
                                          f"echo $$ > '{pidfile}'\nexec sleep 120\n")
    (site / "bin" / "nvidia-smi").write_text("#!/usr/bin/env bash\n[ \"$1\" = --query-gpu=name ] && echo 'NVIDIA H200'\nexit 0\n")
    (site / "bin" / "nvidia-smi").chmod(0o755)
    cache = tmp_path / "cache"; (cache / "h").mkdir(parents=True); (cache / "h" / "kda_gate_fwd_kernel.autotune.json").write_text("{}")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "TRITON_CACHE_DIR": str(cache),
           "AUTOTUNE_SEED": str(tmp_path / "none")}
    t0 = time.monotonic()
    r = subprocess.run(["timeout", "4", "bash", str(ROOT / "scripts/device/checks.sh"), "kda-verify"], capture_output=True,
                       text=True, env=env)
    assert time.monotonic() - t0 < 30, "checks.sh waited for its job instead of stopping it"
    assert r.returncode == 124 and "stopped by a signal" in r.stdout, (r.returncode, r.stdout, r.stderr)
    pid = int(pidfile.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], "the job outlived checks.sh"
    assert (tmp_path / "out" / "triton-autotune" / "NVIDIA_H200" / "h" / "kda_gate_fwd_kernel.autotune.json").exists()


def test_checks_script_spec_rank_sweeps_k_with_the_padded_gpu_proposer_and_writes_the_sweep(tmp_path):
    """checks.sh spec-rank with SPEC_RANK_METHOD=ngram: one A/B over SPEC_KS, k0 plain and each K vLLM's GPU proposer
    padded to K in full graphs (no draft model); then verify_sweep over the A/B's summary. The default keeps the
    random EAGLE-3 head."""
    site, log = fake_site(tmp_path)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "SPEC_KS": "0 2 7", "SPEC_RANK_METHOD": "ngram",
           "AUTOTUNE_SEED": str(tmp_path / "none")}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-rank"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    perf, sweep = log.read_text().splitlines()
    assert perf.startswith("F32=unset -m benchmarks.engine.perf --config rank --phase ab") and "--ab k0= " in perf, perf
    for k in (2, 7): assert f"--ab k{k}=--ngram {k} --ngram-gpu --spec-full-graphs --spec-pad-drafts" in perf, perf
    log.unlink()                                                                 # options for the speculative engines only
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-rank"], capture_output=True, text=True,
                       env={**env, "SPEC_RANK_SPEC_ARGS": "--spec-skip-draft-sync"})
    perf = log.read_text().splitlines()[0]
    assert "--ab k0= " in perf and "--ab k2=--ngram 2 --ngram-gpu --spec-full-graphs --spec-pad-drafts --spec-skip-draft-sync " in perf, perf
    assert sweep == f"F32=unset -m benchmarks.engine.verify_sweep {tmp_path}/out/spec-rank/perf_h200_rank_ab.json --out {tmp_path}/out/spec-rank"
    log.unlink()
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-rank"], capture_output=True, text=True,
                       env={**env, "SPEC_RANK_METHOD": "", "SPEC_KS": "0 3"})
    assert "--ab k3=--draft-head 3 --spec-full-graphs" in log.read_text().splitlines()[0]


def test_checks_script_spec_profile_parses_in_perf(tmp_path):
    """checks.sh spec-profile: one perf run of the padded GPU-proposer verify at k = SPEC_E2E_K, torch-profiled with the
    trace kept, SPEC_PROFILE_ARGS after it; every argument parses in perf's own parser."""
    from benchmarks.engine import perf as ph
    site, log = fake_site(tmp_path, args=True)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "300", "SPEC_E2E_K": "2",
           "SPEC_PROFILE_ARGS": "--kv-cache-memory-bytes 2G --max-model-len 8192 --capture-sizes 1,2,3,4,8",
           "AUTOTUNE_SEED": str(tmp_path / "none")}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-profile"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "== spec-profile: exit 0" in r.stdout, r.stderr
    argv = log.read_text().splitlines()
    a = ph.parse_args(argv[2:])
    assert (a.config, a.phase, a.only, a.profile, a.keep_trace, a.variant) == ("rank", "graphs", ("decode", "profile"), True, True,
                                                                                "ngram2_gpu_pad_profile")
    assert (a.ngram, a.ngram_gpu, a.spec_full_graphs, a.spec_pad_drafts, a.decode_tokens, a.deadline_s) == (2, True, True, True, 64, 300)
    assert (a.kv_cache_memory_bytes, a.capture_sizes) == ("2G", [1, 2, 3, 4, 8])


def test_train_tiny_installs_staged_fla_wheels_before_training(tmp_path):
    "train_tiny.sh: wheels staged in FLA_WHEELS are installed (no network, no deps) into FLA_SITE, which the runs import."
    bin_ = tmp_path / "bin"; bin_.mkdir()
    log = tmp_path / "calls.txt"
    (bin_ / "python3").write_text("#!/usr/bin/env bash\n"
                                  "if [ \"$1\" = -c ]; then exit 1; fi\n"                  # `import fla` fails: not installed
                                  f"echo \"PYTHONPATH=$PYTHONPATH $*\" >> '{log}'\n")
    (bin_ / "python3").chmod(0o755)
    wheels = tmp_path / "wheels"; wheels.mkdir(); (wheels / "fla_core-0.5.2-py3-none-any.whl").write_bytes(b"")
    site = tmp_path / "fla site"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "FLA_WHEELS": str(wheels),
           "FLA_SITE": str(site), "TRAIN_ARGS": "--kda-kernel fla", "BUDGET_S": "5"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/train_tiny.sh")], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert calls[0].endswith(f"-m pip install -q --no-deps --no-index --target {site} {wheels}/fla_core-0.5.2-py3-none-any.whl"), calls[0]
    train = [c for c in calls if "-m solar_open2.train" in c]
    assert len(train) == 1 and f":{site} -u -m solar_open2.train " in train[0] and "--kda-kernel fla" in train[0], train
    empty = tmp_path / "none"; empty.mkdir(); log.unlink()
    r = subprocess.run(["bash", str(ROOT / "scripts/device/train_tiny.sh")], capture_output=True, text=True,
                       env={**env, "FLA_WHEELS": str(empty)}, cwd=ROOT)
    assert r.returncode == 0 and not any("pip install" in c for c in log.read_text().splitlines())   # nothing staged: nothing installed


def test_checks_script_spec_e2e_runs_the_ngram_ab_the_perf_parser_accepts(tmp_path):
    """checks.sh spec-e2e (issue 27): one perf A/B at the rank config, no speculation then ngram k = 3 with full graphs and
    drafts padded to k, by the host and by the GPU proposer (or, asked, under the piecewise guard and unpadded), on a
    periodic 2K prompt; every variant's flags parse in perf's own parser; timed, so
    TOGETHER=1 refuses it."""
    from benchmarks.engine import perf as ph
    site, log = fake_site(tmp_path, args=True)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "500",
           "SPEC_E2E_ARGS": "--kv-cache-memory-bytes 2G --max-num-seqs 2 --batch-sizes 2"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-e2e"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "== spec-e2e: exit 0" in r.stdout, r.stderr
    argv = log.read_text().splitlines()
    assert argv[:2] == ["-m", "benchmarks.engine.perf"]
    a = ph.parse_args(argv[2:])
    assert (a.config, a.phase, a.only, a.decode_contexts, a.prompt_period, a.deadline_s) == ("rank", "ab", ("decode",), [2048], 64, 500)
    assert (a.kv_cache_memory_bytes, a.max_num_seqs) == ("2G", 2)                # SPEC_E2E_ARGS reach perf
    assert a.log_stats                                                           # the baseline logs stats as the ngram variants must
    assert a.ab_variants == [("base", []), ("ngram3_pad", ["--ngram", "3", "--spec-full-graphs", "--spec-pad-drafts"]),
                             ("ngram3_gpu_pad", ["--ngram", "3", "--ngram-gpu", "--spec-full-graphs", "--spec-pad-drafts"])]
    for _, flags in a.ab_variants:                                               # each variant's engine arguments parse
        v = ph.parse_args(argv[2:] + flags)
        assert v.ngram == (3 if flags else None) and v.spec_full_graphs == (True if "--spec-full-graphs" in flags else None)
        assert v.spec_pad_drafts == (True if "--spec-pad-drafts" in flags else None) and v.ngram_gpu == ("--ngram-gpu" in flags)
    log.unlink()
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-e2e"], capture_output=True, text=True,
                       env={**env, "SPEC_E2E_VARIANTS": "ngram ngram_full"})
    assert ph.parse_args(log.read_text().splitlines()[2:]).ab_variants[1:] == [
        ("ngram3", ["--ngram", "3"]), ("ngram3_full", ["--ngram", "3", "--spec-full-graphs"])]   # the piecewise guard, full graphs
    log.unlink()                                                                 # the verify cost's variants in the same job
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-e2e"], capture_output=True, text=True,
                       env={**env, "SPEC_E2E_DRAFT_KS": "3 7", "SPEC_E2E_VARIANTS": "ngram_full"})
    a = ph.parse_args(log.read_text().splitlines()[2:])
    assert a.ab_variants == [("base", []), ("ngram3_full", ["--ngram", "3", "--spec-full-graphs"]),
                             ("draft3", ["--draft-head", "3", "--spec-full-graphs"]), ("draft7", ["--draft-head", "7", "--spec-full-graphs"])]
    assert ph.parse_args(log.read_text().splitlines()[2:] + a.ab_variants[3][1]).draft_head == 7
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-e2e"], capture_output=True, text=True,
                       env={**env, "SPEC_E2E_VARIANTS": "ngram bogus"})
    assert "SPEC_E2E_VARIANTS takes ngram, ngram_full, ngram_pad, ngram_gpu_pad, ngram_gpu_pad_unfused and ngram_gpu_pad_nosync, got 'bogus'" in r.stderr
    log.unlink()                                                                 # the draft-count wait's A/B
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-e2e"], capture_output=True, text=True,
                       env={**env, "SPEC_E2E_VARIANTS": "ngram_gpu_pad ngram_gpu_pad_nosync"})
    a = ph.parse_args(log.read_text().splitlines()[2:])
    assert [n for n, _ in a.ab_variants] == ["base", "ngram3_gpu_pad", "ngram3_gpu_pad_nosync"]
    v = ph.parse_args(log.read_text().splitlines()[2:] + a.ab_variants[2][1])
    assert (v.ngram_gpu, v.spec_pad_drafts, v.spec_skip_draft_sync) == (True, True, True)
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-e2e"], capture_output=True, text=True,
                       env={**env, "TOGETHER": "1"})
    assert r.returncode == 2 and "spec-e2e times or profiles kernels" in r.stderr


def test_checks_script_spec_rank_runs_one_engine_per_k_with_its_extra_args(tmp_path):
    """checks.sh spec-rank (issue 27): one perf A/B at the rank config, an engine per K of SPEC_KS (0: no speculation;
    else a random EAGLE-3 head of K tokens with full graphs), SPEC_RANK_ARGS before the variants (the H100's smaller
    pool, say); every variant parses in perf's own parser."""
    from benchmarks.engine import perf as ph
    site, log = fake_site(tmp_path, args=True)
    h100 = "--kv-cache-memory-bytes 2G --max-model-len 8192 --max-num-seqs 2 --batch-sizes 2 --max-num-batched-tokens 2048 --capture-sizes 1,2,4,8"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "450", "SPEC_KS": "0 3 7",
           "SPEC_RANK_ARGS": h100}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "spec-rank"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "== spec-rank: exit 0" in r.stdout, r.stderr
    argv = (tmp_path / "args-0.txt").read_text().splitlines()                   # the A/B (then verify_sweep)
    assert log.read_text().splitlines()[1] == "benchmarks.engine.verify_sweep"
    a = ph.parse_args(argv[2:])
    assert (a.config, a.phase, a.only, a.decode_contexts, a.deadline_s) == ("rank", "ab", ("decode",), [2048], 450)
    assert (a.kv_cache_memory_bytes, a.max_model_len, a.max_num_seqs, a.max_num_batched_tokens, a.capture_sizes) == (
        "2G", 8192, 2, 2048, [1, 2, 4, 8])
    assert a.ab_variants == [("k0", []), ("k3", ["--draft-head", "3", "--spec-full-graphs"]),
                             ("k7", ["--draft-head", "7", "--spec-full-graphs"])]
    assert [ph.parse_args(argv[2:] + f).draft_head for _, f in a.ab_variants] == [None, 3, 7]


def test_checks_script_tail_halves_and_the_moe_batch_job(tmp_path):
    """checks.sh: TAIL_HALVES=plugin runs only the plugin half of the float32 tail (a bad half is named and skipped);
    moe-batch runs the batched MoE kernel benchmark with MOE_BATCH_ARGS and is refused TOGETHER (it times kernels)."""
    site, log = fake_site(tmp_path)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "90", "TAIL_HALVES": "plugin bogus",
           "MOE_BATCH_ARGS": "--tokens 1,64"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "tail", "moe-batch"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and calls[0].startswith("F32= -m benchmarks.engine.parity --long") and "gpu_parity_tail_plugin_" in calls[0]
    assert "TAIL_HALVES takes tf32 and plugin, got 'bogus'" in r.stderr
    assert calls[1].startswith("F32=unset -m benchmarks.kernels.moe_batch --out ") and calls[1].endswith("--deadline-s 90 --tokens 1,64")
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "moe-batch"], capture_output=True, text=True,
                       env={**env, "TOGETHER": "1"})
    assert r.returncode == 2 and "moe-batch times or profiles kernels" in r.stderr


def test_checks_script_moe_profile_runs_the_ncu_profile_alone(tmp_path):
    "checks.sh moe-profile: benchmarks.kernels.moe_profile into $OUT/moe-profile with MOE_PROFILE_ARGS; TOGETHER=1 refuses it."
    site, log = fake_site(tmp_path)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "MOE_PROFILE_ARGS": "--tokens 1,2,4,8"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "moe-profile"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert log.read_text().splitlines() == [f"F32=unset -m benchmarks.kernels.moe_profile --out {tmp_path / 'out' / 'moe-profile'} --tokens 1,2,4,8"]
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "moe-profile"], capture_output=True, text=True,
                       env={**env, "TOGETHER": "1"})
    assert r.returncode == 2 and "moe-profile times or profiles kernels" in r.stderr


def test_checks_script_moe_rank_runs_issue_28s_ab_the_perf_parser_accepts(tmp_path):
    """checks.sh moe-rank (issue 28): one perf A/B at the rank config over single-stream decode, 8/32/64 streams and an
    8K prefill: no MoE flag, Marlin with the decode kernels over its copy, the emulation backend; every variant's flags parse in perf's own parser and
    switch what they name; timed, so TOGETHER=1 refuses it."""
    from benchmarks.engine import perf as ph
    site, log = fake_site(tmp_path, args=True)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "520", "MOE_RANK_ARGS": "--decode-tokens 64"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "moe-rank"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "== moe-rank: exit 0" in r.stdout, r.stderr
    argv = log.read_text().splitlines()
    a = ph.parse_args(argv[2:])
    assert (a.config, a.phase, a.only, a.decode_contexts, a.batch_sizes, a.prefill_contexts, a.decode_tokens, a.deadline_s) == (
        "rank", "ab", ("decode", "batch", "prefill"), [2048], [8, 32, 64], [8192], 64, 520)
    assert [n for n, _ in a.ab_variants] == ["default", "marlin_decode", "emulation"]
    got = {n: ph.parse_args(argv[2:] + flags) for n, flags in a.ab_variants}
    assert (got["default"].moe_marlin_kernels, got["default"].moe_backend) == (None, "auto")     # no flag: the plugin's default
    assert got["marlin_decode"].moe_marlin_kernels is True and got["emulation"].moe_backend == "emulation"
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "moe-rank"], capture_output=True, text=True,
                       env={**env, "TOGETHER": "1"})
    assert r.returncode == 2 and "moe-rank times or profiles kernels" in r.stderr


def test_checks_script_prefill_profile_runs_issue_33s_profile_the_perf_parser_accepts(tmp_path):
    """checks.sh prefill-profile (issue 33): the rank config, graphs, prefill at 8K and 32K timed and profiled once each;
    its flags parse in perf's own parser; refused TOGETHER."""
    from benchmarks.engine import perf as ph
    site, log = fake_site(tmp_path, args=True)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SITE": str(site), "DEADLINE_S": "540", "PREFILL_PROFILE_ARGS": "--prefill-repeats 1"}
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "prefill-profile"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "== prefill-profile: exit 0" in r.stdout, r.stderr
    a = ph.parse_args(log.read_text().splitlines()[2:])
    assert (a.config, a.phase, a.only, a.prefill_contexts, a.profile_prefill, a.prefill_repeats, a.deadline_s) == (
        "rank", "graphs", ("prefill", "profile"), [8192, 32768], True, 1, 540)
    assert a.profile_steps >= -(-32768 // a.max_num_batched_tokens)             # the trace holds every chunk of the 32K prompt
    r = subprocess.run(["bash", str(ROOT / "scripts/device/checks.sh"), "prefill-profile"], capture_output=True, text=True,
                       env={**env, "TOGETHER": "1"})
    assert r.returncode == 2 and "prefill-profile times or profiles kernels" in r.stderr
