"""The plugin on each supported vLLM release (0.25.1, 0.26.0, 0.33.0): every name that moved between them comes
through `solar_open2.vllm.compat` (never from one of its homes directly), resolves on the installed release, and the
plugin's other vLLM imports resolve too. Part of the contract suite that CI runs once per release
(`.ci/contract.sh`)."""
import ast, importlib, json
from pathlib import Path

import pytest

from solar_open2.vllm import compat

ROOT = Path(__file__).resolve().parents[1]
COMPAT_FILES = {"solar_open2/vllm/compat.py"}     # and the chapter it is exported from (found below by its export)


def _code_cells(nb:Path)->str:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    src = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return "\n".join(l for l in "\n".join(src).splitlines() if not l.lstrip().startswith(("%", "!")))


def _sources():
    "(path, code) of every Python file and notebook of the project (the package, tests, scripts, benchmarks, chapters)."
    for sub in ("solar_open2", "tests", "scripts", "benchmarks", ".ci"):
        for p in sorted((ROOT/sub).rglob("*.py")): yield p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")
    for p in sorted((ROOT/"nbs").rglob("*.ipynb")):
        if ".ipynb_checkpoints" in p.parts: continue
        yield p.relative_to(ROOT).as_posix(), _code_cells(p)


def _imports(code:str):
    "(module, name or None, line) of every absolute import in `code`, also those in string constants (subprocess code)."
    try: tree = ast.parse(code)
    except SyntaxError: return
    def of(t, line=None):
        for n in ast.walk(t):
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                for a in n.names: yield n.module, a.name, line or n.lineno
            elif isinstance(n, ast.Import):
                for a in n.names: yield a.name, None, line or n.lineno
    yield from of(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "import" in n.value and "vllm" in n.value:
            for stmt in n.value.replace(";", "\n").splitlines():
                try: yield from of(ast.parse(stmt.strip()), n.lineno)
                except SyntaxError: pass


def _is_compat_source(path:str, code:str)->bool:
    return path in COMPAT_FILES or (path.endswith(".ipynb") and "#| default_exp vllm.compat" in code)


def test_the_moved_names_table_is_well_formed():
    for name, m in compat.MOVED.items():
        assert name == m.name and len(m.places) >= 2 and m.since in compat.SUPPORTED, m
        assert all(mod.startswith("vllm.") and attr for mod, attr in m.places), m


def test_moved_names_are_imported_only_through_compat():
    "A test that fails if any file outside compat imports a moved name from one of its homes, old or new."
    pairs = {(mod, attr): name for name, m in compat.MOVED.items() for mod, attr in m.places}
    # packages that moved whole: any import under either prefix
    prefixes = [p for old, new in compat.RELOCATED.items() for p in (old, new)]
    bad = []
    for path, code in _sources():
        if _is_compat_source(path, code) or path == "tests/test_vllm_compat.py": continue
        for mod, name, line in _imports(code):
            if name is not None and (mod, name) in pairs:
                bad.append(f"{path}:{line}: from {mod} import {name} (use: from solar_open2.vllm.compat import {pairs[mod, name]})")
            elif any(mod == p or mod.startswith(p + ".") for p in prefixes):
                bad.append(f"{path}:{line}: {mod} moved between vLLM releases (import through solar_open2.vllm.compat)")
    assert not bad, "\n".join(bad)


def test_the_scan_sees_every_import_form(tmp_path):
    "The scanner above catches the forms the project uses (plain, parenthesised, inside a code string, in a cell)."
    old_mod, old_attr = compat.MOVED["FusedMoE"].places[-1]
    fla_old = next(iter(compat.RELOCATED))
    code = (f"from {old_mod} import ({old_attr},\n    Other)\n"
            f"import {fla_old}.ops.kda as k\n"
            f"code = 'from {old_mod} import {old_attr}; print(1)'\n")
    found = {(m, n) for m, n, _ in _imports(code)}
    assert {(old_mod, old_attr), (f"{fla_old}.ops.kda", None)} <= found, found
    nb = tmp_path/"x.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": ["%load_ext x\n", code]}]}))
    assert (old_mod, old_attr) in {(m, n) for m, n, _ in _imports(_code_cells(nb))}


vllm = pytest.importorskip("vllm")


def test_this_vllm_is_supported():
    assert compat.vllm_version() == vllm.__version__
    assert compat.is_supported(), f"vLLM {vllm.__version__} is not one of {compat.SUPPORTED}"


@pytest.mark.parametrize("name", sorted(compat.MOVED))
def test_every_moved_name_resolves_from_its_newest_home(name):
    obj = compat.resolve(name)
    assert getattr(compat, name) is obj                                       # `from ...compat import name`
    for mod, attr in compat.MOVED[name].places:                               # the first home this vLLM has
        try: m = importlib.import_module(mod)
        except ModuleNotFoundError: continue
        if hasattr(m, attr):
            assert getattr(m, attr) is obj, (mod, attr)
            break


def test_an_unknown_or_missing_name_says_what_was_tried(monkeypatch):
    with pytest.raises(KeyError, match="not a moved name"): compat.resolve("NoSuchName")
    gone = compat.Moved("Gone", (("vllm.no_such_module", "Gone"), ("vllm", "no_such_attribute")), "0.33.0")
    monkeypatch.setitem(compat.MOVED, "Gone", gone)
    compat.resolve.cache_clear()
    with pytest.raises(ImportError, match=r"vLLM .* has no Gone; tried vllm.no_such_module \(no such module\), "
                                          r"vllm.no_such_attribute \(no such name\)"):
        compat.resolve("Gone")
    compat.resolve.cache_clear()


def test_every_vllm_import_of_the_plugin_resolves():
    "Each `from vllm... import x` in the plugin's modules exists in the installed release (the moved ones are not there)."
    bad = []
    for p in sorted((ROOT/"solar_open2").rglob("*.py")):
        for mod, name, line in _imports(p.read_text(encoding="utf-8")):
            if mod.split(".")[0] != "vllm": continue
            where = f"{p.relative_to(ROOT)}:{line}"
            try: m = importlib.import_module(mod)
            except Exception as e:                                                # noqa: BLE001 (report every kind)
                bad.append(f"{where}: {mod}: {type(e).__name__}: {e}"); continue
            if name and name != "*" and not hasattr(m, name):
                try: importlib.import_module(f"{mod}.{name}")
                except ImportError: bad.append(f"{where}: {mod} has no {name}")
    assert not bad, f"vLLM {vllm.__version__}:\n" + "\n".join(bad)


def _kernel_keywords()->dict:
    "{KDAKernels field: keywords the KDA layer passes it}, read from the layer's source."
    import solar_open2.vllm.kda as kda
    tree = ast.parse(Path(kda.__file__).read_text(encoding="utf-8"))
    out = {}
    for n in ast.walk(tree):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                and n.func.value.id == "kn"):
            out.setdefault(n.func.attr, set()).update(k.arg for k in n.keywords if k.arg)
    return out


def _defined_params(module:str, func:str)->dict:
    "{parameter: default (source text) or None} of `def func` in `module`'s file: the CUDA definition, whichever"
    "function the platform binds to the name at import (0.33.0 rebinds causal-conv1d to CPU versions on the CPU platform)."
    import importlib.util
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8"))
    for n in tree.body:
        if isinstance(n, ast.FunctionDef) and n.name == func:
            a = n.args
            pos = a.posonlyargs + a.args
            defaults = [None] * (len(pos) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
            out = dict(zip((x.arg for x in pos), defaults))
            out.update({x.arg: None if d is None else ast.unparse(d) for x, d in zip(a.kwonlyargs, a.kw_defaults)})
            return out
    raise AssertionError(f"{module} defines no {func}")


def test_the_kda_kernels_take_every_keyword_the_layer_passes():
    "vLLM's causal-conv1d and FLA KDA kernels (Triton, GPU only) accept the layer's keywords on this release, and the "
    "gate keeps no lower bound by default (Solar-Open2's gate is unbounded; 0.33.0 added `lower_bound=None`)."
    import dataclasses
    from solar_open2.vllm.kda import KDAKernels
    conv = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
    fla = lambda n: (compat.resolve(n).__module__, n)
    homes = {"conv_prefill": (conv, "causal_conv1d_fn"), "conv_decode": (conv, "causal_conv1d_update"),
             "chunk": fla("chunk_kda_with_fused_gate"), "gate": fla("fused_kda_gate"), "recurrent": fla("fused_recurrent_kda")}
    used = _kernel_keywords()
    assert set(used) == {f.name for f in dataclasses.fields(KDAKernels)} - {"name"} == set(homes), used
    spec_only = {"recurrent": {"num_accepted_tokens"}}   # `fused_recurrent_kda_spec` hands a verify to `fused_recurrent_kda_fwd`
    for field, kws in used.items():
        params = _defined_params(*homes[field])
        plain = kws - spec_only.get(field, set())
        assert plain <= set(params), f"vLLM {vllm.__version__}: {homes[field][1]} lacks {sorted(plain - set(params))}"
        if "lower_bound" in params: assert params["lower_bound"] == "None", (field, params["lower_bound"])
    fwd = _defined_params(homes["recurrent"][0], "fused_recurrent_kda_fwd")
    assert used["recurrent"] <= set(fwd) and "num_accepted_tokens" in used["recurrent"], sorted(used["recurrent"] - set(fwd))


def _tiny_kda_layer():
    from solar_open2.checkpoint import tiny_checkpoint
    from solar_open2.vllm.testing import checkpoint_tensors, cpu_vllm_config, kda_layer
    d = tiny_checkpoint("bf16")
    pre = "model.layers.1.self_attn."
    W = {k.removeprefix(pre): v for k, v in checkpoint_tensors(d).items() if k.startswith(pre)}
    return kda_layer(cpu_vllm_config(d), W)


def test_the_kda_layer_unpacks_a_raw_page_where_layers_bind_their_cache():
    "0.33.0 hands each mamba-style layer its raw int8 page [blocks, 1, 1, page bytes]; the KDA layer's views are its state."
    import torch
    if not compat.layers_bind_their_cache(): pytest.skip(f"vLLM {vllm.__version__} assigns kv_cache itself")
    layer = _tiny_kda_layer()
    shapes, dtypes = layer.get_state_shape(), layer.get_state_dtype()
    page = sum(torch.Size(s).numel() * torch.empty((), dtype=t).element_size() for s, t in zip(shapes, dtypes))
    raw = torch.zeros(4, 1, 1, page, dtype=torch.int8)
    layer.bind_kv_cache(raw)
    conv, rec = layer.conv_states()
    for t, s, dt in zip(layer.kv_cache, shapes, dtypes): assert t.shape == (4, *s) and t.dtype == dt
    rec[2].fill_(1.0)                                                        # a view of the page, not a copy
    assert raw[2].view(-1).count_nonzero() > 0 and raw[1].view(-1).count_nonzero() == 0


_EAGER_BREAK = r"""
import json, torch
from solar_open2.vllm.testing import force_cpu_platform
force_cpu_platform()
import solar_open2.vllm.kda  # registers the ops
from vllm.compilation import breakable_cudagraph as bc
calls = []
class Capture:                                                            # a capture in progress
    _capturing = True
    def add_eager(self, fn): calls.append(fn); return None
bc.BreakableCUDAGraphCapture.current = classmethod(lambda cls: Capture())
t = lambda *s: torch.zeros(0, *s[1:])   # empty: the capture keeps weak references (a compiled op) only to non-empty tensors
torch.ops.vllm.solar_open2_kda_attention(t(2, 6), t(2, 6), t(2, 2), t(2, 4), "no.such.layer")
torch.ops.vllm.solar_open2_kda_decode(t(2, 6), t(2, 6), t(2, 2), t(2, 4), t(2, 4), "no.such.layer")
torch.ops.vllm.solar_open2_kda_decode_lr(t(2, 6), t(2, 2), t(2, 6), t(2, 4), "no.such.layer")
print(json.dumps(len(calls)))
"""


def test_the_plugins_kda_ops_break_a_breakable_capture():
    "With breakable CUDA graphs on (VLLM_USE_BREAKABLE_CUDAGRAPH=1), each of the plugin's three KDA ops leaves the "
    "capture and is recorded to run eagerly, on every release (their bodies do not run: the layer name is unknown)."
    import os, subprocess, sys
    env = {**os.environ, "VLLM_USE_BREAKABLE_CUDAGRAPH": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _EAGER_BREAK], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == 3


def test_register_wraps_the_ngram_proposer_and_its_drafts_pad():
    """`register()` wraps this release's `NgramProposer` (its `propose` still takes the arguments `pad_drafts` reads), and
    an engine of ours with `spec_pad_drafts` gets k drafts a decoding request: a match keeps its own, no match repeats
    the last sampled token; without the option the proposer's lists come back as they were."""
    import numpy as np
    from solar_open2.vllm import register
    register()
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer
    assert NgramProposer._solar_open2_pads
    p = object.__new__(NgramProposer)                                  # its __init__ needs a whole VllmConfig: the state propose reads
    p.max_model_len, p.k, p.min_n, p.max_n, p.num_tokens_threshold, p.num_numba_thread_available = 64, 3, 2, 4, 8192, 1
    p.valid_ngram_draft, p.valid_ngram_num_drafts = np.zeros((4, 3), dtype=np.int32), np.zeros(4, dtype=np.int32)
    tok = np.zeros((2, 64), dtype=np.int32); tok[0, :8] = [1, 2, 3, 1, 2, 3, 1, 2]; tok[1, :4] = [5, 6, 7, 8]
    args = (3, [[2], [8]], np.array([8, 4]), tok)
    p._solar_open2_pad = False
    assert p.propose(*args) == [[3, 1, 2], []]                          # the proposer's own: a match, and none
    p._solar_open2_pad = True
    assert p.propose(*args) == [[3, 1, 2], [8, 8, 8]]


def test_register_wraps_the_gpu_ngram_proposer_and_its_drafts_pad(monkeypatch):
    """`register()` wraps this release's `NgramProposerGPU` too (`ngram_gpu`, which keeps asynchronous scheduling): its
    own match-finding kernel runs uncompiled on the CPU; an engine of ours with `spec_pad_drafts` gets k drafts a
    decoding request (a match keeps its own, no match repeats the sampled token) and their count, a request that sampled
    nothing keeps none; without the option the tensors come back as they were."""
    import contextlib, inspect
    import torch
    gpu_mod = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer_gpu")
    from solar_open2.vllm import register
    register()
    NgramProposerGPU, NgramGPUKernel = gpu_mod.NgramProposerGPU, gpu_mod.NgramGPUKernel
    assert NgramProposerGPU._solar_open2_pads
    monkeypatch.setattr(gpu_mod, "set_forward_context", lambda *a, **k: contextlib.nullcontext())   # needs a whole VllmConfig
    kern = object.__new__(NgramGPUKernel); torch.nn.Module.__init__(kern)   # the compiled module's own forward, uncompiled
    p = object.__new__(NgramProposerGPU)
    for o in (p, kern):
        o.k, o.min_n, o.max_n, o.max_model_len, o.max_num_seqs, o.device = 3, 2, 4, 64, 4, torch.device("cpu")
    p.vllm_config, p.kernel = None, (lambda *a: NgramGPUKernel.forward(kern, *a))

    def call():
        tok = torch.zeros((3, 64), dtype=torch.int32)
        tok[0, :7] = torch.tensor([1, 2, 3, 1, 2, 3, 1]); tok[1, :3] = torch.tensor([5, 6, 7]); tok[2, :3] = torch.tensor([5, 6, 7])
        kw = dict(num_tokens_no_spec=torch.tensor([7, 3, 3], dtype=torch.int32), token_ids_gpu=tok,
                  valid_sampled_token_ids_gpu=torch.tensor([[2, -1, -1, -1], [8, -1, -1, -1], [-1, -1, -1, -1]], dtype=torch.int32),
                  valid_sampled_tokens_count=torch.tensor([1, 1, 0], dtype=torch.int32))
        if "num_speculative_tokens" in inspect.signature(NgramProposerGPU.propose).parameters:   # 0.25.1 and 0.26.0
            kw["num_speculative_tokens"] = 3
        d, nv = p.propose(**kw)
        return d.tolist(), nv.tolist()
    p._solar_open2_pad = False
    assert call() == ([[3, 1, 2], [-1, -1, -1], [-1, -1, -1]], [3, 0, 0])     # the proposer's own: a match, none, none
    p._solar_open2_pad = True
    assert call() == ([[3, 1, 2], [8, 8, 8], [-1, -1, -1]], [3, 3, 0])


def test_register_wraps_the_draft_trim_and_a_padded_engine_skips_its_wait():
    """`register()` wraps this release's `update_scheduler_for_invalid_drafts` where vLLM defines it; the GPU model runner
    calls it by that name with (event, counts, scheduler output, index); wrapped there too, an engine with
    `spec_skip_draft_sync` skips the wait in a step far from the length limit and keeps vLLM's trim, wait included, near
    it; with no such engine every step gets vLLM's own trim."""
    import inspect, re
    from types import SimpleNamespace
    import torch
    gpu_mod = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer_gpu")
    from solar_open2.vllm import register, config as cfg
    register()
    assert hasattr(gpu_mod.update_scheduler_for_invalid_drafts, "_solar_open2_trim")
    gmr = pytest.importorskip("vllm.v1.worker.gpu_model_runner")
    call = re.compile(r"update_scheduler_for_invalid_drafts\(\s*self\._num_valid_draft_tokens_event,\s*"
                      r"self\._num_valid_draft_tokens_cpu,\s*scheduler_output,")
    assert call.search(inspect.getsource(gmr.GPUModelRunner._update_states))
    assert cfg.patch_draft_trim() == 2 and hasattr(gmr.update_scheduler_for_invalid_drafts, "_solar_open2_trim")

    class Ev:
        waits = 0
        def synchronize(self): Ev.waits += 1
    def step(n):                                                       # one request, 3 drafts scheduled, the proposer found 1
        so = SimpleNamespace(scheduled_cached_reqs=SimpleNamespace(req_ids=["a"], num_computed_tokens=[n]),
                             scheduled_spec_decode_tokens={"a": [-1] * 3}, total_num_scheduled_tokens=4, num_scheduled_tokens={"a": 4})
        gmr.update_scheduler_for_invalid_drafts(Ev(), torch.tensor([1], dtype=torch.int32), so, {"a": 0})
        return Ev.waits, so.num_scheduled_tokens["a"], len(so.scheduled_spec_decode_tokens["a"])
    vc = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3), model_config=SimpleNamespace(max_model_len=64),
                         additional_config={"solar_open2": {"spec_full_graphs": True, "spec_pad_drafts": True, "spec_skip_draft_sync": True}})
    try:
        assert cfg.draft_sync_engine(vc, True)
        assert step(10) == (0, 4, 3)                                    # far from the limit: no wait, nothing trimmed
        assert step(55) == (1, 2, 1)                                    # near it: vLLM's trim, after its wait
    finally: cfg.DRAFT_SYNC.clear()
    assert step(10) == (2, 2, 1)                                        # no such engine: vLLM's trim every step


def test_the_kda_output_norm_has_a_kernel_form_with_the_arguments_the_op_passes():
    """Inside the plugin's KDA ops `o_norm_eager` calls vLLM's `FusedRMSNormGated.forward_cuda(x, g)` on a GPU (its Triton
    kernel; the module call would take the torch form written for inductor): this release's class has its own
    `forward_cuda`, not the CustomOp default, and both forms take `(x, g)`."""
    import inspect
    from vllm.model_executor.custom_op import CustomOp
    FusedRMSNormGated = compat.resolve("FusedRMSNormGated")
    assert FusedRMSNormGated.forward_cuda is not CustomOp.forward_cuda
    for f in (FusedRMSNormGated.forward_cuda, FusedRMSNormGated.forward_native):
        assert list(inspect.signature(f).parameters)[:3] == ["self", "x", "g"]
