"""The CPU-testable parts of `benchmarks/engine/dynamo_checks.py` (the Dynamo chapter's GPU checks): prompts, the
budget's predicted log lines against a log, the verdict, the served-answer checks, the plain-word ids."""
import json

import pytest

from benchmarks.engine import dynamo_checks as C


def test_prompts_are_plain_and_fixed():
    ps = C.prompts()
    assert [len(p) for p in ps] == [5, 17, 64, 130, 200] and ps == C.prompts()
    assert all(142 <= t < 1024 for p in ps for t in p)          # no special token (ids < 142) of the chat chapter


def test_predicted_lines_match_a_log():
    pred = C.predicted_lines(2**30, 1024, "fp8")
    assert pred != C.predicted_lines(2**30, 1024, "auto")        # FP8 halves the attention page: another pool
    log = f"INFO 12-02 [kv_cache_utils.py:1] {pred[0]}\nINFO ... {pred[1]}\nINFO Using FLASHINFER backend.\n"
    got = C.logged_lines(log)
    assert [got["kv_cache_size"], got["max_concurrency"]] == pred and got["attention_backends"] == ["FLASHINFER"]
    assert C.logged_lines("nothing")["kv_cache_size"] is None


def _case(mism=0, mean=0.01, mx=0.1, chosen=0.01, logged=("a", "b"), pred=("a", "b")):
    return {"parity": {"mismatches": mism, "topk_mean_abs_dlogprob": mean, "topk_max_abs_dlogprob": mx,
                       "chosen_max_abs_dlogprob": chosen}, "pool": {"logged": list(logged), "predicted": list(pred)}}


def test_verdict():
    # The measured shape (H200, vLLM 0.26.0): the BF16-KV run is itself ~6 nats off in the top-20 tail, FP8 ~10.
    ok = {"bf16kv_eager": _case(mean=0.167, mx=5.86), "fp8_flashinfer_eager": _case(mean=0.229, mx=9.74, chosen=0.05),
          "fp8_vllm_choice_eager": _case(mism=3)}
    assert C.verdict(ok, 2.0, 0.05, 0.5) == []                     # 0.229 <= 2 x 0.167 + 0.05, 9.74 <= 2 x 5.86 + 0.05
    bad = {**ok, "fp8_flashinfer_graphs": _case(mean=0.5, mx=12.0, chosen=0.7, mism=1, logged=("x", "b"))}
    lines = C.verdict(bad, 2.0, 0.05, 0.5)
    assert len(lines) == 5 and all(l.startswith("fp8_flashinfer_graphs:") for l in lines), lines
    assert any("chosen-token" in l for l in lines) and any("max top-20" in l for l in lines)
    assert C.verdict({"fp8_flashinfer_eager": {"error": "engine exited 1"}}, 2, 0.05, 0.5) == ["fp8_flashinfer_eager: engine exited 1"]
    assert C.verdict({"fp8_flashinfer_eager": _case()}, 2, 0.05, 0.5) == ["fp8_flashinfer_eager: no BF16-KV case to judge it against"]
    old = {"bf16kv_eager": _case(), "fp8_flashinfer_eager": _case()}
    del old["fp8_flashinfer_eager"]["parity"]["chosen_max_abs_dlogprob"]
    assert any("--rejudge" in l for l in C.verdict(old, 2, 0.05, 0.5))


def test_compare_reads_json_keys_and_the_chosen_token():
    import torch
    lp = torch.log_softmax(torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]]), -1)     # [n=2, V=3]
    topk = [{"0": float(lp[0, 0]) + 0.1, "1": float(lp[0, 1])}, {"1": float(lp[1, 1]), "2": float(lp[1, 2]) - 0.3}]
    r = C.compare(lp, [0, 1], topk, 0.05)
    assert r["mismatches"] == [] and abs(r["chosen_max_abs_dlogprob"] - 0.1) < 1e-6 and abs(r["topk_max_abs_dlogprob"] - 0.3) < 1e-6
    assert C.compare(lp, [1, 1], [{"1": float(lp[0, 1])}, topk[1]], 0.05)["mismatches"] == [0]


def test_rejudge_refuses_to_overwrite_its_input(tmp_path):
    rep = tmp_path / "dynamo_checks.json"; rep.write_text("{}")
    assert C.main(["--rejudge", str(rep), "--out", str(tmp_path)]) == 2 and rep.read_text() == "{}"


def test_budget_problems():
    ids = [500] * 8 + [C.THINK_END_ID] + [600] * 4
    assert C.budget_problems({"token_ids": ids, "reasoning": "x", "content": "y"}, 8) == []
    assert C.budget_problems({"token_ids": ids, "reasoning": "x", "content": "y"}, 7) == ["budget 7: <|think:end|> at token 8"]
    assert C.budget_problems({"token_ids": [500] * 9, "reasoning": "x", "content": None}, 8)
    assert C.budget_problems({"token_ids": [500] * 9}, None) == []
    assert C.budget_problems({"token_ids": ids}, None) == ["budget none: <|think:end|> at 8"]


def test_plain_word_ids():
    from solar_open2.checkpoint import tiny_checkpoint
    tok = json.loads((tiny_checkpoint() / "tokenizer.json").read_text())
    ids = C.plain_word_ids(tok)
    assert ids and C.THINK_END_ID not in ids and min(ids) > 200
    with pytest.raises(ValueError, match="no plain word tokens"): C.plain_word_ids({"model": {"vocab": {"<|x|>": 5}}})


def test_arguments():
    a = C.parser().parse_args(["--pool-bytes", "2G"])
    assert (a.pool_bytes, a.cases, a.budget) == (2 * 2**30, list(C.CASES), 8)
    assert C.main(["--tokens", "0"]) == 2
    assert C.main(["--cases", "nope"]) == 2
    assert {v[0] for v in C.CASES.values()} == {"auto", "fp8"} and C.CASES["fp8_vllm_choice_eager"][3] is False


def test_engine_options_are_vllms():
    "The engines' keyword arguments are EngineArgs fields (the server's options are parsed by vLLM in test_dynamo.py)."
    import dataclasses
    from vllm.engine.arg_utils import EngineArgs
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for case in C.CASES: assert set(C.engine_kwargs("/m", case, 2**30, 1024)) <= fields, case


def test_shared_gpu_memory_option():
    "`--gpu-memory-utilization` (checks.sh TOGETHER=1) reaches the engines and the server; without it vLLM's default holds."
    assert "gpu_memory_utilization" not in C.engine_kwargs("/m", "bf16kv_eager", 2**30, 1024)
    assert C.engine_kwargs("/m", "bf16kv_eager", 2**30, 1024, 0.08)["gpu_memory_utilization"] == 0.08
    assert "--gpu-memory-utilization" not in C.serve_args(8000, 2**30)
    s = C.serve_args(8000, 2**30, 0.08)
    assert s[s.index("--gpu-memory-utilization") + 1] == "0.08"
    assert C.parser().parse_args(["--gpu-memory-utilization", "0.08"]).gpu_memory_utilization == 0.08


def _greedy_runs(n_new: int = 3, shift: float = 0.0) -> list:
    "Child-style runs of the fp32 reference itself on the tiny checkpoint: greedy tokens and their top-5, `shift` added."
    import torch
    from solar_open2.checkpoint import tiny_checkpoint
    from solar_open2.model import SolarOpen2ForCausalLM
    m = SolarOpen2ForCausalLM.from_pretrained(tiny_checkpoint(), dtype=torch.float32, device="cpu", cache_experts=True)
    runs = []
    with torch.no_grad():
        for p in C.prompts():
            ids, topk = list(p), []
            for _ in range(n_new):
                lp = torch.log_softmax(m(torch.tensor([ids]))[0][0, -1].float(), -1)     # [V]
                v, i = lp.topk(5)
                topk.append({str(int(j)): float(x) + shift for j, x in zip(i, v)}); ids.append(int(i[0]))
            runs.append({"tokens": ids[len(p):], "topk": topk})
    return runs


def test_rejudge_recomputes_parity_from_the_saved_runs(tmp_path):
    "--rejudge: the child outputs beside a report are compared again with the fp32 reference (CPU here) and re-judged."
    pool = {"logged": ["a", "b"], "predicted": ["a", "b"]}
    good, off = _greedy_runs(), _greedy_runs(shift=0.01)
    run = tmp_path / "run"; run.mkdir()
    for name, runs in (("bf16kv_eager", good), ("fp8_flashinfer_eager", off)):
        (run / f"{name}.child.json").write_text(json.dumps({"runs": runs}))
    (run / "dynamo_checks.json").write_text(json.dumps({"command": "x", "cases": {n: {"pool": pool} for n in ("bf16kv_eager", "fp8_flashinfer_eager")},
                                                         "serve": {"problems": []}}))
    assert C.main(["--rejudge", str(run / "dynamo_checks.json"), "--out", str(tmp_path / "a")]) == 0
    res = json.loads((tmp_path / "a" / "dynamo_checks.json").read_text())
    fp8 = res["cases"]["fp8_flashinfer_eager"]["parity"]
    assert res["pass"] and fp8["mismatches"] == 0 and abs(fp8["chosen_max_abs_dlogprob"] - 0.01) < 1e-3
    assert res["cases"]["bf16kv_eager"]["parity"]["chosen_max_abs_dlogprob"] < 1e-4
    bad = [dict(r) for r in off]
    bad[0] = {"tokens": [int(next(iter(bad[0]["topk"][0]))) + 1] + bad[0]["tokens"][1:], "topk": bad[0]["topk"]}
    bad[0]["topk"] = [{**bad[0]["topk"][0], str(bad[0]["tokens"][0]): -30.0}] + bad[0]["topk"][1:]
    (run / "fp8_flashinfer_eager.child.json").write_text(json.dumps({"runs": bad}))
    assert C.main(["--rejudge", str(run / "dynamo_checks.json"), "--out", str(tmp_path / "b")]) == 1
    res = json.loads((tmp_path / "b" / "dynamo_checks.json").read_text())
    assert any("tokens are not the reference's argmax" in p for p in res["problems"]), res["problems"]
