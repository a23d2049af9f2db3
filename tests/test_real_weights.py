"""The layer chapters' "On the real weights" sections, with `SOLAR_OPEN2_CHECKPOINT` pointing at the built-in tiny
checkpoint (the real one is 153 GB): the notebook cells themselves skip without the variable and report with it, and
the report functions agree with the model chapter's layers on the same input, for the tiny model's layer indices."""
import contextlib, io, json
from pathlib import Path

import pytest
import torch

import solar_open2.attention, solar_open2.kda, solar_open2.moe
from solar_open2 import checkpoint
from solar_open2.checkpoint import CHECKPOINT_ENV, CheckpointReader, real_checkpoint
from solar_open2.attention import attention_layer_report, format_attention_report
from solar_open2.kda import kda_layer_report, format_kda_report
from solar_open2.model import SolarOpen2ForCausalLM
from solar_open2.moe import SolarMoE, moe_layer_report, format_moe_report, router_load

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = {"02_kda": (solar_open2.kda, "KDA layer 1:"), "03_attention": (solar_open2.attention, "attention layer 0:"),
            "04_moe": (solar_open2.moe, "MoE layer 1:")}


def real_cell(nb:str)->str:
    "The source of the chapter's cell that runs on `real_checkpoint()` (the last code cell calling it)."
    cells = json.loads((ROOT/"nbs"/f"{nb}.ipynb").read_text())["cells"]
    src = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    hits = [s for s in src if "real_checkpoint()" in s and "is None" in s]
    assert hits, f"{nb}: no cell calls real_checkpoint()"
    return hits[-1]


def run_cell(nb:str)->str:
    "Execute the chapter's real-weights cell in its module's namespace; returns what it printed."
    mod, _ = CHAPTERS[nb]
    ns = {**vars(mod), "real_checkpoint": real_checkpoint, "CHECKPOINT_ENV": CHECKPOINT_ENV}
    out = io.StringIO()
    with contextlib.redirect_stdout(out): exec(compile(real_cell(nb), f"{nb}:real-weights", "exec"), ns)
    return out.getvalue()


@pytest.mark.parametrize("nb", list(CHAPTERS))
def test_cell_skips_without_the_variable(monkeypatch, nb):
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    out = run_cell(nb)
    assert out.count("\n") == 1 and out.startswith(f"{CHECKPOINT_ENV} not set") and f"export {CHECKPOINT_ENV}=" in out


@pytest.mark.parametrize("nb", list(CHAPTERS))
def test_cell_reports_with_the_variable(monkeypatch, tiny_checkpoints, nb):
    monkeypatch.setenv(CHECKPOINT_ENV, str(tiny_checkpoints["compressed-tensors"]))
    out = run_cell(nb)
    assert out.startswith(CHAPTERS[nb][1]) and "not set" not in out
    for needle in {"02_kda": ["decay exp(g)", "beta in (0, 2)", "state norm", "decode vs prefill"],
                   "03_attention": ["gate sigmoid", "first token", "decode vs prefill"],
                   "04_moe": ["router load", "the bias changes", "W4A4 vs W4A16: relative RMS", "re-quantising"]}[nb]:
        assert needle in out, (needle, out)


def test_cell_refuses_a_variable_naming_no_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setenv(CHECKPOINT_ENV, str(tmp_path/"absent"))
    with pytest.raises(checkpoint.CheckpointError, match="not a directory"): run_cell("02_kda")


@pytest.fixture(scope="module")
def model(tiny_checkpoints):
    return SolarOpen2ForCausalLM.from_pretrained(tiny_checkpoints["compressed-tensors"])


@pytest.fixture(scope="module")
def reader(tiny_checkpoints):
    with CheckpointReader(tiny_checkpoints["compressed-tensors"]) as r: yield r


def close_stats(got:dict, want:torch.Tensor, eps=1e-5):
    w = want.double()
    for k, v in (("mean", w.mean()), ("std", w.std()), ("max_abs", w.abs().max())):
        assert abs(got[k] - v.item()) <= eps * max(1.0, abs(v.item())), (k, got[k], v.item())


def test_prompt_input_is_the_models_layer0_input(model, reader):
    x, ids = reader.prompt_input(0)
    with torch.no_grad():
        want = model.model.layers[0].input_layernorm(model.model.embed_tokens(torch.tensor([ids])))
    assert torch.equal(x, want)


@pytest.mark.parametrize("L", [1, 3, 7])
def test_kda_report_matches_the_models_layer(model, reader, L):
    rep = kda_layer_report(reader, L)
    x, _ = reader.prompt_input(L)
    with torch.no_grad(): y, st = model.model.layers[L].self_attn(x)
    close_stats(rep["y"], y)
    assert torch.allclose(rep["state_norm"][0, -1], st.recurrent[0].norm(dim=(-2, -1)), rtol=1e-4)
    assert rep["decode_vs_prefill"] < 1e-5
    assert f"KDA layer {L}: 4 heads x 128" in format_kda_report(rep)


@pytest.mark.parametrize("L", [0, 4])
def test_attention_report_matches_the_models_layer(model, reader, L):
    rep = attention_layer_report(reader, L)
    x, _ = reader.prompt_input(L)
    with torch.no_grad():
        layer = model.model.layers[L].self_attn
        y, _ = layer(x)
        gate = torch.sigmoid(layer.g_proj(x)).view(x.shape[1], 4, 128)
    close_stats(rep["y"], y)
    assert torch.allclose(rep["gate_head_mean"], gate.mean((0, 2)), atol=1e-6)
    assert f"attention layer {L}: 4 query heads / 2 KV heads" in format_attention_report(rep)


@pytest.mark.parametrize("L", [0, 1, 7])
def test_moe_report_matches_the_models_block(model, reader, L):
    rep = moe_layer_report(reader, L)
    x, _ = reader.prompt_input(L, norm="post_attention_layernorm")
    mlp = model.model.layers[L].mlp
    with torch.no_grad(): y = mlp(x[0])
    close_stats(rep["y"], y)
    ld = rep["load"]
    idx, _ = mlp.gate(x[0])
    assert torch.equal(ld["counts"], torch.bincount(idx.flatten(), minlength=8))
    assert rep["experts_read"] == sorted(set(idx.flatten().tolist()))
    assert 0.02 < rep["w4a4"]["routed"] < 0.5 and all(d["rel_rms"] < 1e-6 for d in rep["requant"])
    assert f"MoE layer {L}: 8 routed experts" in format_moe_report(rep)


def test_moe_report_on_the_twins(tiny_checkpoints, reader):
    "The BF16 twin (dequantised experts) gives the same output and routing with no NVFP4 part; ModelOpt gives the same numbers."
    nv = moe_layer_report(reader, 1)
    with CheckpointReader(tiny_checkpoints["bf16"]) as r: bf = moe_layer_report(r, 1)
    with CheckpointReader(tiny_checkpoints["modelopt"]) as r: mo = moe_layer_report(r, 1)
    assert (bf["format"], bf["w4a4"], bf["requant"]) == ("bf16", None, [])
    assert "experts are BF16" in format_moe_report(bf)
    for other in (bf, mo):
        assert torch.equal(other["load"]["counts"], nv["load"]["counts"])
        for k in ("mean", "std", "max_abs"): assert abs(other["y"][k] - nv["y"][k]) <= 1e-6, k
    assert mo["format"] == "modelopt" and abs(mo["w4a4"]["routed"] - nv["w4a4"]["routed"]) <= 1e-6


def test_router_load_without_bias_changes_nothing(reader):
    cfg = reader.config
    moe = SolarMoE.from_tensors(cfg, reader.layer_weights(2, "mlp."), quantization_config=cfg.quantization_config)
    x, _ = reader.prompt_input(2, norm="post_attention_layernorm")
    biased = router_load(moe.gate, x[0])
    assert biased["changed"] > 0                                    # the tiny checkpoint's bias is N(0, 0.5)
    moe.gate.e_score_correction_bias.zero_()
    flat = router_load(moe.gate, x[0])
    assert flat["changed"] == flat["tokens_changed"] == 0 and torch.equal(flat["counts"], flat["counts_unbiased"])
    assert torch.equal(flat["counts_unbiased"], biased["counts_unbiased"])


def test_layer_type_is_checked(reader):
    with pytest.raises(ValueError, match="not a KDA"): kda_layer_report(reader, 4)
    with pytest.raises(ValueError, match="not a full-attention layer"): attention_layer_report(reader, 2)
    with pytest.raises(IndexError, match="layer 8 outside"): moe_layer_report(reader, 8)
