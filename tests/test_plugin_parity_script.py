"""The GPU parity script's CPU-checkable parts: prompts, the entry-point shim that vLLM's plugin loader must find in a
fresh process, and the reference-side comparison (tokens and logprobs) on the tiny checkpoint. The GPU run itself is
the coordinator's (`python -m benchmarks.engine.parity` on the H200 machine)."""
import argparse, json, os, subprocess, sys
from pathlib import Path

import pytest
import torch

from benchmarks.engine import parity as gp

ROOT = Path(__file__).resolve().parents[1]


def test_prompts_are_plain_token_ids():
    ps = gp.prompts()
    assert [len(p) for p in ps] == [5, 17, 64, 130, 200]
    assert all(142 <= t < 1024 for p in ps for t in p)             # no special tokens, inside the tiny vocab
    assert gp.prompts() == ps


def test_entry_point_shim_is_found_by_vllms_plugin_loader(tmp_path):
    pytest.importorskip("vllm")
    shim = gp.entry_point_shim(tmp_path)
    code = ("import os\nos.environ['VLLM_PLUGINS'] = 'solar_open2'\n"
            "from solar_open2.vllm.testing import force_cpu_platform; force_cpu_platform()\n"
            "from vllm.plugins import load_general_plugins; load_general_plugins()\n"
            "from vllm import ModelRegistry; print('SolarOpen2ForCausalLM' in ModelRegistry.get_supported_archs())")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(shim)])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "True"


def test_compare_counts_mismatches_and_logprob_errors():
    from solar_open2.checkpoint import tiny_checkpoint
    m = gp.load_reference(tiny_checkpoint("bf16"), "cpu")
    prompt = gp.prompts()[0]
    ids = list(prompt)
    for _ in range(6): ids.append(int(gp.reference_logprobs(m, ids, "cpu")[-1].argmax()))   # the reference's greedy run
    toks = ids[len(prompt):]
    lp = gp.reference_logprobs(m, ids, "cpu")
    got = {"tokens": toks, "logprobs": [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(toks)]}
    c = gp.compare(m, prompt, got, "cpu", tie_nats=0.05)
    assert (c["mismatches"], c["near_ties"], c["first_divergence"]) == ([], [], None) and c["max_abs_dlogprob"] < 1e-5
    row = lp[len(prompt) - 1 + 2]
    worst = int(row.argmin())                                        # a token the reference finds unlikely
    bad = {"tokens": toks[:2] + [worst] + toks[3:], "logprobs": got["logprobs"][:2] + [0.0] + got["logprobs"][3:]}
    c = gp.compare(m, prompt, bad, "cpu", tie_nats=0.05)
    assert c["mismatches"][0] == 2 and c["first_divergence"] == 2 and c["max_abs_dlogprob"] > 1.0


def test_topk_logprobs_and_judge():
    "vLLM's top-k logprobs are compared too; the judge fails a token mismatch, an fp32 logprob error, a bf16 excess."
    import argparse
    from solar_open2.checkpoint import tiny_checkpoint
    m = gp.load_reference(tiny_checkpoint("bf16"), "cpu")
    m16 = gp.load_reference(tiny_checkpoint("bf16"), "cpu", "bfloat16")
    prompt = gp.prompts()[1]
    ids = list(prompt)
    for _ in range(5): ids.append(int(gp.reference_logprobs(m, ids, "cpu")[-1].argmax()))
    toks = ids[len(prompt):]
    lp = gp.reference_logprobs(m, ids, "cpu")[len(prompt) - 1:]                           # [6, V]
    topk = [{int(j): float(lp[i, j]) for j in lp[i].topk(gp.TOPK).indices} for i in range(len(toks))]
    got = {"tokens": toks, "logprobs": [float(lp[i, t]) for i, t in enumerate(toks)], "topk": topk}
    c = gp.compare(m, prompt, got, "cpu", 0.05, m16)
    assert c["topk_max_abs_dlogprob"] < 1e-5 and c["min_top2_margin"] > 1.0        # the successor map's margins
    nf = c["noise_floor_bf16_reference"]
    assert nf["mismatches"] == 0 and 0 < nf["topk_mean_abs_dlogprob"] < 1.0
    a = argparse.Namespace(logprob_tol=0.1, logprob_mean_tol=0.05, noise_factor=2.0)
    assert gp.judge("x", "float32", [c], a) == [] and gp.judge("x", "bfloat16", [c], a) == []
    off = {**got, "topk": [{j: v + (0.3 if k == 3 else 0.0) for k, (j, v) in enumerate(d.items())} for d in topk]}
    c2 = gp.compare(m, prompt, off, "cpu", 0.05, m16)
    assert any("max |dlogprob|" in f for f in gp.judge("x", "float32", [c2], a))
    w = c2["topk_worst"]                                       # the planted entry is named: position, token, both logprobs
    assert abs(w["logprob"] - w["reference_logprob"] - 0.3) < 1e-3 and list(topk[w["position"]])[3] == w["token"]
    far = {**got, "topk": [{j: v + 1.0 for j, v in d.items()} for d in topk]}
    assert gp.judge("x", "bfloat16", [gp.compare(m, prompt, far, "cpu", 0.05, m16)], a)
    wrong = {**got, "tokens": toks[:1] + [int(lp[1].argmin())] + toks[2:]}
    assert any("tokens differ" in f for f in gp.judge("x", "bfloat16", [gp.compare(m, prompt, wrong, "cpu", 0.05, m16)], a))


def test_eager_vs_graphs_token_difference_fails():
    import argparse
    a = argparse.Namespace(logprob_tol=0.1, logprob_mean_tol=0.05, noise_factor=2.0)
    assert gp.judge_run("ct:bfloat16:eager_vs_graphs", {"same_tokens": [True, True]}, a) == []
    assert gp.judge_run("ct:bfloat16:eager_vs_graphs", {"same_tokens": [True, False, True]}, a) == \
        ["ct:bfloat16:eager_vs_graphs: eager and CUDA graphs differ in tokens for prompts [1]"]


@pytest.mark.parametrize("value, needle", [("[1]", "expected a JSON object"), ("{bad", "not JSON")])
def test_additional_config_must_be_a_json_object(value, needle):
    r = subprocess.run([sys.executable, "-m", "benchmarks.engine.parity", "--additional-config", value],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and needle in r.stderr and "--additional-config" in r.stderr


def test_trained_weights_prompts_tasks_and_behaviour_gates():
    "Trained weights: text prompts, the behaviour tasks (recall beyond one KDA chunk), and the gates that judge them."
    from types import SimpleNamespace as NS
    assert gp.prompts_for("random") == gp.prompts()
    assert [len(p) for p in gp.prompts_for("trained")] == [16, 5, 110, 47, 200]
    t = gp.behaviour_tasks()
    assert [len(t[k]) for k in ("facts", "recall", "copy")] == [40, 256, 16]
    assert all(len(x) == 1 for _, x in t["recall"]) and min(len(p) for p, _ in t["recall"]) > 64
    assert all(len(x) == 41 for _, x in t["copy"])
    a = NS(min_recall=0.95, min_facts=0.95, behaviour_drop=0.03)
    ref = {"facts": 1.0, "recall": 0.99, "copy": 0.9}
    assert gp.judge_behaviour("c", {"facts": 1.0, "recall": 0.97, "copy": 0.9}, ref, a) == []
    f = gp.judge_behaviour("c", {"facts": 0.9, "recall": 0.5, "copy": 0.8}, ref, a)
    assert sum("accuracy" in x for x in f) == 2 and any("copy 0.800 vs the fp32 reference's 0.900" in x for x in f), f


def test_slice_prompts_reach_4k_tokens_inside_the_real_vocabulary():
    ps = gp.slice_prompts()
    assert [len(p) for p in ps] == [5, 130, 700, 4096] and gp.slice_prompts() == ps
    assert all(1000 <= t < 196608 - 1000 for p in ps for t in p)
    assert gp.prompts_for("random", slice_layers=2) == ps and gp.prompts_for("random") == gp.prompts()


def test_a_kernel_given_but_never_launched_fails_the_run():
    "The workers' LaunchProbe records: a given kernel with no launch is a failure line; a failed probe too; old reports have none."
    a = argparse.Namespace(logprob_tol=0.1, logprob_mean_tol=0.05, noise_factor=2.0, min_recall=0.95,
                                                  min_facts=0.95, behaviour_drop=0.03)
    cmp = {"mismatches": [], "near_ties": [], "max_abs_dlogprob": 0.0, "mean_abs_dlogprob": 0.0}
    run = {"single": [cmp], "batched": [cmp]}
    assert gp.judge_run("ct:eager:float32", run, a) == []                               # a report from before the probe
    ok = [{"applied": {"moe_kernels": 2, "gemv": 0}, "launches": {"moe_decode_triton": 7}}]
    assert gp.judge_run("ct:eager:float32", {**run, "launches": ok}, a) == []
    bad = [ok[0], {"applied": {"gemv": 12, "router_kernel": 2}, "launches": {"route_triton": 3}}]
    assert gp.judge_run("ct:eager:float32", {**run, "launches": bad}, a) == [
        "ct:eager:float32 rank 1: gemv: on in 12 layer(s) but gemv_triton never launched"]
    assert gp.judge_run("ct:eager:float32", {**run, "launches": "AttributeError: no solar_launches"}, a)[0].startswith(
        "ct:eager:float32: no kernel launch record")


def test_a_slice_of_one_layer_is_refused_before_anything_runs():
    r = subprocess.run([sys.executable, "-m", "benchmarks.engine.parity", "--slice", "1"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "--slice 1" in r.stderr and "at least one of each" in r.stderr, r.stderr[-1000:]


def test_long_prompts_for_the_float32_tail():
    "700 and 4,096 tokens: token ids inside the tiny vocabulary (no special ids) for random weights, the corpus for trained ones."
    for w in ("random", "trained"):
        ps = gp.long_prompts(w)
        assert [len(p) for p in ps] == [700, 4096] and gp.prompts_for(w, long=True) == ps
        assert all(0 <= t < 1024 for p in ps for t in p)
    assert all(142 <= t for p in gp.long_prompts("random") for t in p)


def test_traps_through_the_engine_are_judged_by_the_chapters_margins():
    "--traps: each trap must take its behaviours train.TRAP_CAUGHT's margins under the floors; one that does not, or is missing or unplanted, fails."
    from solar_open2.train import TRAP_CAUGHT
    from solar_open2.vllm.model import PLANTABLE_TRAPS
    assert set(PLANTABLE_TRAPS) == set(TRAP_CAUGHT)
    low = {"facts": 1.0, "recall": 0.1, "copy": 0.0}                    # what the reference measures with gate_twice
    caught = {n: {"layers": [6], "scores": dict(low)} for n in TRAP_CAUGHT}
    assert gp.judge_traps("ct:eager:bfloat16", caught) == []
    beta_missed = {**caught, "beta_not_doubled": {"layers": [6], "scores": {"facts": 1.0, "recall": 1.0, "copy": 0.85}}}
    f = gp.judge_traps("ct:eager:bfloat16", beta_missed)                # copy 0.85 is not 0.1 under the floor 0.9
    assert len(f) == 1 and "trap beta_not_doubled: copy 0.850" in f[0], f
    f = gp.judge_traps("c", {**caught, "gate_twice": {"layers": [6], "scores": {"facts": 1.0, "recall": 0.6, "copy": 0.0}}})
    assert len(f) == 1 and "gate_twice: recall 0.600" in f[0], f
    assert gp.judge_traps("c", {n: t for n, t in caught.items() if n != "no_gqa_gate"}) == ["c: trap no_gqa_gate not run"]
    assert "planted in no layer" in gp.judge_traps("c", {**caught, "no_shared_expert": {"layers": [0], "scores": low}})[0]
    a = argparse.Namespace(logprob_tol=0.1, logprob_mean_tol=0.05, noise_factor=2.0, min_recall=0.95, min_facts=0.95, behaviour_drop=0.03)
    cmp = {"mismatches": [], "near_ties": [], "max_abs_dlogprob": 0.0, "mean_abs_dlogprob": 0.0}
    run = {"single": [cmp], "batched": [cmp], "behaviour_traps": beta_missed}
    assert gp.judge_run("ct:eager:float32", run, a) == gp.judge_traps("ct:eager:float32", beta_missed) != []   # judge_run applies it


def test_behaviour_scores_count_whole_answers():
    t = gp.behaviour_tasks()
    right = {k: [x for _, x in v] for k, v in t.items()}
    assert gp.behaviour_scores(right) == {"facts": 1.0, "recall": 1.0, "copy": 1.0}
    off = {**right, "copy": [x[:-1] + [0] for x in right["copy"][:4]] + right["copy"][4:]}   # four copies lose their end
    assert gp.behaviour_scores(off)["copy"] == 12 / 16


def test_bf16_flips_reports_each_flip_with_its_margin_and_gates_on_ties(tmp_path, monkeypatch):
    """benchmarks.engine.bf16_flips on the CPU (one prompt, 8 tokens): a JSON with the flips and their gaps; a bf16 model
    that picks the fp32 runner-up everywhere flips at every position, and with a tie threshold under its gaps fails."""
    import json
    from benchmarks.engine import bf16_flips as bf
    monkeypatch.setattr(bf, "INCOMING", tmp_path / "incoming")             # the repository's incoming/ stays as it is
    rc = bf.main(["--formats", "bf16", "--prompts", "1", "--tokens", "8", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "bf16_flips.json").read_text())
    assert res["positions"] == 8 and set(res["cases"]) == {"bf16:0"} and res["gate"]["passed"] == (rc == 0) == bf.gate(res)
    from solar_open2.checkpoint import tiny_checkpoint
    from benchmarks.engine.parity import load_reference, prompts_for
    m32 = load_reference(tiny_checkpoint("bf16", weights="trained"), "cpu", "float32")
    class RunnerUp(torch.nn.Module):                                      # the fp32 model with each position's best logit pushed last
        def forward(self, ids):
            logits, rest = m32(ids)
            return logits.scatter(-1, logits.argmax(-1, keepdim=True), -1e4), rest
    p = prompts_for("trained")[1]
    c = bf.flips(m32, RunnerUp(), p, 4, "cpu", tie_nats=0.0)
    assert c["flips_at"] == c["mismatches"] == [0, 1, 2, 3] and all(g > 0 for g in c["fp32_gap_at_flips"]), c
    tie = bf.flips(m32, RunnerUp(), p, 4, "cpu", tie_nats=1e3)             # the same flips, all within a huge tie threshold
    assert tie["near_ties"] == [0, 1, 2, 3] and tie["mismatches"] == []
    assert not bf.gate({"positions": 4, "cases": {"x": c}}) and bf.gate({"positions": 4, "cases": {"x": tie}})
    assert not bf.gate({"positions": 0, "cases": {}})

def test_a_token_the_bf16_reference_also_picks_is_a_measured_bf16_flip_not_a_mismatch():
    """A bf16 engine's token off the fp32 argmax is excused only where the bf16 reference, on the same sequence, picks
    that same token (bf16 rounding alone makes the choice); an fp32 engine never is; each off-argmax token's fp32 gap
    is reported."""
    import argparse
    from solar_open2.checkpoint import tiny_checkpoint
    m = gp.load_reference(tiny_checkpoint("bf16"), "cpu")
    prompt = gp.prompts()[1]
    ids = list(prompt)
    for _ in range(5): ids.append(int(gp.reference_logprobs(m, ids, "cpu")[-1].argmax()))
    toks = ids[len(prompt):]
    lp = gp.reference_logprobs(m, ids, "cpu")[len(prompt) - 1:]                           # [6, V]
    second = int(lp[2].topk(2).indices[1])                                                 # the runner-up at position 2
    off = toks[:2] + [second]                                                              # ends there: later tokens would follow it
    got = {"tokens": off, "logprobs": [0.0] * len(off)}

    class Picks:                                                                           # a bf16 reference that picks `second` at 2
        def __init__(self, tok): self.tok = tok
        def __call__(self, x):
            logits, st = m(x)
            logits = logits.clone(); logits[0, len(prompt) - 1 + 2, self.tok] += 100.0
            return logits, st
    gap = float(lp[2].max() - lp[2, second])
    flip = gp.compare(m, prompt, got, "cpu", 0.0, Picks(second))
    assert (flip["mismatches"], flip["bf16_flips"]) == ([], [2]) and flip["gaps"] == {"2": round(gap, 4)}
    a = argparse.Namespace(logprob_tol=1e9, logprob_mean_tol=1e9, noise_factor=1e9)
    assert not any("tokens differ" in f for f in gp.judge("x", "bfloat16", [flip], a))
    assert any("tokens differ" in f and "[2]" in f for f in gp.judge("x", "float32", [flip], a))
    other = gp.compare(m, prompt, got, "cpu", 0.0, Picks(toks[2]))                       # the bf16 reference keeps the argmax
    assert other["mismatches"] == [2] and "bf16_flips" not in other
    assert any(f"fp32 gaps [{round(gap, 4)}]" in f for f in gp.judge("x", "bfloat16", [other], a))


def test_a_bf16_divergence_within_two_bf16_ulps_of_the_logit_is_a_near_tie():
    "bf16 cases excuse an off-argmax token whose fp32 logit gap is under BF16_TIE_ULPS bf16 ulps; fp32 cases never."
    assert gp.bf16_ulp(13.1) == 0.0625 and gp.bf16_ulp(-20.0) == 0.125 and gp.bf16_ulp(1.0) == 2.0 ** -7
    import argparse
    a = argparse.Namespace(logprob_tol=1e9, logprob_mean_tol=1e9, noise_factor=1e9)
    c = {"mismatches": [4, 9], "near_ties": [], "gaps": {"4": 0.078, "9": 0.3}, "gap_ulps": {"4": 1.25, "9": 4.8},
         "max_abs_dlogprob": 0.0, "mean_abs_dlogprob": 0.0, "min_top2_margin": 0.0,
         "noise_floor_bf16_reference": {"mean_abs_dlogprob": 1.0}}
    assert [f for f in gp.judge("x", "bfloat16", [c], a) if "tokens differ" in f] == ["x seq 0: tokens differ from the fp32 reference's argmax at [9] (fp32 gaps [0.3] nats)"]
    assert any("at [4, 9]" in f for f in gp.judge("x", "float32", [c], a))
    assert not any("tokens differ" in f for f in gp.judge("x", "bfloat16", [{**c, "gap_ulps": {"4": 1.9, "9": 1.99}}], a))


def test_eager_and_graphs_may_part_only_at_a_bf16_near_tie():
    "mode_divergences: the first position where the two modes' tokens differ, who left the argmax there, and whether judge excuses it."
    import argparse
    def case(tokens, off, ulps):                                       # one prompt; `off`: the position this run left the argmax
        c = {"mismatches": [off] if off is not None else [], "near_ties": [], "gap_ulps": {} if off is None else {str(off): ulps}}
        return {"tokens": [tokens], "single": [c]}
    a = argparse.Namespace()
    e, g = case([1, 2, 3, 4], None, None), case([1, 2, 9, 9], 2, 0.4)  # graphs took the runner-up at 2, 0.4 ulps under
    d = gp.mode_divergences(e, g, "bfloat16")
    assert d == [{"first_divergence": 2, "off_argmax": ["graphs"], "gap_ulps": {"graphs": 0.4}, "excused": True}]
    rec = {"same_tokens": [False], "divergences": d}
    assert gp.judge_run("x:bfloat16:eager_vs_graphs", rec, a) == []
    far = gp.mode_divergences(e, case([1, 2, 9, 9], 2, 3.0), "bfloat16")                     # 3 ulps: not a near-tie
    assert far[0]["excused"] is False
    assert "[0]" in gp.judge_run("x:bfloat16:eager_vs_graphs", {"same_tokens": [False], "divergences": far}, a)[0]
    assert gp.mode_divergences(e, g, "float32")[0]["excused"] is False                       # fp32 has no bf16 excuse
    assert gp.mode_divergences(e, e, "bfloat16") == [None]
    assert gp.judge_run("x:bfloat16:eager_vs_graphs", {"same_tokens": [False]}, a)           # an old record: identity required


def test_the_committed_slice_run_parts_only_at_near_ties():
    "The real-shapes slice (H100, 2026-12-06): every case passed; eager and graphs part at two bf16 near-ties, re-judged."
    from benchmarks import index
    d = json.loads(index.current("gpu_parity_slice_h100_rejudged.json").read_text())
    assert d["passed"] and d["rejudged_from"]["failures_at_run"]
    div = d["runs"]["compressed-tensors:bfloat16:eager_vs_graphs"]["divergences"]
    assert [x["first_divergence"] for x in div if x] == [60, 39] and all(x["excused"] for x in div if x)
    assert gp.judge_run("compressed-tensors:bfloat16:eager_vs_graphs", {"same_tokens": [True, False, False, True]},
                        argparse.Namespace())                         # the old rule failed it


def test_the_fp32_limits_pass_ieee_dots_and_fail_tf32_at_700_and_4k_tokens():
    "The float32 tail (H100): the same engine and prompts with Triton's dots in IEEE fp32 pass FP32_*_TOL; in TF32 they fail, at both lengths."
    from benchmarks import index
    a = argparse.Namespace(logprob_tol=gp.FP32_MAX_TOL, logprob_mean_tol=gp.FP32_MEAN_TOL, noise_factor=2.0)
    run = lambda f: json.loads(index.current(f).read_text())["runs"]["bf16:eager:float32"]
    ieee, tf32 = run("gpu_parity_tail_ieee_h100.json"), run("gpu_parity_tail_tf32_h100_v2.json")
    assert gp.judge_run("bf16:eager:float32", {k: ieee[k] for k in ("single", "batched")}, a) == []
    fails = gp.judge_run("bf16:eager:float32", {k: tf32[k] for k in ("single", "batched")}, a)
    assert {f.split(": ")[1] for f in fails} >= {"max |dlogprob| 0.3443 > 0.01", "max |dlogprob| 0.0195 > 0.01"}, fails
    assert all(not c["mismatches"] for c in tf32["single"] + tf32["batched"])            # TF32 moved no chosen token


def test_slice_rank_cuts_the_slice_from_one_tp2_rank_and_keeps_its_prompts_in_the_rank_vocabulary(capsys):
    """`--slice-rank` (issue 32): the slice is cut from one TP2 rank of the real model (the per-rank widths, served at
    TP1), so the GEMV pairs' table, which names only the rank's shapes, applies; its prompts lie inside the rank's
    half of the vocabulary; the flag without `--slice` is refused naming it."""
    from solar_open2 import budget
    from solar_open2.checkpoint import slice_config
    from solar_open2.config import SolarOpen2Config
    assert gp.slice_base(False) is None
    real, rank = SolarOpen2Config.real(), gp.slice_base(True)
    assert rank.to_dict() == budget.rank_config(real, 2).to_dict()
    assert (rank.vocab_size, rank.moe_intermediate_size, rank.num_attention_heads) == (
        real.vocab_size // 2, real.moe_intermediate_size // 2, real.num_attention_heads // 2)
    cut = slice_config(2, rank)
    assert cut.num_hidden_layers == 2 and cut.moe_intermediate_size == rank.moe_intermediate_size and cut.hidden_size == real.hidden_size
    ps = gp.prompts_for("random", slice_layers=2, slice_rank=True)
    assert [len(p) for p in ps] == [5, 130, 700, 4096] and all(1000 <= t < rank.vocab_size - 1000 for p in ps for t in p)
    assert gp.prompts_for("random", slice_layers=2) == gp.slice_prompts()          # the full slice's prompts unchanged
    with pytest.raises(SystemExit) as e: gp.main(["--slice-rank"])
    assert e.value.code == 2 and "--slice-rank: needs --slice N" in capsys.readouterr().err


def _merge(files, out, name="m"):
    a = gp.main(["--merge", *map(str, files), "--out", str(out), "--name", name])
    return a, (json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").exists() else None)


def test_merge_of_the_rank_slice_halves_is_the_committed_report(tmp_path):
    """The rank slice (H100, 2026-12-07) ran as two calls: eager (graphs past the first call's deadline), then graphs
    alone. `--merge` gives one report: both cases, eager vs graphs from their tokens (four prompts part, each at a bf16
    near-tie: excused), no deadline failure for a case the other half ran; and it is the committed current file."""
    from benchmarks import index
    halves = [index.path(f"gpu_parity_slice_rank_{m}_h100.json") for m in ("eager", "graphs")]
    assert json.loads(halves[0].read_text())["failures"] == ["compressed-tensors:graphs:bfloat16: not run (deadline)"]
    rc, rep = _merge(halves, tmp_path)
    assert rc == 0 and rep["passed"] and rep["failures"] == []
    div = rep["runs"]["compressed-tensors:bfloat16:eager_vs_graphs"]["divergences"]
    assert [d["first_divergence"] for d in div] == [14, 15, 54, 52] and all(d["excused"] for d in div)
    committed = json.loads(index.current("gpu_parity_slice_rank_h100.json").read_text())
    assert committed["runs"] == rep["runs"] and committed["passed"]
    for r in (committed["runs"][f"compressed-tensors:{m}:bfloat16"] for m in ("eager", "graphs")):
        assert {"gemv_triton", "gemv_pair_triton", "moe_decode_triton", "route_triton", "kda_decode_lr_triton"} <= set(r["launches"][0]["launches"])


def test_merge_refuses_reports_of_different_runs_or_a_case_twice_and_keeps_an_unrun_case_failing(tmp_path, capsys):
    from benchmarks import index
    e, g = (json.loads(index.path(f"gpu_parity_slice_rank_{m}_h100.json").read_text()) for m in ("eager", "graphs"))
    def put(name, rep): (tmp_path / name).write_text(json.dumps(rep)); return tmp_path / name
    other = put("other.json", {**g, "source_sha256": "0" * 16})
    rc, _ = _merge([put("e.json", e), other], tmp_path / "o1")
    assert rc == 2 and "'source_sha256'" in capsys.readouterr().err          # other code: not halves of one run
    rc, _ = _merge([tmp_path / "e.json", put("e2.json", e)], tmp_path / "o2")
    assert rc == 2 and "compressed-tensors:eager:bfloat16 is in more than one report" in capsys.readouterr().err
    rc, rep = _merge([tmp_path / "e.json"], tmp_path / "o3")                  # the graphs case ran nowhere: still a failure
    assert rc == 1 and rep["failures"] == ["compressed-tensors:graphs:bfloat16: not run (deadline)"]
    bad = {**g, "runs": {k: {**v, "tokens": [t[:10] + [0] * (len(t) - 10) for t in v["tokens"]]} for k, v in g["runs"].items()}}
    rc, rep = _merge([tmp_path / "e.json", put("g.json", bad)], tmp_path / "o4")   # graphs parts from eager where neither is at a tie
    assert rc == 1 and "eager and CUDA graphs differ in tokens" in rep["failures"][0]


def test_the_plugin_sets_ieee_dots_and_the_float32_tail_passes_at_700_and_4k_tokens():
    """The float32 tail's plugin half (H100, 2026-12-07): the launcher left TRITON_F32_DEFAULT empty, the plugin's
    `fp32_ieee_dots` set it to ieee, and every case passes FP32_*_TOL at 700 and 4,096 tokens, alone and batched."""
    from benchmarks import index
    d = json.loads(index.current("gpu_parity_tail_plugin_h100.json").read_text())
    a = argparse.Namespace(logprob_tol=gp.FP32_MAX_TOL, logprob_mean_tol=gp.FP32_MEAN_TOL, noise_factor=2.0,
                           **{k: d[k] for k in ("min_recall", "min_facts", "behaviour_drop")})
    r = d["runs"]["bf16:eager:float32"]
    assert d["passed"] and r["triton_f32_default"] == "ieee" and "TRITON_F32_DEFAULT" not in d["command"]
    assert [c["prompt_len"] for c in r["single"]] == [700, 4096] and gp.judge_run("bf16:eager:float32", r, a) == []
    assert max(c["topk_max_abs_dlogprob"] for c in r["single"] + r["batched"]) < gp.FP32_MAX_TOL / 100


def test_the_rank_slice_launched_every_kernel_that_is_on_by_default():
    """Issue 32's acceptance: at the real shapes (the rank slice, H100, with the emulation backend under which the MoE
    kernels are given) every option that is on by default and has a launcher of its own was given to the model and
    launched, eager and graphs; the one not given, the gate kernel, is on by default but its work moved into the KDA
    decode kernel (`kda_decode_gates`, on), which launched."""
    from benchmarks import index
    from solar_open2.vllm.options import OPTIONS
    from solar_open2.vllm.model import KERNEL_LAUNCHERS
    serves = {"gemv_kernel": "gemv", **{k: k for k in KERNEL_LAUNCHERS if k != "gemv"}}          # option -> apply's record key
    # kda_verify_kernel serves speculative verifies only, which a parity run has none of: the spec runs' gate checks it launched
    on = [o.name for o in OPTIONS if o.default and o.name in serves and o.name != "kda_verify_kernel"]
    assert sorted(on) == ["gemv_kernel", "gemv_pairs", "kda_decode_kernel", "kda_gate_kernel", "moe_kernels", "router_kernel"]
    d = json.loads(index.current("gpu_parity_slice_rank_h100.json").read_text())
    for mode in ("eager", "graphs"):
        w = d["runs"][f"compressed-tensors:{mode}:bfloat16"]["launches"][0]
        for name in on:
            key = serves[name]
            if name == "kda_gate_kernel":
                assert w["applied"][key] == 0 and w["applied"]["kda_decode_gates"] > 0
                continue
            assert w["applied"][key] > 0 and any(w["launches"].get(x, 0) > 0 for x in KERNEL_LAUNCHERS[key]), (mode, name, w)
