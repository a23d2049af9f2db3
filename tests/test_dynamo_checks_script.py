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


def _case(mism=0, mean=0.01, mx=0.1, logged=("a", "b"), pred=("a", "b")):
    return {"parity": {"mismatches": mism, "topk_mean_abs_dlogprob": mean, "topk_max_abs_dlogprob": mx},
            "pool": {"logged": list(logged), "predicted": list(pred)}}


def test_verdict():
    ok = {"bf16kv_eager": _case(mean=0.02), "fp8_flashinfer_eager": _case(mean=0.08), "fp8_vllm_choice_eager": _case(mism=3)}
    assert C.verdict(ok, 2.0, 0.05, 0.5) == []                     # 0.08 <= 2 x 0.02 + 0.05; the informational case is not judged
    bad = {**ok, "fp8_flashinfer_graphs": _case(mean=0.2, mx=0.7, mism=1, logged=("x", "b"))}
    lines = C.verdict(bad, 2.0, 0.05, 0.5)
    assert len(lines) == 4 and all(l.startswith("fp8_flashinfer_graphs:") for l in lines)
    assert C.verdict({"fp8_flashinfer_eager": {"error": "engine exited 1"}}, 2, 0.05, 0.5) == ["fp8_flashinfer_eager: engine exited 1"]


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
