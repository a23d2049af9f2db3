"""The checkpoint chapter across chapters: the real checkpoint's key list, preflight per failure, the reader's
errors, the tiny checkpoint's determinism across processes and its tokenizer through transformers."""
import hashlib, json, math, shutil, subprocess, sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from solar_open2 import nvfp4
from solar_open2.checkpoint import (INDEX_NAME, CheckpointError, CheckpointReader, checkpoint_specs, cli_preflight,
                                    preflight, scan_checkpoint, tiny_weights, _tiny_quantized)
from solar_open2.config import SolarOpen2Config

ROOT = Path(__file__).resolve().parents[1]

# --- the real checkpoint's tensors, enumerated by hand from architecture.md §3 (BF16) and §4.2/§4.3 (NVFP4) ---

KDA_TENSORS = {  # §3, KDA layer, prefix model.layers.L.self_attn.
    "q_proj.weight": (8192, 4096), "k_proj.weight": (8192, 4096), "v_proj.weight": (8192, 4096),
    "o_proj.weight": (4096, 8192), "q_conv1d.weight": (8192, 1, 4), "k_conv1d.weight": (8192, 1, 4),
    "v_conv1d.weight": (8192, 1, 4), "f_a_proj.weight": (128, 4096), "f_b_proj.weight": (8192, 128),
    "g_a_proj.weight": (128, 4096), "g_b_proj.weight": (8192, 128), "b_proj.weight": (64, 4096),
    "A_log": (1, 1, 64, 1), "dt_bias": (8192,), "o_norm.weight": (128,)}
GQA_TENSORS = {"q_proj.weight": (8192, 4096), "k_proj.weight": (1024, 4096), "v_proj.weight": (1024, 4096),
               "g_proj.weight": (8192, 4096), "o_proj.weight": (4096, 8192)}
NVFP4_SUFFIXES = {  # §4.2 (Nota, compressed-tensors) and §4.3 (ModelOpt): suffix -> (dtype, shape of [out, in])
    "compressed-tensors": {"weight_packed": ("uint8", lambda o, i: (o, i // 2)),
                           "weight_scale": ("float8_e4m3fn", lambda o, i: (o, i // 16)),
                           "weight_global_scale": ("float32", None), "input_global_scale": ("float32", None)},
    "modelopt": {"weight": ("uint8", lambda o, i: (o, i // 2)), "weight_scale": ("float8_e4m3fn", lambda o, i: (o, i // 16)),
                 "weight_scale_2": ("float32", None), "input_scale": ("float32", None)}}


def real_checkpoint_tensors(convention=None):
    "{name: (dtype, shape or None for a scalar)} of upstage/Solar-Open2-250B (convention None) or its NVFP4 build."
    t = {"model.embed_tokens.weight": ("bfloat16", (196608, 4096)), "model.norm.weight": ("bfloat16", (4096,)),
         "lm_head.weight": ("bfloat16", (196608, 4096))}
    for L in range(48):
        p = f"model.layers.{L}."
        t[p + "input_layernorm.weight"] = ("bfloat16", (4096,))
        t[p + "post_attention_layernorm.weight"] = ("bfloat16", (4096,))
        attn = GQA_TENSORS if L in range(0, 48, 4) else KDA_TENSORS
        t.update({p + "self_attn." + k: ("bfloat16", v) for k, v in attn.items()})
        t[p + "mlp.gate.weight"] = ("bfloat16", (320, 4096))
        t[p + "mlp.gate.e_score_correction_bias"] = ("float32", (320,))
        for x, shp in (("gate", (1280, 4096)), ("up", (1280, 4096)), ("down", (4096, 1280))):
            t[p + f"mlp.shared_experts.{x}_proj.weight"] = ("bfloat16", shp)
            for e in range(320):
                m = p + f"mlp.experts.{e}.{x}_proj"
                if convention is None: t[m + ".weight"] = ("bfloat16", shp); continue
                for suf, (dt, f) in NVFP4_SUFFIXES[convention].items(): t[f"{m}.{suf}"] = (dt, None if f is None else f(*shp))
    return t


@pytest.mark.parametrize("convention,count", [(None, 47_019), ("compressed-tensors", 185_259), ("modelopt", 185_259)])
def test_real_checkpoint_key_list(convention, count):
    want = real_checkpoint_tensors(convention)
    got = {s.name: (s.dtype, tuple(s.shape)) for s in checkpoint_specs(SolarOpen2Config.real(), convention)}
    assert len(want) == count and len(got) == count
    assert set(got) == set(want)
    for n, (dt, shp) in want.items():
        assert got[n][0] == dt, n
        if shp is None: assert got[n][1] in ((), (1,)), n       # a per-tensor global scale
        else: assert got[n][1] == shp, n
    # counts per kind, as architecture.md states them
    names = list(got)
    assert sum(".mlp.experts." in n for n in names) == 48 * 320 * 3 * (1 if convention is None else 4)
    assert sum(n.endswith("self_attn.g_proj.weight") for n in names) == 12         # trap §6.4: 12 GQA output gates
    assert sum(n.endswith("self_attn.f_a_proj.weight") for n in names) == 36


# --- preflight: one test per failure ---------------------------------------------------------------------------

@pytest.fixture
def tree(tiny_checkpoints, tmp_path):
    "A private copy of the compressed-tensors tiny tree, to break."
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints["compressed-tensors"], d)
    return d


def _index(d): return json.loads((d / INDEX_NAME).read_text())
def _write_index(d, idx): (d / INDEX_NAME).write_text(json.dumps(idx, indent=2))
def _shard_of(d, name): return _index(d)["weight_map"][name]


def _rewrite(d, shard, fn):
    "Rewrite one shard through `fn(tensors) -> tensors` and keep the index in step (names and total_size)."
    old = load_file(str(d / shard))
    new = fn(dict(old))
    save_file(new, str(d / shard), metadata={"format": "pt"})
    idx = _index(d)
    for k in set(old) - set(new): del idx["weight_map"][k]
    for k in set(new) - set(old): idx["weight_map"][k] = shard
    idx["metadata"]["total_size"] += sum(t.numel() * t.element_size() for t in new.values()) - \
                                     sum(t.numel() * t.element_size() for t in old.values())
    _write_index(d, idx)


def _only(problems, *needles):
    assert problems, "preflight found nothing"
    assert any(all(n in p for n in needles) for p in problems), problems
    return problems


def test_good_trees_pass(tiny_checkpoints):
    for fmt, d in tiny_checkpoints.items():
        assert preflight(d) == [], fmt
        assert cli_preflight([str(d)]) == 0


def test_missing_shard(tree):
    (tree / "model-00002-of-00004.safetensors").unlink()
    p = preflight(tree)
    assert len(p) == 1 and p[0].startswith("missing shard model-00002-of-00004.safetensors (") and "tensors indexed in it" in p[0]
    assert cli_preflight([str(tree)]) == 1


def test_truncated_shard(tree):
    f = tree / "model-00003-of-00004.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    p = preflight(tree)
    assert len(p) == 1 and p[0].startswith("model-00003-of-00004.safetensors: ") and "the shard is truncated" in p[0], p


def test_incomplete_download(tree):
    part = tree / ".cache" / "huggingface" / "download"
    part.mkdir(parents=True)
    (part / "abc123.incomplete").write_bytes(b"\0" * 10)
    assert preflight(tree) == ["partial download left in the tree: .cache/huggingface/download/abc123.incomplete"]


def test_index_names_missing_tensor(tree):
    name = "model.layers.2.self_attn.b_proj.weight"
    shard = _shard_of(tree, name)
    f = tree / shard
    t = load_file(str(f)); del t[name]; save_file(t, str(f), metadata={"format": "pt"})   # index left as it was
    p = preflight(tree)
    _only(p, f"{INDEX_NAME} names {name} in {shard}, but that shard has no such tensor")
    _only(p, f"missing tensor {name}")


def test_wrong_dtype(tree):
    name = "model.layers.0.self_attn.q_proj.weight"
    shard = _shard_of(tree, name)
    _rewrite(tree, shard, lambda t: {**t, name: t[name].to(torch.float16)})
    assert preflight(tree) == [f"{name} in {shard}: dtype float16, expected bfloat16"]
    with pytest.raises(CheckpointError, match=f"{name} in {shard}: dtype float16"):
        CheckpointReader(tree)


def test_wrong_shape(tree):
    name = "model.layers.1.self_attn.dt_bias"
    shard = _shard_of(tree, name)
    _rewrite(tree, shard, lambda t: {**t, name: t[name][:-1].clone()})
    assert preflight(tree) == [f"{name} in {shard}: shape [511], expected [512]"]


def test_mixed_conventions(tree):
    mod = "model.layers.6.mlp.experts.1.up_proj"
    shard = _shard_of(tree, mod + ".weight_packed")
    def to_modelopt(t):
        ct = {s: t.pop(f"{mod}.{s}") for s in nvfp4.SUFFIXES["compressed-tensors"]}
        q = nvfp4.from_checkpoint(ct, "compressed-tensors", mod)
        return {**t, **{f"{mod}.{s}": v for s, v in nvfp4.to_checkpoint(q, "modelopt").items()}}
    _rewrite(tree, shard, to_modelopt)
    _only(preflight(tree), "mixes NVFP4 conventions")


def test_unindexed_shard(tree):
    shutil.copy(tree / "model-00001-of-00004.safetensors", tree / "model-00005-of-00005.safetensors")
    _only(preflight(tree), "shard model-00005-of-00005.safetensors is not in")


def test_shard_count_disagrees_with_names(tree):
    old, new = "model-00004-of-00004.safetensors", "model-00004-of-00005.safetensors"
    (tree / old).rename(tree / new)
    idx = _index(tree)
    idx["weight_map"] = {k: (new if v == old else v) for k, v in idx["weight_map"].items()}
    _write_index(tree, idx)
    _only(preflight(tree), "shard names disagree on the shard count")


def test_total_size_inconsistent(tree):
    idx = _index(tree); idx["metadata"]["total_size"] += 2; _write_index(tree, idx)
    _only(preflight(tree), "metadata.total_size")


def test_unknown_tensor(tree):
    shard = "model-00001-of-00004.safetensors"
    _rewrite(tree, shard, lambda t: {**t, "model.layers.0.self_attn.q_norm.weight": torch.ones(128, dtype=torch.bfloat16)})
    assert preflight(tree) == [f"unknown tensor model.layers.0.self_attn.q_norm.weight in {shard} (bfloat16 [128]): "
                               "not part of the compressed-tensors NVFP4 checkpoint"]


def test_quantization_config_missing(tree):
    c = json.loads((tree / "config.json").read_text()); del c["quantization_config"]
    (tree / "config.json").write_text(json.dumps(c))
    _only(preflight(tree), "no quantization_config")


def test_ignore_list_misses_a_projection(tree):
    c = json.loads((tree / "config.json").read_text())
    c["quantization_config"]["ignore"].remove("model.layers.4.self_attn.k_proj")
    (tree / "config.json").write_text(json.dumps(c))
    assert preflight(tree) == ["model.layers.4.self_attn.k_proj is BF16 in the checkpoint but quantization_config "
                               "targets it and does not ignore it: vLLM would build it as NVFP4"]


def test_bf16_tree_declaring_nvfp4(tiny_checkpoints, tmp_path):
    d = tmp_path / "bf16"; shutil.copytree(tiny_checkpoints["bf16"], d)
    c = json.loads((d / "config.json").read_text())
    c["quantization_config"] = nvfp4.quantization_config("compressed-tensors", ["lm_head"])
    (d / "config.json").write_text(json.dumps(c))
    _only(preflight(d), "declares quantization_config", "no tensor is NVFP4")


def test_no_config(tree):
    (tree / "config.json").unlink()
    _only(preflight(tree), "no config.json")
    with pytest.raises(CheckpointError, match="no config.json"): CheckpointReader(tree)


def test_cli_preflight_lines(tree, capsys):
    (tree / "model-00002-of-00004.safetensors").unlink()
    (tree / "x.part").write_bytes(b"")
    (tree / "y.tmp").write_bytes(b"")
    assert cli_preflight([str(tree), "--max-lines", "2"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["partial download left in the tree: x.part", "partial download left in the tree: y.tmp", "... and 1 more problems"]
    assert cli_preflight([str(tree)]) == 1
    assert capsys.readouterr().out.splitlines()[2].startswith("missing shard model-00002-of-00004.safetensors")
    with pytest.raises(SystemExit) as e: cli_preflight([])
    assert e.value.code == 2


# --- the reader --------------------------------------------------------------------------------------------------

def test_layers_straddle_shards(tiny_checkpoints):
    "As in Nota's build, some layer's tensors sit in two shards; streaming reads them all."
    with CheckpointReader(tiny_checkpoints["compressed-tensors"]) as r:
        shards = {L: {r.tensors[n].shard for n in r.layer_names(L)} for L in range(8)}
        assert any(len(s) > 1 for s in shards.values()), shards
        n = sum(len(w) for _, w in r.iter_layers(progress=False))
        assert n + 3 == len(r.tensors)


def test_reader_loads_values_written(tiny_checkpoints):
    "The BF16 tree holds exactly `tiny_weights` outside the experts, and the experts' NVFP4 dequantisation."
    w, q = tiny_weights(0), _tiny_quantized(0)
    with CheckpointReader(tiny_checkpoints["bf16"]) as r:
        for L, lw in r.iter_layers(layers=[0, 3], progress=False):
            for k, v in lw.items():
                n = f"model.layers.{L}.{k}"
                if ".experts." in k:
                    assert torch.equal(v, q[n].dequantize(torch.bfloat16)), k
                    plain = nvfp4.quantize(w[n], input_amax=16.0)       # the codec's own scales: same codes and blocks
                    assert torch.equal(q[n].packed, plain.packed) and torch.equal(q[n].scale.float(), plain.scale.float()), k
                    ratio = (q[n].global_scale / plain.global_scale).item()   # global scale moved to a power of two
                    assert 2 ** -0.5 <= ratio <= 2 ** 0.5 and torch.log2(q[n].global_scale).frac().item() == 0, k
                    assert nvfp4.relative_rms(v.float(), w[n].float() * ratio) < 0.15, k    # NVFP4 error of Gaussian weights
                else: assert torch.equal(v, w[n]), k
        assert torch.equal(r.get("lm_head.weight"), w["lm_head.weight"])


# --- the tiny checkpoint: deterministic across processes, tokenizer usable by transformers ------------------------

def _digest(d):
    h = hashlib.sha256()
    for f in sorted(Path(d).iterdir()): h.update(f.name.encode()); h.update(f.read_bytes())
    return h.hexdigest()


def test_make_tiny_deterministic_across_processes(tiny_checkpoints, tmp_path):
    code = f"from solar_open2.checkpoint import make_tiny; make_tiny({str(tmp_path / 'x')!r}, 'modelopt')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    assert _digest(tmp_path / "x") == _digest(tiny_checkpoints["modelopt"])


def test_tokenizer_through_transformers(tiny_checkpoints):
    transformers = pytest.importorskip("transformers")
    from solar_open2 import chat
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_checkpoints["compressed-tensors"]))
    assert len(tok) == 1024 and tok.eos_token_id == 2 and tok.bos_token_id == 1
    for s, i in chat.SPECIAL_TOKENS.items(): assert tok.convert_tokens_to_ids(s) == i
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The capital of Japan is?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == chat.render_chat(msgs)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 128 and ids[-1] == chat.SPECIAL_TOKENS[chat.THINK_START]


# --- the trained tiny weights (chapter 06a_train): the committed file, its hash, the three formats -----------------

def test_trained_tiny_file_matches_its_recorded_hash():
    import hashlib, json
    from solar_open2.checkpoint import TINY_TRAINED_FILE, TINY_TRAINED_SHA256
    sha = hashlib.sha256(TINY_TRAINED_FILE.read_bytes()).hexdigest()
    assert sha == TINY_TRAINED_SHA256
    assert json.loads(TINY_TRAINED_FILE.with_name(TINY_TRAINED_FILE.name + ".json").read_text())["sha256"] == sha


# The built-in checkpoint's weight shards, built from the committed weights (`make run` loads the first): their
# sha256 over (name, bytes) in name order. A change in the weights, the NVFP4 codec, the tensor layout or the sharding
# changes them: update these only with the change that explains it.
TRAINED_TREE_SHA256 = {   # the NVFP4 trees since gate and up share a global scale (chapter checkpoint); bf16 unchanged by it
    "compressed-tensors": "15719a323c5da2270f8c4a3ebfec5a5bf97b4a8fe12531d470ff84962f3697c0",
    "modelopt": "d6f3a2691b3e22dccba6b25afdf80e5a28924a2920dbfd3dd790bf29c4899928",
    "bf16": "06c319eeeec5de755dea3e64ecd4e5f5414e9a3d303f937a5a4a6922dd97946f",
}


def test_trained_tiny_checkpoint_in_every_format_is_one_model_with_pinned_shards(tmp_path):
    import torch
    from solar_open2.checkpoint import TINY_FORMATS, make_tiny
    from solar_open2.model import SolarOpen2ForCausalLM
    assert set(TRAINED_TREE_SHA256) == set(TINY_FORMATS)
    ids = torch.tensor([[464, 3, 77, 12, 900, 5, 64, 1000]])
    logits = {}
    for f in TINY_FORMATS:
        d = make_tiny(tmp_path / f, f, weights="trained")
        assert json.loads((d / "solar_open2_tiny.json").read_text())["weights"] == "trained"
        h = hashlib.sha256()
        for sh in sorted(d.glob("*.safetensors")): h.update(sh.name.encode()); h.update(sh.read_bytes())
        assert h.hexdigest() == TRAINED_TREE_SHA256[f], f"{f}: the built-in checkpoint's shards changed"
        with torch.no_grad(): logits[f] = SolarOpen2ForCausalLM.from_pretrained(d)(ids)[0]
    assert torch.allclose(logits["modelopt"], logits["compressed-tensors"], atol=1e-5)
    assert torch.allclose(logits["bf16"], logits["compressed-tensors"], atol=2e-2, rtol=2e-2)   # experts in bf16, not re-quantized


def test_trained_tiny_refuses_a_damaged_file(tmp_path, monkeypatch):
    import pytest
    from solar_open2 import checkpoint
    bad = tmp_path / "tiny_trained.safetensors"
    data = bytearray(checkpoint.TINY_TRAINED_FILE.read_bytes()); data[-1] ^= 1
    bad.write_bytes(bytes(data))
    monkeypatch.setattr(checkpoint, "TINY_TRAINED_FILE", bad)
    with pytest.raises(ValueError, match="sha256"): checkpoint.make_tiny(tmp_path / "out", weights="trained")
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(checkpoint, "TINY_TRAINED_FILE", tmp_path / "missing.safetensors")
    with pytest.raises(FileNotFoundError, match="missing"): checkpoint.make_tiny(tmp_path / "out2", weights="trained")



def test_make_tiny_from_a_trained_file_checks_its_record(tmp_path):
    "weights=FILE (what `python -m solar_open2.train` writes): used when FILE.json's sha256 matches, refused otherwise."
    import shutil, pytest
    from solar_open2 import checkpoint
    f = tmp_path / "mine.safetensors"
    shutil.copyfile(checkpoint.TINY_TRAINED_FILE, f)
    with pytest.raises(FileNotFoundError, match=r"mine\.safetensors\.json"): checkpoint.make_tiny(tmp_path / "a", weights=str(f))
    (tmp_path / "mine.safetensors.json").write_text(json.dumps({"sha256": "0" * 64}))
    with pytest.raises(ValueError, match="sha256"): checkpoint.make_tiny(tmp_path / "b", weights=str(f))
    (tmp_path / "mine.safetensors.json").write_text(json.dumps({"sha256": checkpoint.TINY_TRAINED_SHA256}))
    d = checkpoint.make_tiny(tmp_path / "c", "bf16", weights=str(f))
    rec = json.loads((d / "solar_open2_tiny.json").read_text())
    assert rec["weights"] == "trained" and rec["sha256"] == checkpoint.TINY_TRAINED_SHA256
    ref = checkpoint.make_tiny(tmp_path / "d", "bf16", weights="trained")
    for sh in sorted(p.name for p in ref.glob("*.safetensors")):
        assert (ref / sh).read_bytes() == (d / sh).read_bytes()
    with pytest.raises(FileNotFoundError, match="one of"): checkpoint.make_tiny(tmp_path / "e", weights="traind")
    assert not any((tmp_path / x).exists() for x in "abe")


# --- issue 32.1: quantization targets resolved the way compressed-tensors resolves them -----------------------------

@pytest.mark.parametrize("targets,ignore", [
    (["Linear"], None),                                                        # llm-compressor's default: ignore every BF16 layer
    (["re:.*mlp\\.experts\\..*"], ["lm_head"]),                                  # the experts by regex
    (["re:.*experts\\.[0-6]\\..*"], ["lm_head"]),                                # misses expert 7
    (["re:.*mlp\\.experts\\..*"], ["lm_head", "re:.*experts\\.0\\..*"]),         # ignores expert 0
    (["Linear"], ["lm_head", "re:.*self_attn\\..*", "re:.*mlp\\.gate$"]),        # the shared experts forgotten
    (["re:.*"], ["re:.*(self_attn|gate$|shared_experts|lm_head).*"]),
])
def test_quantization_targets_follow_compressed_tensors(targets, ignore):
    ct = pytest.importorskip("compressed_tensors.utils.match")
    from solar_open2.checkpoint import bf16_linear_modules, quantization_problems, routed_expert_modules
    cfg = SolarOpen2Config.tiny()
    bf16, experts = bf16_linear_modules(cfg), routed_expert_modules(cfg)
    q = nvfp4.quantization_config("compressed-tensors", bf16 if ignore is None else ignore)
    q["config_groups"]["group_0"]["targets"] = targets
    lin = torch.nn.Linear(1, 1)
    want = ([f"{m} is BF16" for m in bf16 if ct.is_match(m, lin, targets, q["ignore"])] +
            [f"{m} is NVFP4" for m in experts if not ct.is_match(m, lin, targets, q["ignore"])])
    got = [" ".join(x.split()[:3]) for x in quantization_problems(q, "compressed-tensors", cfg)]
    assert got == want


# --- issue 32.4: a bf16 e_score_correction_bias is accepted with a warning and used in fp32 -------------------------

def test_bf16_correction_bias_is_accepted_with_a_warning(tmp_path):
    import warnings
    from solar_open2.checkpoint import make_tiny, scan_checkpoint
    from solar_open2.model import SolarOpen2ForCausalLM
    src = make_tiny(tmp_path / "src", "bf16")
    d = tmp_path / "b16"; shutil.copytree(src, d)
    idx = json.loads((d / INDEX_NAME).read_text())["weight_map"]
    name = "model.layers.3.mlp.gate.e_score_correction_bias"
    shard = d / idx[name]
    t = load_file(str(shard)); want = t[name].to(torch.bfloat16); t[name] = want
    save_file(t, str(shard), metadata={"format": "pt"})
    ix = json.loads((d / INDEX_NAME).read_text()); ix["metadata"]["total_size"] -= 2 * want.numel()   # the index stays true
    (d / INDEX_NAME).write_text(json.dumps(ix))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = scan_checkpoint(d)
    assert not [p for p in s.problems if "correction_bias" in p], s.problems
    assert any(name in str(x.message) and "accepted" in str(x.message) for x in w)
    m = SolarOpen2ForCausalLM.from_pretrained(d)
    b = m.model.layers[3].mlp.gate.e_score_correction_bias
    assert b.dtype == torch.float32 and torch.equal(b, want.float())


def test_compressed_tensors_dequantization_is_theirs_bit_for_bit():
    "32.3: a compressed-tensors weight dequantizes as compressed-tensors' own `_dequantize` does (scale / divisor)."
    import torch
    fh = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward_helpers")
    from solar_open2.nvfp4 import E2M1_VALUES, GROUP_SIZE, from_checkpoint, quantize, to_checkpoint, unpack_codes
    torch.manual_seed(3)
    for amax_scale in (0.05, 0.37, 3.1):
        q = quantize(torch.randn(64, 128) * amax_scale)
        ct = to_checkpoint(q, "compressed-tensors")
        vals = E2M1_VALUES[unpack_codes(q.packed).long()]                                # [64, 128] E2M1 values
        theirs = fh._dequantize(vals, q.scale.float().repeat_interleave(GROUP_SIZE, 1), global_scale=ct["weight_global_scale"])
        ours = from_checkpoint(ct, "compressed-tensors", "x").dequantize(torch.float32)
        assert torch.equal(ours, theirs), (amax_scale, (ours != theirs).float().mean().item())


def test_real_metadata_variant(tmp_path):
    """32: the tiny checkpoint with the real files' metadata (regex targets and `ignore: [lm_head]`, EOS 2 in config.json
    and [2, 129] in generation_config.json, global scales 448*6/amax): read strictly, dequantized as compressed-tensors
    does, one model in every format, and the trained weights answer and stop at <|im:end|> from generation_config.json."""
    import torch
    from solar_open2 import chat, nvfp4
    from solar_open2.checkpoint import TINY_FORMATS, make_tiny, quantization_problems, tiny_tokenizer
    from solar_open2.config import SolarOpen2Config
    from solar_open2.model import SolarOpen2ForCausalLM
    ids = torch.tensor([[464, 3, 77, 12, 900, 5, 64, 1000]])
    logits = {}
    for f in TINY_FORMATS:
        d = make_tiny(tmp_path / f, f, variant="real-metadata")
        c = json.loads((d / "config.json").read_text())
        assert c["eos_token_id"] == 2 and json.loads((d / "generation_config.json").read_text())["eos_token_id"] == [2, 129]
        assert json.loads((d / "solar_open2_tiny.json").read_text())["variant"] == "real-metadata"
        if f == "compressed-tensors":
            q = c["quantization_config"]
            assert q["ignore"] == ["lm_head"] and q["config_groups"]["group_0"]["targets"] == [r"re:.*mlp\.experts\..*"]
            assert quantization_problems(q, f, SolarOpen2Config.tiny()) == []
            from safetensors import safe_open
            idx = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
            n = "model.layers.1.mlp.experts.3.down_proj.weight_global_scale"
            with safe_open(str(d / idx[n]), "pt") as fh: g = fh.get_tensor(n)
            assert g.item() != 2.0 ** round(math.log2(g.item()))                        # not a power of two
        m = SolarOpen2ForCausalLM.from_pretrained(d)
        assert m.generation_eos == [2, 129]
        with torch.no_grad(): logits[f] = m(ids)[0]
    assert torch.allclose(logits["modelopt"], logits["compressed-tensors"], atol=1e-4)    # divisor vs multiplier: last bits
    rel = ((logits["bf16"] - logits["compressed-tensors"]).norm() / logits["compressed-tensors"].norm()).item()
    assert rel < 1e-2, rel       # the twin rounds the dequantized experts to bf16 (exact only under power-of-two globals)
    m = SolarOpen2ForCausalLM.from_pretrained(make_tiny(tmp_path / "trained", weights="trained", variant="real-metadata"))
    tok = tiny_tokenizer()
    prompt = tok.encode(chat.render_chat([{"role": "user", "content": "The capital of Japan is"}]), add_special_tokens=False).ids
    g = m.generate(prompt, max_new_tokens=16)[0]
    assert g.finish_reason == "stop" and g.tokens[-1] == 129 and "Tokyo" in tok.decode(g.tokens)
