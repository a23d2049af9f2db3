"""The Dynamo manifests end to end (chapter 10b): golden files for both profiles and both releases on the B200, each
checked against the v1beta1 schema subset and rules, the Kubernetes schema, and every vLLM argument against the
paired vLLM's own parser (0.26.0 for Dynamo 1.4.1, 0.33.0 for 1.7.0, each when an interpreter is found:
`SOLAR_OPEN2_VLLM_PYTHON_0_26_0`, `..._0_33_0`) and the installed one; the Dockerfile's install steps in a clean
environment holding each of those vLLMs.

Regenerate the golden files with `UPDATE_GOLDEN=1 pytest tests/test_dynamo.py -k golden`.
"""
import json, os
from pathlib import Path

import pytest
import yaml

from solar_open2 import dynamo as D

GOLDEN = Path(__file__).parent / "golden" / "dynamo"
CASES = [(p, r) for p in D.PROFILES for r in D.RELEASES]


def _dir(profile, rel): return GOLDEN / f"{profile}-{rel}"


@pytest.mark.parametrize("profile,rel", CASES)
def test_golden(profile, rel):
    "The generated files of the default B200 deployment equal the golden ones, byte for byte."
    _, files = D.generate(D.DynamoOptions(profile=profile, dynamo=rel))
    gold = _dir(profile, rel)
    if os.environ.get("UPDATE_GOLDEN"):
        gold.mkdir(parents=True, exist_ok=True)
        for n, t in files.items(): (gold / n).write_text(t)
    assert sorted(p.name for p in gold.iterdir()) == sorted(files), f"{gold}: other files than {sorted(files)}"
    for n, t in files.items():
        assert (gold / n).read_text() == t, f"{gold.name}/{n} differs from the golden file (UPDATE_GOLDEN=1 to refresh)"


@pytest.mark.parametrize("profile,rel", CASES)
def test_golden_valid(profile, rel):
    "Each golden deployment passes the DynamoGraphDeployment schema and rules, and the Kubernetes schema."
    pytest.importorskip("kubernetes_validate")
    files = {p.name: p.read_text() for p in _dir(profile, rel).iterdir()}
    assert D.file_problems(files) == []
    docs = [d for n in ("model-cache.yaml", "model-download.yaml", "deploy.yaml", "perf.yaml")
            for d in yaml.safe_load_all(files[n]) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds.count("DynamoGraphDeployment") == 1 and "PersistentVolumeClaim" in kinds and kinds.count("Job") == 2


@pytest.mark.parametrize("profile,rel", CASES)
def test_golden_version_dependent(profile, rel):
    "What differs between the releases is where the recipe's scoring parameter lives; --calculate-kv-scales is in none."
    dgd = next(d for d in yaml.safe_load_all(_dir(profile, rel).joinpath("deploy.yaml").read_text())
               if d["kind"] == "DynamoGraphDeployment")
    args = {c["name"]: c["podTemplate"]["spec"]["containers"][0]["args"] for c in dgd["spec"]["components"]}
    front = args["Frontend"]
    decay = any(a.startswith("--router-kv-overlap-score-credit-decay") for a in front)
    policy = any(a.startswith("--router-policy-config") for a in front)
    if profile == "agg": assert (decay, policy) == ((True, False) if rel == "1.4.1" else (False, True))
    else: assert not decay and not policy
    assert not any(a.startswith("--calculate-kv-scales") for a in sum(args.values(), []))
    assert all(c["runtimeVersionOverride"] == rel for c in dgd["spec"]["components"])
    assert D.release(rel).runtime_image in _dir(profile, rel).joinpath("Dockerfile").read_text()


def _cases(rel):
    out = []
    for profile in D.PROFILES:
        dgd = next(d for d in yaml.safe_load_all(_dir(profile, rel).joinpath("deploy.yaml").read_text())
                   if d["kind"] == "DynamoGraphDeployment")
        out += D.arg_cases(dgd, D.release(rel))
    return out


def _interpreter(version):
    py, why = D.vllm_interpreter(version)
    if py is None: pytest.skip(why)
    return py


@pytest.mark.parametrize("rel", list(D.RELEASES))
def test_golden_args_paired_vllm(rel):
    "Every vLLM argument of the release's manifests parses with the paired vLLM's parser, and every name resolves."
    version = D.release(rel).vllm
    probe = D.run_arg_probe(_cases(rel), _interpreter(version))
    assert D.arg_problems(probe, version) == []


BAD = [{"where": "bad/flag", "kind": "worker", "args": ["--model=/m", "--enable-turbo-mode"]},
       {"where": "bad/kv", "kind": "worker", "args": ["--model=/m", "--kv-cache-dtype=fp4"]},
       {"where": "bad/lp", "kind": "worker", "args": ["--model=/m", "--logits-processors=solar_open2.nope:X"]},
       {"where": "bad/tool", "kind": "frontend", "args": ["--tool-call-parser=solar_open3"]}]


@pytest.fixture(scope="module")
def installed_probe():
    "One probe of the vLLM installed here (0.25.1: what CI has) over both releases' manifests, the GPU script's server, and BAD."
    import importlib.metadata as md
    from benchmarks.engine import dynamo_checks
    version = md.version("vllm").split("+")[0]
    serve = [{"where": "gpu-checks/serve", "kind": "frontend", "args": ["--model=/m"] + dynamo_checks.serve_args(8000, 2**30)}]
    return version, D.run_arg_probe(_cases("1.4.1") + _cases("1.7.0") + serve + BAD, _interpreter(version))


def test_golden_args_installed_vllm(installed_probe):
    "Every argument of both releases' manifests (and the GPU checks' server) parses and resolves with the installed vLLM."
    version, probe = installed_probe
    good = {**probe, "results": [r for r in probe["results"] if not r["where"].startswith("bad/")]}
    assert D.arg_problems(good, version) == []
    assert len(good["results"]) == 2 * 5 + 1               # agg: frontend + worker; disagg: frontend + prefill + decode; serve


def test_arg_probe_can_fail(installed_probe):
    "The probe rejects what vLLM would: an unknown flag, a choice vLLM does not offer, a class or parser that does not exist."
    _, probe = installed_probe
    bad = {**probe, "results": [r for r in probe["results"] if r["where"].startswith("bad/")]}
    assert [l.split(":")[0] for l in D.arg_problems(bad)] == ["bad/flag", "bad/kv", "bad/lp", "bad/tool"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return D.build_wheel(tmp_path_factory.mktemp("dist"))


def _install_versions():
    import importlib.metadata as md
    here = md.version("vllm").split("+")[0]
    return [(r, D.release(r).vllm) for r in D.RELEASES] + [("installed", here)]


@pytest.mark.parametrize("rel,version", _install_versions())
def test_dockerfile_install(rel, version, wheel, tmp_path):
    """The Dockerfile's RUN steps in a fresh environment with that vLLM and without this package: pip install passes,
    and vLLM's plugin loader registers the architecture, both parsers and the logits processor."""
    py = _interpreter(version)
    env_py = D.overlay_env(py, tmp_path / "env")
    r = D.Release("installed", version, True, True) if rel == "installed" else D.release(rel)
    steps = D.run_docker_steps(r, env_py, wheel)
    logs = "\n\n".join(f"$ {' '.join(a)}\n{log}" for a, _, log in steps)
    assert [rc for _, rc, _ in steps] == [0, 0], logs
    assert "registered" in steps[-1][2], logs


def test_cli_registered():
    from solar_open2.cli import COMMANDS
    if "dynamo" not in COMMANDS: pytest.skip("`dynamo` is not in solar_open2.cli.COMMANDS yet")
    assert COMMANDS["dynamo"][:2] == ("solar_open2.dynamo", "cli_dynamo")


def test_cli_end_to_end(tmp_path, capsys):
    "The command writes the golden files of its options, refuses to overwrite, and exits 2 on bad options."
    assert D.cli_dynamo(["--out", str(tmp_path), "--profile", "disagg", "--dynamo", "1.7.0"]) == 0
    for p in _dir("disagg", "1.7.0").iterdir(): assert (tmp_path / p.name).read_text() == p.read_text(), p.name
    assert D.cli_dynamo(["--out", str(tmp_path), "--profile", "disagg", "--dynamo", "1.7.0"]) == 2
    assert "already there" in capsys.readouterr().err
    assert D.cli_dynamo(["--dry-run", "--name", "Bad_Name"]) == 2
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [w["role"] for w in plan["workers"]] == ["prefill", "decode"] and plan["vllm"] == "0.33.0"
