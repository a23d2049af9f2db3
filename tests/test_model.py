"""The reference model on the built-in tiny checkpoint: cache consistency, NVFP4 vs BF16 twin vs both conventions,
batches, generation, streaming, the `generate` command. Every test loads the session's tiny checkpoints."""
import json, math, os, subprocess, sys
from pathlib import Path

import pytest
import torch

from solar_open2.checkpoint import CheckpointReader, CheckpointError, INDEX_NAME, TINY_TRAINED_SHA256, TINY_VERSION
from solar_open2.config import SolarOpen2Config
from solar_open2.model import SolarOpen2ForCausalLM, cli_generate, sample, streamed_logits

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [128, 463, 132, 309, 329, 298, 852, 292, 33, 129, 215, 128, 77, 5, 901, 33, 640]


@pytest.fixture(scope="module")
def models(tiny_checkpoints):
    "{format: fp32 model} for the three tiny checkpoints."
    return {f: SolarOpen2ForCausalLM.from_pretrained(d, cache_experts=True) for f, d in tiny_checkpoints.items()}


def _logits(m, ids):
    with torch.no_grad(): return m(torch.tensor(ids))[0]


@pytest.mark.parametrize("fmt", ["compressed-tensors", "bf16"])
def test_full_forward_equals_prefill_then_decode(models, fmt):
    m = models[fmt]
    ids = torch.tensor([PROMPT, PROMPT[::-1]])                      # batch of 2 in lockstep
    with torch.no_grad():
        full, _ = m(ids)
        for split in (1, 6, 16):
            out, cache = m(ids[:, :split])
            steps = [out]
            for t in range(split, ids.shape[1]):
                lg, cache = m(ids[:, t:t + 1], cache)
                steps.append(lg)
            err = (full - torch.cat(steps, 1)).abs().max().item()
            assert err <= 1e-4, (split, err)
            assert cache.seq_len == ids.shape[1]


def test_nvfp4_and_bf16_twin_give_the_same_logits(models):
    ids = [PROMPT]
    ct, mo, bf = (_logits(models[f], ids) for f in ("compressed-tensors", "modelopt", "bf16"))
    assert torch.equal(ct, mo)                                      # the two conventions: bit-identical
    assert (ct - bf).abs().max().item() <= 1e-5                     # NVFP4 vs dequantised twin (measured: 0)
    assert ct.std().item() > 1.0                                    # and they are not trivially equal


def test_twins_agree_in_bf16_compute(tiny_checkpoints):
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        ct, bf = (SolarOpen2ForCausalLM.from_pretrained(tiny_checkpoints[f], dtype=torch.bfloat16)(ids)[0]
                  for f in ("compressed-tensors", "bf16"))
    assert torch.equal(ct, bf)


def test_loading_dequantised_equals_twin(tiny_checkpoints, models):
    m = SolarOpen2ForCausalLM.from_pretrained(tiny_checkpoints["modelopt"], experts="bf16")
    assert m.expert_format == "bf16"
    assert torch.equal(_logits(m, [PROMPT]), _logits(models["bf16"], [PROMPT]))


def test_batch_equals_each_sequence(models):
    m = models["compressed-tensors"]
    rows = [PROMPT[:10], PROMPT[3:13], PROMPT[7:17]]
    batch = _logits(m, rows)
    for i, r in enumerate(rows):
        assert (batch[i] - _logits(m, [r])[0]).abs().max().item() <= 1e-4   # fp32, other GEMM shapes


def test_generate_prompts_of_different_lengths(models):
    m = models["compressed-tensors"]
    ps = [PROMPT[:3], PROMPT, PROMPT[5:12]]
    gens = m.generate(ps, max_new_tokens=10, eos_token_ids=[])
    for p, g in zip(ps, gens):
        assert g.tokens == m.generate(p, max_new_tokens=10, eos_token_ids=[])[0].tokens
        full = _logits(m, [p + g.tokens])[0]
        assert full[len(p) - 1:-1].argmax(-1).tolist() == g.tokens       # greedy = argmax of a full re-run
        assert g.finish_reason == "length" and g.tokens_per_s > 0


def test_generate_stops_on_eos(models):
    m = models["bf16"]
    g = m.generate(PROMPT, max_new_tokens=10, eos_token_ids=[])[0]
    stop = m.generate(PROMPT, max_new_tokens=10, eos_token_ids=[g.tokens[2]])[0]
    assert stop.tokens == g.tokens[:3] and stop.finish_reason == "stop"
    assert SolarOpen2Config.tiny().eos_token_ids == [2, 129]


def test_sampling_is_seeded_and_top_p_narrows(models):
    "The tiny model's top-2 margins are several nats (its successor map), so temperature 1 is ~greedy: sample at 3."
    m = models["compressed-tensors"]
    run = lambda **kw: m.generate(PROMPT, max_new_tokens=12, eos_token_ids=[], **kw)[0].tokens
    a, b = run(temperature=3.0, seed=1), run(temperature=3.0, seed=1)
    assert a == b and a != run(temperature=3.0, seed=2) and a != run()
    assert run(temperature=3.0, top_p=1e-6, seed=5) == run()        # a vanishing nucleus is greedy
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    draws = torch.stack([sample(logits, 1.0, 0.8, torch.Generator().manual_seed(i)) for i in range(200)])
    assert set(draws.flatten().tolist()) == {0, 1}                   # p = .64/.24/.09/.03: nucleus {0, 1} for 0.8
    draws = torch.stack([sample(logits, 1.0, 0.6, torch.Generator().manual_seed(i)) for i in range(50)])
    assert set(draws.flatten().tolist()) == {0}                      # 0.64 >= 0.6: the top token alone


def test_logits_not_degenerate(models):
    "Spread out, confident (top-2 margin > 2 nats: BF16 cannot flip a greedy token), choices at temperature 3, varied."
    lg = _logits(models["compressed-tensors"], [PROMPT])[0]           # [T, V]
    p = torch.softmax(lg / 3.0, -1)
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)                     # [T] at temperature 3 (measured mean 1.9 nats)
    top2 = lg.topk(2, -1).values
    assert 1.0 < lg.std(-1).mean().item() < 10
    assert (top2[:, 0] - top2[:, 1]).min().item() > 2.0               # measured 7.5
    assert 1.0 < ent.mean().item() < math.log(1024) - 0.5
    assert len(set(lg.argmax(-1).tolist())) > len(PROMPT) // 2


def test_streamed_logits_equal_forward(tiny_checkpoints, models):
    ids = torch.tensor([PROMPT])
    with CheckpointReader(tiny_checkpoints["compressed-tensors"]) as r:
        s = streamed_logits(r, ids)
    assert (s - _logits(models["compressed-tensors"], [PROMPT])).abs().max().item() <= 1e-4


def test_from_pretrained_refuses_a_broken_tree(tiny_checkpoints, tmp_path):
    import shutil
    d = tmp_path / "x"; shutil.copytree(tiny_checkpoints["bf16"], d)
    (d / "model-00002-of-00004.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing shard model-00002-of-00004.safetensors"):
        SolarOpen2ForCausalLM.from_pretrained(d)


def test_real_config_model_has_the_checkpoint_keys():
    "Built on the meta device, the real 250B model's layers hold exactly Nota's checkpoint keys (one layer of each type)."
    from solar_open2.checkpoint import checkpoint_specs
    from solar_open2.model import SolarOpen2DecoderLayer
    cfg = SolarOpen2Config.real()
    for L in (0, 1):                                                 # full attention, KDA; the others repeat these
        with torch.device("meta"): layer = SolarOpen2DecoderLayer(cfg, L, "compressed-tensors")
        want = {s.name.removeprefix(f"model.layers.{L}.") for s in checkpoint_specs(cfg, "compressed-tensors", [L])}
        assert set(layer.state_dict()) == want and len(want) == (2 + 5 if L == 0 else 2 + 15) + 2 + 3 + 320 * 3 * 4
    small = SolarOpen2Config.from_dict({**cfg.to_dict(), "num_hidden_layers": 1, "gqa_layers": [0], "layer_types": None})
    with torch.device("meta"): m = SolarOpen2ForCausalLM(small, "compressed-tensors")
    outer = {k for k in m.state_dict() if not k.startswith("model.layers.")}
    assert outer == {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert m.model.embed_tokens.weight.shape == m.lm_head.weight.shape == (196608, 4096)


def test_cli_generate_builds_the_builtin_checkpoint_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SOLAR_OPEN2_CACHE", str(tmp_path / "cache"))
    assert cli_generate(["--prompt", "The capital of Japan is", "--max-new-tokens", "16"]) == 0
    out = capsys.readouterr().out.splitlines()
    d = tmp_path / "cache" / f"tiny-nvfp4-trained-{TINY_TRAINED_SHA256[:12]}-v{TINY_VERSION}"
    assert (d / INDEX_NAME).exists() and str(d) in out[0] and "compressed-tensors" in out[0]
    assert out[1].endswith("(chat template)") and "tokens/s" in out[-1]
    assert out[2] == "<|think:end|>Tokyo.<|im:end|>" and out[-1].endswith("finish: stop")   # trained: the fact, then the end
    stamp = (d / INDEX_NAME).stat().st_mtime_ns
    assert cli_generate(["--raw", "--max-new-tokens", "2", "--dtype", "bfloat16"]) == 0
    assert (d / INDEX_NAME).stat().st_mtime_ns == stamp               # reused, not rewritten
    assert "(raw)" in capsys.readouterr().out
    assert cli_generate(["--model", str(tmp_path / "none")]) == 2
    assert "none" in capsys.readouterr().err


def test_generate_stops_on_generation_config_eos(tmp_path):
    """Issue 32.2: the real split (config.json eos 2, generation_config.json [2, 129]): generate stops where vLLM would."""
    import shutil
    from solar_open2.checkpoint import tiny_checkpoint
    d = tmp_path / "ck"; shutil.copytree(tiny_checkpoint("bf16"), d)
    prompt = [464, 3, 77, 12, 900]
    free = SolarOpen2ForCausalLM.from_pretrained(d).generate(prompt, max_new_tokens=8, eos_token_ids=[])[0].tokens
    k = next(i for i, t in enumerate(free) if i >= 1 and t not in free[:i] and t != 2)   # a token first made at step k
    c = json.loads((d / "config.json").read_text()); c["eos_token_id"] = 2
    (d / "config.json").write_text(json.dumps(c))
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, free[k]]}))
    m = SolarOpen2ForCausalLM.from_pretrained(d)
    assert m.cfg.eos_token_ids == [2] and m.generation_eos == [2, free[k]]
    g = m.generate(prompt, max_new_tokens=8)[0]
    assert g.tokens == free[:k + 1] and g.finish_reason == "stop"
    (d / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(ValueError, match="generation_config.json"): SolarOpen2ForCausalLM.from_pretrained(d)
