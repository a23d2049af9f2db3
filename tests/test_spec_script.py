"""The speculative-decoding GPU script (`benchmarks.engine.spec`) on the CPU: the draft head it writes is one vLLM builds
and loads with every weight, the taps scale the published head's, and its gate fails what it must fail."""
import copy, json, os, sys, tempfile
from pathlib import Path

import pytest
import torch

from benchmarks.engine import spec as S
from solar_open2.config import SolarOpen2Config

pytest.importorskip("vllm")


def test_taps_scale_the_published_heads():
    assert S.scaled_taps(48) == [3, 15, 27, 39, 47]
    for L in (8, 12, 24):
        t = S.scaled_taps(L)
        assert len(set(t)) == 5 and all(0 <= x < L for x in t) and t == sorted(t), (L, t)
    with pytest.raises(ValueError, match="do not fit"): S.scaled_taps(3)


def test_the_eagle3_draft_builds_and_loads_in_vllm():
    """vLLM's `SpeculativeConfig(method="eagle3")` on the written head resolves `LlamaForCausalLMEagle3` with five taps
    (fc input 5 x hidden), and its `load_weights` fills every parameter with the file's values (bit-exact)."""
    from safetensors.torch import load_file
    from vllm.config import SpeculativeConfig
    from vllm.model_executor.model_loader.utils import initialize_model
    from solar_open2.checkpoint import tiny_checkpoint
    from solar_open2.vllm.testing import cpu_vllm, cpu_vllm_config
    cfg = SolarOpen2Config.tiny()
    d = Path(tempfile.mkdtemp()) / "draft"
    taps = S.scaled_taps(cfg.num_hidden_layers)
    written = S.write_eagle3_draft(d, cfg, taps)
    base = cpu_vllm_config(tiny_checkpoint("bf16"), dtype="bfloat16")
    sc = SpeculativeConfig(method="eagle3", model=str(d), num_speculative_tokens=S.PUBLISHED_BLOCK,
                           target_model_config=base.model_config, target_parallel_config=base.parallel_config)
    vc = cpu_vllm_config(tiny_checkpoint("bf16"), dtype="bfloat16", speculative_config=sc)
    assert sc.draft_model_config.architectures == ["LlamaForCausalLMEagle3"]
    with cpu_vllm(vllm_config=vc): m = initialize_model(vllm_config=vc, model_config=sc.draft_model_config)
    W = load_file(str(d / "model.safetensors"))
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    m.load_weights(W.items())
    assert m.model.num_aux_hidden_states == len(taps) and m.model.fc.weight.shape == (cfg.hidden_size, len(taps) * cfg.hidden_size)
    assert written["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == taps
    qkv = torch.cat([W[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([W["layers.0.mlp.gate_proj.weight"], W["layers.0.mlp.up_proj.weight"]])
    want = {"model.fc.weight": W["fc.weight"], "lm_head.weight": W["lm_head.weight"], "model.embed_tokens.weight": W["embed_tokens.weight"],
            "model.layers.0.self_attn.qkv_proj.weight": qkv, "model.layers.0.mlp.gate_up_proj.weight": gate_up,
            "model.layers.0.self_attn.o_proj.weight": W["layers.0.self_attn.o_proj.weight"],
            "model.layers.0.mlp.down_proj.weight": W["layers.0.mlp.down_proj.weight"]}
    for n, w in want.items(): assert torch.equal(dict(m.named_parameters())[n], w), n
    unfilled = [n for n, p in m.named_parameters() if n != "draft_id_to_target_id" and torch.equal(p, before[n]) and n not in want
                and not n.endswith("norm.weight")]
    assert unfilled == [], unfilled


def _report(**runs):
    blank = lambda: {"mismatches": [], "near_ties": [], "divergence": None}
    out = {"tie_nats": 0.05, "runs": {}}
    for key, r in runs.items():
        r.setdefault("reference", {p: [blank() for _ in range(2)] for p in ("single", "batched")})
        r.setdefault("spec_single", {"draft_tokens": 0, "accepted_tokens": 0})
        r.setdefault("spec_batched", {"draft_tokens": 0, "accepted_tokens": 0})
        out["runs"][key] = r
    return out


def test_the_gate_passes_near_ties_and_fails_real_divergences():
    good = {"spec_single": {"draft_tokens": 10, "accepted_tokens": 7}, "spec_batched": {"draft_tokens": 10, "accepted_tokens": 6}}
    rep = _report(**{"bf16:eager:base": {}, "bf16:eager:ngram_k3": copy.deepcopy(good)})
    assert S.judge(rep) == []
    tie = copy.deepcopy(rep); tie["runs"]["bf16:eager:ngram_k3"]["reference"]["single"][1]["divergence"] = {
        "position": 11, "token": 596, "base_token": 595, "gap_nats": 0.018}
    assert S.judge(tie) == []                                                  # a near-tie: bf16 may pick either
    far = copy.deepcopy(tie); far["runs"]["bf16:eager:ngram_k3"]["reference"]["single"][1]["divergence"]["gap_nats"] = 0.5
    assert any("not a near-tie" in f for f in S.judge(far))
    off = copy.deepcopy(rep); off["runs"]["bf16:eager:ngram_k3"]["reference"]["batched"][0]["mismatches"] = [38]
    assert any("off the fp32 reference's argmax at [38]" in f for f in S.judge(off))
    none = _report(**{"bf16:eager:base": {}, "bf16:eager:ngram_k3": {}})
    assert any("no draft tokens were proposed" in f for f in S.judge(none))
    every = _report(**{"bf16:eager:base": {}, "bf16:eager:ngram_k3": {"spec_single": {"draft_tokens": 5, "accepted_tokens": 5},
                                                                      "spec_batched": {"draft_tokens": 5, "accepted_tokens": 5}}})
    assert any("no rollback exercised" in f for f in S.judge(every))
    nobase = _report(**{"bf16:eager:ngram_k3": copy.deepcopy(good)})
    assert any("no baseline" in f for f in S.judge(nobase))
    broke = _report(**{"bf16:eager:base": {}, "bf16:graphs:eagle3_k3": {"error": "rc 1: CUDA error: an illegal instruction"}})
    assert any("engine failed" in f for f in S.judge(broke))
    unrun = copy.deepcopy(rep); unrun["runs"]["bf16:eager:ngram_k3"].update(applied={"kda_verify_kernel": 4}, launches={"kda_decode_triton": 9})
    assert any("kda_verify_kernel: on in 4 layer(s) but kda_verify_triton never launched" in f for f in S.judge(unrun))
    unrun["runs"]["bf16:eager:ngram_k3"]["launches"]["kda_verify_triton"] = 4
    assert S.judge(unrun) == []                                                # the verify kernel ran: nothing to say


def test_the_plan_runs_baselines_first_and_only_what_is_asked():
    runs = S.plan(["compressed-tensors", "bf16"], ["eager", "graphs"], [1, 3, 5], "eagle3", Path("/d"))
    keys = [":".join(r[:3]) for r in runs]
    assert keys[:4] == ["compressed-tensors:eager:base", "compressed-tensors:graphs:base", "bf16:eager:base", "bf16:graphs:base"]
    assert len(keys) == 4 + 2 * (2 * 4) + 2 * 6                                  # 3 ngram + eagle per mode; 6 more in graphs
    assert {k.split(":")[2] for k in keys if k.endswith("_full")} == {"eagle3_dummy_full", "eagle3_k3_full", "ngram_k3_full"}
    assert [(r[3]["num_speculative_tokens"], r[4], r[5]) for r in runs if r[2] == "ngram_k3_pad"] == \
        [(3, "FULL_AND_PIECEWISE", {"spec_pad_drafts": True})] * 2
    assert [(r[3]["method"], r[3]["num_speculative_tokens"], r[4], r[5]) for r in runs if r[2] == "ngram_gpu_k3_pad"] == \
        [("ngram_gpu", 3, "FULL_AND_PIECEWISE", {"spec_pad_drafts": True})] * 2        # the GPU proposer, async scheduling
    assert [(r[3]["method"], r[4], r[5]) for r in runs if r[2] == "ngram_gpu_k3_pad_nosync"] == \
        [("ngram_gpu", "FULL_AND_PIECEWISE", {"spec_pad_drafts": True, "spec_skip_draft_sync": True})] * 2   # no wait for the counts
    assert {r[5] for r in runs if r[2] not in ("ngram_k3_pad", "ngram_gpu_k3_pad", "ngram_gpu_k3_pad_nosync")} == {None}   # no other run asks for options
    assert {r[3]["method"] for r in runs if r[3] and not r[2].startswith("ngram_gpu") and r[2].startswith("ngram")} == {"ngram"}
    assert {r[4] for r in runs if r[2].endswith("_full")} == {"FULL_AND_PIECEWISE"} and {r[4] for r in runs if r[2] == "eagle3_dummy"} == {None}
    with pytest.raises(ValueError, match="method 'suffix' is not one of"): S.ngram_config(3, "suffix")
    only = S.plan(["bf16"], ["eager", "graphs"], [3], "eagle3", Path("/d"), ["bf16:graphs:eagle3_k3_full"])
    assert [":".join(r[:3]) for r in only] == ["bf16:graphs:base", "bf16:graphs:eagle3_k3_full"]


def test_the_committed_gpu_report_is_judged_by_todays_gate():
    "The current GPU report re-judged from its stored comparisons gives the failures it recorded (nothing hidden, nothing new)."
    from benchmarks import index
    rep = json.loads(index.current("gpu_spec_vllm_0.25.1_run3_h100.json").read_text())
    assert S.judge(rep) == rep["failures"] and not rep["passed"]
    assert {f.split(": ")[0] for f in rep["failures"]} == {f"{fmt}:graphs:eagle3_{n}_full" for fmt in ("compressed-tensors", "bf16")
                                                          for n in ("dummy", "k3")}    # only the explicit full-graph verifies


def test_the_budget_predicts_the_logged_kv_pool_with_speculation_on():
    """vLLM's logged pool ("GPU KV cache size") of every ngram engine of the GPU run (tiny config, TP1, a 1 GiB pool,
    max_model_len 1024) equals the budget's `kv_capacity` with `num_speculative_tokens` k: 1 + k KDA state blocks per
    request, the hybrid block widened with the conv state (272 -> 288 tokens at k = 3)."""
    import re, tarfile
    from benchmarks import index
    from solar_open2 import budget
    cfg, seen = SolarOpen2Config.tiny(), {}
    for run in ("run1", "run3"):                                                 # before and after the last KDA fixes
        with tarfile.open(index.path(f"gpu_spec_vllm_0.25.1_{run}_h100_logs.tgz")) as tf:
            for m in tf.getmembers():
                k = re.search(r"_(base|ngram_k(\d))\.log$", m.name)
                if not k: continue
                logged = re.search(r"GPU KV cache size: ([\d,]+) tokens", tf.extractfile(m).read().decode())
                seen[run + m.name] = (int(k.group(2) or 0), int(logged.group(1).replace(",", "")))
    assert len(seen) == 32                                                       # 2 runs x 2 formats x 2 modes x (base + k = 1, 3, 5)
    for name, (k, logged) in seen.items():
        want = budget.kv_capacity(budget.kv_layout(cfg, tp=1, num_speculative_tokens=k), 1 << 30, 1024)["gpu_kv_cache_tokens"]
        assert want == logged, (name, k, want, logged)


def test_a_reduced_draft_vocabulary_loads_as_vllms_d2t():
    "With `draft_vocab`, vLLM's EAGLE-3 head has an LM head of that many rows and loads the d2t offsets (the first N ids)."
    from safetensors.torch import load_file
    from vllm.config import SpeculativeConfig
    from vllm.model_executor.model_loader.utils import initialize_model
    from solar_open2.checkpoint import tiny_checkpoint
    from solar_open2.vllm.testing import cpu_vllm, cpu_vllm_config
    cfg = SolarOpen2Config.tiny()
    d = Path(tempfile.mkdtemp()) / "draft"
    S.write_eagle3_draft(d, cfg, S.scaled_taps(cfg.num_hidden_layers), draft_vocab=128)
    base = cpu_vllm_config(tiny_checkpoint("bf16"), dtype="bfloat16")
    sc = SpeculativeConfig(method="eagle3", model=str(d), num_speculative_tokens=3, target_model_config=base.model_config,
                           target_parallel_config=base.parallel_config)
    vc = cpu_vllm_config(tiny_checkpoint("bf16"), dtype="bfloat16", speculative_config=sc)
    with cpu_vllm(vllm_config=vc): m = initialize_model(vllm_config=vc, model_config=sc.draft_model_config)
    m.draft_id_to_target_id.data.fill_(7)                                        # so that loading the zeros shows
    m.load_weights(load_file(str(d / "model.safetensors")).items())
    assert m.lm_head.weight.shape[0] == 128 and m.draft_id_to_target_id.tolist() == [0] * 128
    with pytest.raises(ValueError, match="draft_vocab"): S.write_eagle3_draft(d, cfg, [0, 1], draft_vocab=cfg.vocab_size + 1)


def _table(rows):
    return {"cols": ["calls", "h_absmax", "h_nonfinite", "residual_absmax", "residual_nonfinite", "first_bad_call"], "rows": rows}


def test_norm_findings_name_the_first_broken_layer_and_the_outsized_ones():
    """The probe's reading (`--norm-probe`): the lowest row with a non-finite value and the call that saw it first, and the
    rows whose largest |value| is far from the baseline's; the baseline itself is only read for non-finite rows."""
    ok = [[10, 1.0, 0, 2.0, 0, -1]] * 4
    broken = [[10, 1.0, 0, 2.0, 0, -1], [10, 9.0, 0, 2.0, 0, -1], [10, 1.0, 3, 2.0, 0, 7], [10, 1.0, 5, 0.1, 2, 6]]
    runs = {"ct:graphs:base": {"norms_single": _table(ok), "norms_batched": _table(ok)},
            "ct:graphs:eagle3_dummy_full": {"norms_single": _table(ok), "norms_batched": _table(broken)},
            "ct:eager:ngram_k1": {"single": []}}                                # no probe: no finding
    f = S.norm_findings(runs)
    assert set(f) == {"ct:graphs:base:single", "ct:graphs:base:batched", "ct:graphs:eagle3_dummy_full:single",
                      "ct:graphs:eagle3_dummy_full:batched"}
    assert f["ct:graphs:eagle3_dummy_full:single"] == {"first_nonfinite_row": None, "first_bad_call": None, "nonfinite_rows": [],
                                                        "outsized": [], "undersized": []}
    b = f["ct:graphs:eagle3_dummy_full:batched"]
    assert (b["first_nonfinite_row"], b["first_bad_call"], b["nonfinite_rows"]) == (2, 7, [2, 3])
    assert b["outsized"] == [[1, "h_absmax", 9.0]] and b["undersized"] == [[3, "residual_absmax", 0.05]]
    assert f["ct:graphs:base:batched"]["outsized"] == []


def test_the_probe_flag_reaches_the_child_and_its_environment_name_is_the_plugins(monkeypatch):
    "--norm-probe: each child is started with the flag and the plugin's environment variable; without it, neither."
    import argparse
    monkeypatch.delenv(S.NORM_PROBE_ENV, raising=False)
    for on in (True, False):
        a = argparse.Namespace(tokens=8, weights="trained", norm_probe=on)
        cmd = S.child_command(a, Path("/ck"), "graphs", Path("/o.json"), {"method": "ngram"}, "FULL_AND_PIECEWISE")
        assert ("--norm-probe" in cmd) is on and cmd[cmd.index("--child-mode") + 1] == "graphs"
        assert cmd[-2:] == ["--child-cudagraph-mode", "FULL_AND_PIECEWISE"]
        env = S.child_env(a, ["/shim"])
        assert (env.get(S.NORM_PROBE_ENV) == "1") is on and env["PYTHONPATH"].split(os.pathsep)[0] == "/shim"
    pytest.importorskip("vllm")
    from solar_open2.vllm.model import NORM_PROBE_ENV
    assert S.NORM_PROBE_ENV == NORM_PROBE_ENV


def test_a_divergence_within_two_bf16_ulps_is_a_near_tie_and_one_beyond_is_not():
    "The spec gate shares parity's bf16 rule: a divergence whose fp32 gap is under BF16_TIE_ULPS ulps passes, one above fails."
    from benchmarks.engine.parity import BF16_TIE_ULPS
    d = lambda nats, ulps: {"runs": {"ct:eager:base": {"spec_single": {"draft_tokens": 0, "accepted_tokens": 0},
                                                        "spec_batched": {"draft_tokens": 0, "accepted_tokens": 0}},
                                     "ct:eager:ngram_k1": {"spec_single": {"draft_tokens": 10, "accepted_tokens": 4},
                                                            "spec_batched": {"draft_tokens": 10, "accepted_tokens": 4},
                                                            "reference": {"single": [{"mismatches": [], "near_ties": [],
                                                                                      "divergence": {"position": 3, "token": 5, "base_token": 6,
                                                                                                     "gap_nats": nats, "gap_ulps": ulps}}],
                                                                          "batched": []}}},
                            "tie_nats": 0.05}
    assert S.judge(d(0.064, 1.02)) == []
    assert len(S.judge(d(0.064, BF16_TIE_ULPS + 0.5))) == 1
    assert S.judge(d(0.01, 9.0)) == []                                          # under tie_nats: a near-tie either way


def test_explain_calls_a_token_within_two_ulps_a_near_tie():
    "explain: a run token off the fp32 argmax is a near-tie when the two logits are under 2 bf16 ulps apart."
    import torch
    from benchmarks.engine.parity import bf16_ulp

    class M:                                                                    # logits: token 7 at 13.10, token 8 at 13.05 (0.8 ulp)
        def __call__(self, x):
            n = x.shape[1]; lg = torch.zeros(1, n, 16); lg[..., 7] = 13.10; lg[..., 8] = 13.05; lg[..., 9] = 12.5
            return lg, None
    e = S.explain(M(), [1, 2], [8, 7], [7, 7], 0.01, "cpu")
    assert e["mismatches"] == [] and e["near_ties"] == [0]
    assert abs(e["divergence"]["gap_ulps"] - 0.05 / bf16_ulp(13.1)) < 1e-3
    far = S.explain(M(), [1, 2], [9, 7], None, 0.01, "cpu")                     # 0.6 nats: 9.6 ulps
    assert far["mismatches"] == [0]


def test_an_engine_gets_what_is_left_of_the_deadline_plus_the_grace():
    "common.child_timeout (spec's and parity's engines): deadline - t + 60 s for one started at t, never under 60."
    from benchmarks.common import child_timeout
    assert child_timeout(480, 100) == 440 and child_timeout(480, 479) == 61 and child_timeout(480, 600) == 60
    assert child_timeout(300, 0, grace_s=30) == 330


def test_a_run_with_options_hands_them_to_its_child_and_its_engine(monkeypatch):
    """A run's plugin options (`ngram_k3_pad`: `spec_pad_drafts`) reach its child as `--child-options`, which the child's
    parser reads, and its engine's `additional_config` beside `spec_full_graphs`; a run without options gets only that."""
    import argparse, types
    a = argparse.Namespace(tokens=8, weights="trained", norm_probe=False)
    pad = next(r for r in S.plan(["bf16"], ["graphs"], [3], None, None) if r[2] == "ngram_k3_pad")
    cmd = S.child_command(a, Path("/ck"), "graphs", Path("/o.json"), pad[3], pad[4], pad[5])
    assert json.loads(cmd[cmd.index("--child-options") + 1]) == {"spec_pad_drafts": True}
    assert "--child-options" not in S.child_command(a, Path("/ck"), "graphs", Path("/o.json"), None, None)
    seen = []
    class LLM:                                                         # what run_engine hands vLLM, then stop
        def __init__(self, **kw): seen.append(kw); raise RuntimeError("stop")
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=None))
    monkeypatch.setattr(S, "plugin_entry_point", lambda: True)
    child = lambda argv: (S.main(argv + ["--child-model", "/m", "--child-mode", "graphs", "--child-out", "/o.json",
                                         "--child-spec", json.dumps(S.ngram_config(3)), "--child-cudagraph-mode", "FULL_AND_PIECEWISE"]))
    for extra, want in ((["--child-options", json.dumps(pad[5])], {"spec_full_graphs": True, "spec_pad_drafts": True}),
                        ([], {"spec_full_graphs": True})):
        with pytest.raises(RuntimeError, match="stop"): child(extra)    # through the child's own parser
        assert seen[-1]["additional_config"] == {"solar_open2": want}
    from solar_open2.vllm.options import parse_options
    assert parse_options(seen[0]["additional_config"]).spec_pad_drafts                 # a valid option set, kept on
