"""Hostile checkpoint trees: nothing outside the tree is opened, no FIFO or device is opened (no hang), headers are
validated as safetensors does, NaN/Inf is caught when loading and at preflight, the content is compared by hash, and
nothing is ever written into the tree."""
import hashlib, json, os, shutil, struct, threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from solar_open2.checkpoint import (INDEX_NAME, CheckpointError, CheckpointReader, cli_preflight, content_manifest,
                                    manifest_problems, preflight, read_header, scan_checkpoint)
from solar_open2.cli import main

SHARD = "model-00001-of-00004.safetensors"


@pytest.fixture
def tree(tiny_checkpoints, tmp_path):
    "A private copy of the compressed-tensors tiny tree, to break; a FIFO decoy sits beside it, outside."
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints["compressed-tensors"], d)
    os.mkfifo(tmp_path / "decoy.safetensors")                  # opening it for reading would block forever
    shutil.copy(d / SHARD, tmp_path / "copy.safetensors")      # a valid shard outside the tree
    return d


def _within(fn, seconds=60):
    "Run `fn` in a thread; fail (instead of hanging the suite) if it blocks, e.g. on a FIFO."
    out = {}
    def run():
        try: out["v"] = fn()
        except BaseException as e: out["e"] = e
    t = threading.Thread(target=run, daemon=True); t.start(); t.join(seconds)
    assert not t.is_alive(), f"{fn} blocked for {seconds} s (a FIFO opened?)"
    if "e" in out: raise out["e"]
    return out["v"]


def _index(d): return json.loads((d / INDEX_NAME).read_text())
def _write_index(d, idx): (d / INDEX_NAME).write_text(json.dumps(idx, indent=2))


def _repoint(d, shard, target):
    "Point every index entry of `shard` at `target` (a string written into the index as is)."
    idx = _index(d)
    idx["weight_map"] = {k: (target if v == shard else v) for k, v in idx["weight_map"].items()}
    _write_index(d, idx)


def _fingerprint(d):
    "Every entry of the tree: type, size, mtime and content hash (files); what 'nothing written' compares."
    out = {}
    for root, dirs, files in os.walk(d, followlinks=False):
        for x in sorted(dirs + files):
            p = Path(root) / x; st = os.lstat(p)
            h = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else os.readlink(p) if p.is_symlink() else None
            out[str(p.relative_to(d))] = (st.st_mode, st.st_size, st.st_mtime_ns, h)
    return out


def _problems(d, **kw): return _within(lambda: preflight(d, **kw))


def _has(problems, *needles):
    assert any(all(n in p for n in needles) for p in problems), problems


# --- names that lead out of the tree, and files that are not files ------------------------------------------

@pytest.mark.parametrize("target", ["../decoy.safetensors", "{tmp}/decoy.safetensors", "sub/../../decoy.safetensors"])
def test_index_entry_outside_is_never_opened(tree, target):
    _repoint(tree, SHARD, target.format(tmp=tree.parent))
    p = _problems(tree)
    _has(p, "points outside the checkpoint directory: never opened")


def test_symlinked_shard_out_of_the_tree_is_never_opened(tree):
    for name, to in ((SHARD, tree.parent / "decoy.safetensors"), ("model-00002-of-00004.safetensors", tree.parent / "copy.safetensors")):
        (tree / name).unlink(); (tree / name).symlink_to(to)
    p = _problems(tree)
    _has(p, SHARD, "a link to", "outside the checkpoint directory: never opened")
    _has(p, "model-00002-of-00004.safetensors", "outside the checkpoint directory")   # a valid shard, but outside: not parsed


@pytest.mark.parametrize("name", [SHARD, "config.json", INDEX_NAME])
def test_fifo_in_the_tree_is_never_opened(tree, name):
    (tree / name).unlink(); os.mkfifo(tree / name)
    _has(_problems(tree), "a FIFO, not a file: never opened")


def test_device_behind_a_link(tree):
    (tree / SHARD).unlink(); (tree / SHARD).symlink_to("/dev/zero")
    _has(_problems(tree), "outside the checkpoint directory")


def test_symlink_loop_and_odd_index_entries(tree):
    (tree / "loop").symlink_to(".", target_is_directory=True)          # a walk that followed it would never end
    idx = _index(tree); idx["weight_map"]["model.norm.weight"] = ["not", "a", "name"]; _write_index(tree, idx)
    _has(_problems(tree), "weight_map entries that name no shard file")
    idx["weight_map"]["model.norm.weight"] = "model-00004-of-00004.safetensors"; idx["metadata"]["total_size"] = "lots"
    _write_index(tree, idx)
    _has(_problems(tree), "total_size is not a byte count")


def test_hugging_face_snapshot_links_are_inside(tree, tmp_path):
    "A hub cache snapshot: every file a link into the repository's blobs/; that tree loads."
    repo = tmp_path / "models--upstage--tiny"; (repo / "blobs").mkdir(parents=True); snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for f in sorted(tree.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(f.name.encode()).hexdigest()
        shutil.copy(f, blob); (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    assert _problems(snap) == []


# --- headers, validated as safetensors does -----------------------------------------------------------------

def _st(path, entries, data, meta=None, raw=None):
    "Write a safetensors file by hand: `entries` {name: (dtype, shape, [begin, end])}."
    h = raw if raw is not None else json.dumps({**({"__metadata__": meta} if meta is not None else {}),
                                                **{k: {"dtype": t, "shape": s, "data_offsets": o} for k, (t, s, o) in entries.items()}}).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


@pytest.mark.parametrize("entries, data, meta, raw, msg", [
    ({"a": ("F32", [2], [0, 8]), "b": ("F32", [2], [4, 12])}, bytes(16), None, None, "overlapping data_offsets"),
    ({"a": ("F32", [2], [0, 8]), "b": ("F32", [2], [12, 20])}, bytes(20), None, None, "a hole in the data section"),
    ({"a": ("F32", [2], [0, 8]), "b": ("F32", [1], [4, 8]), "c": ("F32", [1], [12, 16])}, bytes(16), None, None, "overlapping"),
    ({"a": ("F32", [2], [8, 0])}, bytes(8), None, None, "the end is before the start"),
    ({"a": ("F32", [-2], [0, 8])}, bytes(8), None, None, "malformed header entry"),
    ({"a": ("F32", [2.0], [0, 8])}, bytes(8), None, None, "malformed header entry"),
    ({"a": ("F32", [True, 2], [0, 8])}, bytes(8), None, None, "malformed header entry"),
    ({"a": ("F32", [2], [0])}, bytes(8), None, None, "malformed header entry"),
    ({"a": (["F32"], [2], [0, 8])}, bytes(8), None, None, "malformed header entry"),
    ({"a": ("F32", [2], [0, 8])}, bytes(8), {"format": 5}, None, "__metadata__ must map strings to strings"),
    ({}, bytes(8), None, b'[{"a": 1}]', "does not start with '{'"),
    ({}, bytes(8), None, b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', "duplicate key"),
    ({}, bytes(8), None, b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', "unreadable header"),
    ({}, bytes(8), None, b"{" * 200_000, "unreadable header"),
])
def test_header_validation(tmp_path, entries, data, meta, raw, msg):
    f = _st(tmp_path / "x.safetensors", entries, data, meta, raw)
    with pytest.raises(CheckpointError, match=msg.replace("(", r"\(").replace("[", r"\[")): read_header(f)


def test_header_length_bound(tmp_path):
    f = tmp_path / "x.safetensors"; f.write_bytes(struct.pack("<Q", 2**60) + b"{}")
    with pytest.raises(CheckpointError, match="exceeds the file"): read_header(f)


def test_overlapping_offsets_in_a_tree(tree):
    "Same total bytes, but two tensors share bytes: refused by preflight, naming shard and tensor."
    h, _ = read_header(tree / SHARD)
    raw = (tree / SHARD).read_bytes(); n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n])
    a, b = sorted((k for k in hdr if k != "__metadata__" and h[k].nbytes == 512), key=lambda k: h[k].begin)[:2]
    hdr[b]["data_offsets"] = hdr[a]["data_offsets"]                   # b reads a's bytes; b's own bytes: a hole
    new = json.dumps(hdr, separators=(",", ":")).encode(); new += b" " * (n - len(new)) if len(new) <= n else b""
    assert len(new) == n, "the rewritten header must keep its length"
    (tree / SHARD).write_bytes(raw[:8] + new + raw[8 + n:])
    _has(_problems(tree), SHARD, "overlapping data_offsets")


# --- values: NaN/Inf when loading and at preflight ----------------------------------------------------------

def _poison(d, name, value, where=None):
    "Rewrite the shard holding `name` with `value` at flat index `where` (all values when None); sizes unchanged."
    shard = _index(d)["weight_map"][name]
    t = load_file(str(d / shard))
    x = t[name].clone(); flat = x.view(-1)
    if where is None: flat.fill_(value)
    else: flat[where] = value
    t[name] = x; save_file(t, str(d / shard), metadata={"format": "pt"})
    return shard


def test_nan_in_a_bf16_tensor(tree):
    name = "model.layers.0.self_attn.q_proj.weight"
    shard = _poison(tree, name, float("nan"), where=1234)
    assert scan_checkpoint(tree).problems == []                         # the headers are fine
    _has(_problems(tree, values="full"), shard, name, "holds NaN/Inf: 1 of the", "values read, the first at flat index 1,234")
    with CheckpointReader(tree) as r:
        with pytest.raises(CheckpointError, match=f"{shard}: {name} holds 1 NaN/Inf value"): r.get(name)
        r.get("model.norm.weight")                                     # the others still load


def test_sampled_scan_finds_a_ruined_tensor(tree):
    name = "model.layers.3.mlp.shared_experts.down_proj.weight"
    _poison(tree, name, float("inf"))
    _has(_problems(tree), name, "values sampled")                      # the default: a sample of every tensor
    assert not any(name in p for p in _problems(tree, values="none"))


def test_generate_refuses_nan_weights(tree, capsys):
    _poison(tree, "model.embed_tokens.weight", float("nan"))
    rc = main(["generate", "--model", str(tree), "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "NaN/Inf" in err and "Traceback" not in err, err


# --- the content manifest -----------------------------------------------------------------------------------

def test_same_size_corruption_is_caught_by_the_manifest(tree, tmp_path, monkeypatch):
    monkeypatch.setenv("SOLAR_OPEN2_CACHE", str(tmp_path / "cache"))
    good = content_manifest(tree)
    assert good["count"] == len([f for f in tree.iterdir()]) and all(len(v["sha256"]) == 64 for v in good["files"].values())
    assert list((tmp_path / "cache" / "manifests").glob("*.json"))       # kept in the cache, outside the tree
    raw = bytearray((tree / SHARD).read_bytes()); raw[-3] ^= 0xFF; (tree / SHARD).write_bytes(bytes(raw))
    assert scan_checkpoint(tree).problems == []                         # same size: the headers cannot tell
    p = manifest_problems(good, content_manifest(tree), "the head")
    assert len(p) == 1 and SHARD in p[0] and "same size, other bytes" in p[0], p
    assert manifest_problems({"files": {k: v["size"] for k, v in good["files"].items()}}, content_manifest(tree)) == []  # sizes only
    (tmp_path / "good.json").write_text(json.dumps(good))
    rc = cli_preflight([str(tree), "--manifest", str(tmp_path / "good.json"), "--headers-only"])
    assert rc == 1


def test_manifest_hashes_once(tree, tmp_path, monkeypatch):
    monkeypatch.setenv("SOLAR_OPEN2_CACHE", str(tmp_path / "cache"))
    import solar_open2.checkpoint as ck
    calls = []
    orig = ck._sha256
    monkeypatch.setattr(ck, "_sha256", lambda f, *a: (calls.append(f.name), orig(f, *a))[1])
    first = content_manifest(tree); n = len(calls)
    assert content_manifest(tree) == first and len(calls) == n          # nothing hashed again
    os.utime(tree / SHARD, ns=(1, 1))                                  # touched: hashed again, that file only
    content_manifest(tree); assert calls[n:] == [SHARD]


def test_nothing_is_written_into_the_tree(tree, tmp_path, monkeypatch, capsys):
    "Every read path on a tree that holds a FIFO and a link to a decoy: the tree is the same afterwards, byte for byte."
    monkeypatch.setenv("SOLAR_OPEN2_CACHE", str(tree / ".cache-inside"))   # even a cache placed inside is not used
    os.mkfifo(tree / "stray.fifo"); (tree / "decoy.safetensors").symlink_to(tree.parent / "decoy.safetensors")
    before = _fingerprint(tree)
    _within(lambda: preflight(tree, values="full"))
    _within(lambda: content_manifest(tree))
    with CheckpointReader(tree, strict=False) as r: _within(lambda: r.layer_weights(0)); _within(lambda: r.embed([1, 2]))
    assert _within(lambda: cli_preflight([str(tree), "--write-manifest", str(tree / "m.json")])) == 2   # refused: inside
    assert _within(lambda: cli_preflight([str(tree), "--write-manifest", str(tmp_path / "m.json")])) == 1  # the stray link
    capsys.readouterr()
    assert _fingerprint(tree) == before
    assert not (tree / ".cache-inside").exists()


# --- the config, bounded before anything is allocated ----------------------------------------------------------

@pytest.mark.parametrize("key, value, msg", [("num_hidden_layers", 10_000_000, "num_hidden_layers"),
                                             ("n_routed_experts", 2**31, "n_routed_experts"),
                                             ("vocab_size", 10**12, "vocab_size"),
                                             ("rms_norm_eps", "NaN", "not valid JSON")])
def test_absurd_config_is_refused_before_allocation(tree, key, value, msg):
    cfg = json.loads((tree / "config.json").read_text())
    if value == "NaN": (tree / "config.json").write_text(json.dumps(cfg).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN'))
    else:
        cfg[key] = value
        if key == "num_hidden_layers": cfg["gqa_layers"] = [0]; cfg.pop("layer_types", None)
        (tree / "config.json").write_text(json.dumps(cfg))
    _has(_within(lambda: scan_checkpoint(tree).problems, seconds=20), msg)
