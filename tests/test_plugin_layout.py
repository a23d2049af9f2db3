"""The plugin's layout (chapters `vllm/*` and `ops/*`), read from the source: the import graph of `solar_open2/` has
no circle; the kernels under `solar_open2/vllm/ops/` import neither vLLM nor the plugin's wiring (options, config,
layers, model); nothing hands a tensor over by its address; methods split across cells are attached with `@patch`;
every tile table is a `TileTable` that says where it was measured."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "solar_open2"
WIRING = {f"solar_open2.vllm.{m}" for m in ("options", "config", "kda", "linear", "moe", "model", "testing", "parsers")} | {"solar_open2.vllm"}


def _name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set:
    "Every module `path` imports, anywhere in the file (imports inside functions too), as dotted names."
    me, pkg = _name(path), _name(path).split(".")
    if path.name != "__init__.py": pkg = pkg[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import): out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level: base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}          # `from pkg import module`
    return {m for m in out if m and m != me}


MODULES = {_name(p): p for p in PKG.rglob("*.py") if p.name != "_modidx.py"}
GRAPH = {m: {i for i in _imports(p) if i in MODULES} for m, p in MODULES.items()}


def _cycles(graph: dict) -> list:
    "Strongly connected components with more than one module (Tarjan)."
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph[v]:
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in graph:
        if v not in index: visit(v)
    return out


def test_the_graph_is_read():
    assert {"solar_open2.vllm.model", "solar_open2.vllm.ops.gemv", "solar_open2.vllm.options"} <= set(MODULES)
    assert "solar_open2.vllm.ops.gemv" in GRAPH["solar_open2.vllm.ops.kda_gates"]
    assert "solar_open2.vllm.kda" in GRAPH["solar_open2.vllm.model"]


def test_no_import_circle_in_solar_open2():
    assert _cycles(GRAPH) == []
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]          # the check finds one


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("solar_open2.vllm.ops")))
def test_ops_import_no_vllm_and_no_wiring(module):
    imports = _imports(MODULES[module])
    assert not [i for i in imports if i == "vllm" or i.startswith("vllm.")], module
    assert not imports & WIRING, (module, imports & WIRING)
    reference = {"solar_open2", "solar_open2.config", "solar_open2.nvfp4", "solar_open2.kda", "solar_open2.moe"}
    ours = [i for i in imports if i.split(".")[0] == "solar_open2" and not i.startswith("solar_open2.vllm.ops")]
    assert all(i in reference or ".".join(i.split(".")[:2]) in reference - {"solar_open2"} for i in ours), (module, ours)   # the reference wing only


def test_no_handoff_by_address():
    hits = [f"{p.relative_to(PKG.parent)}:{i}" for p in (PKG / "vllm").rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
            if "data_ptr" in line]
    assert hits == []


def test_methods_are_patched_not_assigned():
    "`Cls.meth = _fn` shows private names in the docs; the plugin's chapters (`nbs/08_*`) use `@patch`."
    hits = []
    for p in (PKG / "vllm").rglob("*.py"):
        if "nbs/08_" not in p.read_text()[:400]: continue                    # parsers.py is the chat chapter's (`chat_vllm`)
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id[:1].isupper()
                                                    and not t.attr.startswith("__") for t in node.targets):
                hits.append(f"{p.relative_to(PKG.parent)}:{node.lineno}")
    assert hits == []


def test_every_tile_table_says_where_it_was_measured():
    pytest.importorskip("triton")
    import importlib
    from solar_open2.vllm.ops.tiles import H200, TileTable
    tables = {}
    for m in sorted(MODULES):
        if not m.startswith("solar_open2.vllm.ops."): continue
        mod = importlib.import_module(m)
        tables.update({f"{m}.{k}": v for k, v in vars(mod).items() if k.isupper() and (k.endswith("TILES") or k == "FLAT_OFF")})
    assert set(tables) == {f"solar_open2.vllm.ops.{n}" for n in ("gemv.GEMV_TILES", "gemv.PAIR_TILES", "gemv.FLAT_OFF", "kda_gates.GATE_TILES",
                           "kda_decode.DECODE_TILES", "moe_decode.TILES", "moe_decode.PAIR_TILES", "moe_marlin.MARLIN_TILES", "moe_route.ROUTE_TILES")}, sorted(tables)
    for name, t in tables.items():
        assert isinstance(t, TileTable) and t.archs == (H200,) and t.source, name
