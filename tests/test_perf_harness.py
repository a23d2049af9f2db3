"""The H200 performance harness (`benchmarks.engine.perf`, `benchmarks.engine.plot`) without a GPU: arguments,
the served config.json, the plugin's entry-point shim, log capture and parsing (lines written in vLLM 0.25.1's own
formats), figures from token times, rooflines, the profile summary, JSON assembly and its sanity gate, merge, the
prediction log, plot."""
import importlib.util, json, math, os, subprocess, sys, tempfile, textwrap, time
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import common as kb
from benchmarks.engine import perf as ph
from benchmarks.engine import plot as pp
from benchmarks.engine.perf import run as prun
from benchmarks.engine.perf.trace import _busy_us

ROOT = Path(__file__).resolve().parents[1]
PERF = [sys.executable, "-m", "benchmarks.engine.perf"]          # the command line, run from the repository root

from solar_open2 import budget
from solar_open2.config import SolarOpen2Config

# --------------------------------------------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------------------------------------------

def test_defaults_real_and_tiny():
    a = ph.parse_args(["--phase", "eager"])
    assert (a.config, a.tp, a.max_model_len, a.kv_bytes) == ("real", 2, 40960, 16_000_000_000)
    assert a.decode_contexts == [2048, 32768] and a.prefill_contexts == [8192, 32768] and a.batch_sizes == [8, 32, 64]
    assert a.capture_sizes == [1, 2, 4, 8, 16, 32, 64] and not a.profile
    t = ph.parse_args(["--config", "tiny", "--phase", "graphs", "--profile", "--decode-contexts", "1k,2K"])
    assert (t.tp, t.max_model_len, t.decode_contexts, t.profile) == (1, 8192, [1000, 2048], True)
    assert ph.PRESETS["real"]["decode_contexts"] == [2048, 32768]      # presets are not mutated by resolve

@pytest.mark.parametrize("argv, needle", [
    (["--decode-contexts", "40900"], "--decode-contexts"),
    (["--prefill-contexts", "40960"], "--prefill-contexts"),
    (["--tp", "3"], "tensor-parallel-size 3"),
    (["--batch-sizes", "8,128"], "--max-num-seqs"),
    (["--max-model-len", "2M"], "max_position_embeddings"),
    (["--kv-cache-memory-bytes", "1g"], "vLLM would refuse"),
    (["--decode-tokens", "2"], "--decode-tokens"),
    (["--decode-contexts", "x"], "--decode-contexts"),
    (["--phase", "fast"], "--phase"),
    (["--config", "rank", "--tp", "2"], "--tp must be 1"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, needle, capsys):
    with pytest.raises(SystemExit) as e: ph.parse_args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err

def test_strip_flags():
    argv = ["--phase", "all", "--config", "tiny", "--deadline-s=300", "--profile", "--deadline-s", "9"]
    assert ph.strip_flags(argv, ("--phase", "--deadline-s")) == ["--config", "tiny", "--profile"]

# --------------------------------------------------------------------------------------------------------------
# config.json and engine arguments
# --------------------------------------------------------------------------------------------------------------

def test_default_model_dir_is_one_fixed_path_per_config(tmp_path):
    "vLLM's compile cache (and the autotuning results in it) is keyed on the model path: it must not change per run."
    assert ph.stable_model_dir("real") == ph.stable_model_dir("real") != ph.stable_model_dir("tiny")
    assert ph.stable_model_dir("real").parent == Path(tempfile.gettempdir())
    assert ph.model_dir_for(ph.parse_args(["--phase", "graphs"])) == ph.stable_model_dir("real")   # what run_phase writes to
    assert ph.model_dir_for(ph.parse_args(["--phase", "graphs", "--config", "tiny"])) == ph.stable_model_dir("tiny")
    assert ph.model_dir_for(ph.parse_args(["--phase", "graphs", "--model-dir", str(tmp_path)])) == tmp_path
    d = tmp_path / "m"
    first = ph.write_model_dir("real", d).joinpath("config.json").read_text()
    assert ph.write_model_dir("real", d).joinpath("config.json").read_text() == first   # a second run rewrites it unchanged

def test_model_dir_is_the_real_config_with_nota_quant_block(tmp_path):
    from solar_open2.checkpoint import bf16_linear_modules, quantization_problems
    d = ph.write_model_dir("real", tmp_path / "m")
    assert sorted(p.name for p in d.iterdir()) == ["config.json"]
    cfg = SolarOpen2Config.from_pretrained(d)
    real = SolarOpen2Config.real()
    assert cfg.to_dict() | {"quantization_config": None} == real.to_dict() | {"quantization_config": None}
    q = cfg.quantization_config
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "nvfp4-pack-quantized"
    assert q["ignore"] == bf16_linear_modules(real) and "lm_head" in q["ignore"]
    assert not any(".experts." in x for x in q["ignore"])
    assert quantization_problems(q, "compressed-tensors", cfg) == []
    vq = pytest.importorskip("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors")
    ct = vq.CompressedTensorsConfig.from_config(q)                  # vLLM reads the block as NVFP4 W4A4, group 16
    t = ct.target_scheme_map["Linear"]
    assert ct._is_nvfp4_format(t["weights"]) and ct._is_nvfp4_format(t["input_activations"]) and len(ct.ignore) == 577
    (d / "model.safetensors").write_text("x")
    with pytest.raises(FileExistsError, match="other than config.json"): ph.write_model_dir("real", d)

def test_engine_kwargs_are_valid_vllm_arguments(tmp_path):
    pytest.importorskip("vllm")
    m = str(tmp_path)          # an existing local dir: with HF_HUB_OFFLINE=1 (as CI runs) a missing path is taken for a hub id
    from vllm.config import CompilationConfig, ProfilerConfig
    from vllm.engine.arg_utils import EngineArgs
    a = ph.parse_args(["--phase", "graphs", "--moe-backend", "marlin"])
    e = ph.engine_kwargs(a, m, "eager")
    assert e["enforce_eager"] and "compilation_config" not in e and "profiler_config" not in e
    assert (e["load_format"], e["skip_tokenizer_init"], e["enable_prefix_caching"], e["kv_cache_memory_bytes"]) == \
        ("solar_open2_dummy", True, False, 16_000_000_000)                      # the plugin's benchmark dummy weights by default
    EngineArgs(**e)
    assert ph.engine_kwargs(ph.parse_args(["--phase", "graphs", "--dummy-weights", "vllm"]), m, "eager")["load_format"] == "dummy"
    g = ph.engine_kwargs(a, m, "graphs", "/tmp/prof")
    cc, pc = CompilationConfig(**g.pop("compilation_config")), ProfilerConfig(**g.pop("profiler_config"))
    assert cc.cudagraph_capture_sizes == [1, 2, 4, 8, 16, 32, 64] and not g.get("enforce_eager")
    assert (pc.profiler, pc.delay_iterations, pc.max_iterations) == ("torch", ph.PROFILE_DELAY_STEPS, 8)
    ea = EngineArgs(**g, compilation_config=cc, profiler_config=pc)
    assert ea.moe_backend == "marlin" and ea.tensor_parallel_size == 2
    a.compile = "none"
    cc = CompilationConfig(**ph.engine_kwargs(a, m, "graphs")["compilation_config"])
    assert cc.mode == 0 and cc.cudagraph_mode.name == "FULL_DECODE_ONLY"
    with pytest.raises(ValueError, match="phase"): ph.engine_kwargs(a, m, "fast")

def test_attention_flags_reach_the_engine_and_the_settings(tmp_path):
    a = ph.parse_args(["--phase", "graphs"])
    assert "attention_config" not in ph.engine_kwargs(a, str(tmp_path), "graphs")          # vLLM's own choice
    assert (ph.settings(a, "graphs")["attention_backend_requested"], ph.settings(a, "graphs")["attn_max_splits"]) == (None, None)
    b = ph.parse_args(["--phase", "graphs", "--attention-backend", "TRITON_ATTN", "--attn-max-splits", "8"])
    for phase in ("eager", "graphs"):
        assert ph.engine_kwargs(b, str(tmp_path), phase)["attention_config"] == {
            "backend": "TRITON_ATTN", "flash_attn_max_num_splits_for_cuda_graph": 8}
    assert (ph.settings(b, "graphs")["attention_backend_requested"], ph.settings(b, "graphs")["attn_max_splits"]) == ("TRITON_ATTN", 8)
    for bad, msg in ((["--attn-max-splits", "0"], "--attn-max-splits"), (["--attention-backend", "triton attn"], "--attention-backend")):
        with pytest.raises(ValueError, match=msg): ph.resolve(ph.build_parser().parse_args(["--phase", "graphs", *bad]))
    if importlib.util.find_spec("vllm") is not None:                          # vLLM parses both into its AttentionConfig
        from vllm.engine.arg_utils import EngineArgs
        ac = EngineArgs(**ph.engine_kwargs(b, str(tmp_path), "graphs")).attention_config
        assert (ac.backend.name, ac.flash_attn_max_num_splits_for_cuda_graph) == ("TRITON_ATTN", 8)

def test_fuse_kda_proj_flag_reaches_the_engine_and_the_settings(tmp_path):
    a = ph.parse_args(["--phase", "graphs"])
    assert not a.fuse_kda_proj and "additional_config" not in ph.engine_kwargs(a, str(tmp_path), "graphs")
    assert ph.settings(a, "graphs")["fuse_kda_proj"] is None                 # None: the plugin's own default
    n = ph.parse_args(["--phase", "graphs", "--no-fuse-kda-proj"])
    assert ph.engine_kwargs(n, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"fuse_kda_proj": False}}
    f = ph.parse_args(["--phase", "graphs", "--fuse-kda-proj"])
    for phase in ("eager", "graphs"):
        assert ph.engine_kwargs(f, str(tmp_path), phase)["additional_config"] == {"solar_open2": {"fuse_kda_proj": True}}
    assert ph.settings(f, "graphs")["fuse_kda_proj"] is True
    if importlib.util.find_spec("vllm") is not None:
        from vllm.engine.arg_utils import EngineArgs
        e = ph.engine_kwargs(f, str(tmp_path), "eager")
        assert EngineArgs(**e).additional_config == {"solar_open2": {"fuse_kda_proj": True}}

def test_kda_gate_kernel_flag_joins_the_other_plugin_key(tmp_path):
    a = ph.parse_args(["--phase", "graphs"])
    assert a.kda_gate_kernel is None and ph.settings(a, "graphs")["kda_gate_kernel"] is None
    g = ph.parse_args(["--phase", "graphs", "--kda-gate-kernel"])
    assert ph.engine_kwargs(g, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"kda_gate_kernel": True}}
    both = ph.parse_args(["--phase", "graphs", "--no-fuse-kda-proj", "--kda-gate-kernel"])   # one dict, neither lost
    assert ph.engine_kwargs(both, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"fuse_kda_proj": False, "kda_gate_kernel": True}}
    assert ph.settings(both, "graphs")["kda_gate_kernel"] is True
    three = ph.parse_args(["--phase", "graphs", "--kda-gate-kernel", "--gemv-kernel"])
    assert ph.engine_kwargs(three, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"kda_gate_kernel": True, "gemv_kernel": True}}
    assert ph.settings(three, "graphs")["gemv_kernel"] is True and ph.settings(both, "graphs")["gemv_kernel"] is None
    four = ph.parse_args(["--phase", "graphs", "--kda-gate-kernel", "--gemv-kernel", "--kda-decode-kernel"])
    assert ph.engine_kwargs(four, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"kda_gate_kernel": True, "gemv_kernel": True, "kda_decode_kernel": True}}
    assert ph.settings(four, "graphs")["kda_decode_kernel"] is True and ph.settings(three, "graphs")["kda_decode_kernel"] is None
    off = ph.parse_args(["--phase", "graphs", "--no-router-kernel"])          # 08k's key, default on: only set when asked
    assert ph.engine_kwargs(off, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"router_kernel": False}}
    assert ph.settings(off, "graphs")["router_kernel"] is False and ph.settings(four, "graphs")["router_kernel"] is None
    pairs = ph.parse_args(["--phase", "graphs", "--moe-pairs"])
    assert ph.engine_kwargs(pairs, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"moe_pairs": True}}
    assert ph.settings(pairs, "graphs")["moe_pairs"] is True and ph.settings(off, "graphs")["moe_pairs"] is None
    gates = ph.parse_args(["--phase", "graphs", "--kda-decode-gates", "--moe-pairs"])
    assert ph.engine_kwargs(gates, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"moe_pairs": True, "kda_decode_gates": True}}
    assert ph.settings(gates, "graphs")["kda_decode_gates"] is True and ph.settings(pairs, "graphs")["kda_decode_gates"] is None
    nopairs = ph.parse_args(["--phase", "graphs", "--no-gemv-pairs"])          # 08i's pairs, default on: only set when asked
    assert ph.engine_kwargs(nopairs, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"gemv_pairs": False}}
    assert ph.settings(nopairs, "graphs")["gemv_pairs"] is False and ph.settings(gates, "graphs")["gemv_pairs"] is None
    noflat = ph.parse_args(["--phase", "graphs", "--no-gemv-flat"])            # 08i's flat body, default on: only set when asked
    assert ph.engine_kwargs(noflat, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"gemv_flat": False}}
    assert ph.settings(noflat, "graphs")["gemv_flat"] is False and ph.settings(gates, "graphs")["gemv_flat"] is None
    nodirect = ph.parse_args(["--phase", "graphs", "--no-moe-direct-out"])    # 08g's direct output, default on: only set when asked
    assert ph.engine_kwargs(nodirect, str(tmp_path), "graphs")["additional_config"] == {"solar_open2": {"moe_direct_out": False}}
    assert ph.settings(nodirect, "graphs")["moe_direct_out"] is False and ph.settings(noflat, "graphs")["moe_direct_out"] is None

def test_plugin_flags_are_generated_from_the_options_table(tmp_path):
    "One --x / --no-x per option of solar_open2.vllm.options, and the plugin's own parser reads what the harness passes."
    from solar_open2.vllm.options import OPTIONS, parse_options
    flags = {a.dest: a for a in ph.build_parser()._actions if a.option_strings}
    for o in OPTIONS:
        assert flags[o.name].option_strings == [f"--{o.flag}", f"--no-{o.flag}"] and flags[o.name].default is None, o.name
        assert o.what in flags[o.name].help and ("on" if o.default else "off") in flags[o.name].help
    assert [d for d, _, _ in ph.PLUGIN_KEYS] == [o.name for o in OPTIONS] and "moe_kernels" in flags   # new with the table
    a = ph.parse_args(["--phase", "graphs", "--no-moe-kernels", "--gemv-pairs"])
    ac = ph.engine_kwargs(a, str(tmp_path), "graphs")["additional_config"]
    assert ac == {"solar_open2": {"gemv_pairs": True, "moe_kernels": False}}
    opts = parse_options(ac)
    assert (opts.gemv_pairs, opts.moe_kernels, opts.moe_pairs, opts.moe_direct_out) == (True, False, False, False)   # needs moe_kernels
    assert ph.settings(a, "graphs")["moe_kernels"] is False and ph.settings(a, "graphs")["router_kernel"] is None

def test_compile_sizes_and_max_autotune_reach_the_compilation_config(tmp_path):
    a = ph.parse_args(["--phase", "graphs"])
    cc = ph.engine_kwargs(a, str(tmp_path), "graphs")["compilation_config"]
    assert "compile_sizes" not in cc and "inductor_compile_config" not in cc
    b = ph.parse_args(["--phase", "graphs", "--compile-sizes", "8,1,2,4", "--max-autotune"])
    cc = ph.engine_kwargs(b, str(tmp_path), "graphs")["compilation_config"]
    assert cc["compile_sizes"] == [1, 2, 4, 8] and cc["inductor_compile_config"] == {"max_autotune": True}
    s = ph.settings(b, "graphs")
    assert (s["compile_sizes"], s["max_autotune"]) == ([8, 1, 2, 4], True)
    assert (ph.settings(b, "eager")["compile_sizes"], ph.settings(b, "eager")["max_autotune"]) == (None, False)
    if importlib.util.find_spec("vllm") is not None:
        from vllm.config import CompilationConfig
        c = CompilationConfig(**cc)
        assert c.compile_sizes == [1, 2, 4, 8] and c.inductor_compile_config["max_autotune"] is True
        default = CompilationConfig().inductor_compile_config                 # what vLLM sets here (platform-dependent)
        assert all(c.inductor_compile_config[k] == v for k, v in default.items())   # vLLM's own entries are kept

def test_allreduce_fusion_flag_reaches_the_pass_config_and_the_settings(tmp_path):
    a = ph.parse_args(["--phase", "graphs"])
    assert a.allreduce_fusion is None and "pass_config" not in ph.engine_kwargs(a, str(tmp_path), "graphs")["compilation_config"]
    assert ph.settings(a, "graphs")["allreduce_fusion_requested"] is None     # None: vLLM's own default
    for flag, want in (("--no-allreduce-fusion", False), ("--allreduce-fusion", True)):
        b = ph.parse_args(["--phase", "graphs", flag])
        cc = ph.engine_kwargs(b, str(tmp_path), "graphs")["compilation_config"]
        assert cc["pass_config"] == {"fuse_allreduce_rms": want} and ph.settings(b, "graphs")["allreduce_fusion_requested"] is want
        assert "compilation_config" not in ph.engine_kwargs(b, str(tmp_path), "eager")   # eager: no compile, no pass
        assert ph.settings(b, "eager")["allreduce_fusion_requested"] is None
        if importlib.util.find_spec("vllm") is not None:
            from vllm.config import CompilationConfig
            assert CompilationConfig(**cc).pass_config.fuse_allreduce_rms is want
    # an A/B variant may carry it
    assert ph.parse_ab(["noar=--no-allreduce-fusion"]) == [("noar", ["--no-allreduce-fusion"])]

def test_parse_engine_log_records_why_the_allreduce_fusion_was_left_out():
    line = ("(Worker_TP0 pid=5239) WARNING 11-30 05:09:56 [allreduce_rms_fusion.py:978] Flashinfer is not installed or "
            "comm module not found, skipping allreduce fusion pass\n")
    line2 = "(Worker_TP0 pid=5239) WARNING 11-30 05:09:58 [allreduce_rms_fusion.py:1102] AllReduce fusion pass is disabled.\n"
    r = ph.parse_engine_log(_sample_log() + line + line.replace("TP0", "TP1") + line2)
    assert r["allreduce_fusion_off"] == ["Flashinfer is not installed or comm module not found", "AllReduce fusion pass is disabled"]
    assert ph.parse_engine_log(_sample_log())["allreduce_fusion_off"] == []     # nothing said: the pass ran

def test_token_prompts_are_deterministic_and_in_range():
    p = ph.token_prompt(4096, 196608, 7)
    assert p == ph.token_prompt(4096, 196608, 7) and p != ph.token_prompt(4096, 196608, 8)
    assert len(p) == 4096 and 1000 <= min(p) and max(p) < 196608 - 1000
    t = ph.token_prompt(500, 1024, 1)
    assert 128 <= min(t) and max(t) < 1024 - 128

# --------------------------------------------------------------------------------------------------------------
# the plugin shim and the environment every vLLM process inherits
# --------------------------------------------------------------------------------------------------------------

def test_shim_entry_point_is_seen_by_a_fresh_process(tmp_path):
    root = ph.write_plugin_shim(tmp_path / "shim", entry_point="probe = json:dumps", group="solar_open2_test.plugins")
    code = ("from importlib.metadata import entry_points; eps = entry_points(group='solar_open2_test.plugins'); "
            "print([e.name for e in eps], eps['probe'].load()([1]))")
    env = dict(os.environ); ph.prepend_path(env, root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['probe'] [1]"
    env.pop("PYTHONPATH")                                  # and without the shim on the path: nothing
    out = subprocess.run([sys.executable, "-c", code.replace("eps['probe'].load()([1])", "0")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[] 0"

def test_shim_declares_the_plugin_entry_point(tmp_path):
    root = ph.write_plugin_shim(tmp_path)
    txt = (root / ph.SHIM_DIST / "entry_points.txt").read_text()
    assert txt == "[vllm.general_plugins]\nsolar_open2 = solar_open2.vllm:register\n"

def test_prepend_path_and_environment(tmp_path, monkeypatch):
    env = {"PYTHONPATH": "/a:/b"}
    assert ph.prepend_path(env, "/b", "/c") == "/b:/c:/a"
    for k in list(ph.NVLINK_ENV) + ["VLLM_PLUGINS"]: monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "mnnvl")                # multicast: crashed on the lent H200s
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    monkeypatch.setenv("PYTHONPATH", "/x")
    monkeypatch.setattr(sys, "path", list(sys.path))
    rec = ph.setup_environment(tmp_path)
    assert rec["NCCL_NVLS_ENABLE"] == "0" and rec["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and rec["NVSHMEM_DISABLE_NVLS"] == "1"
    assert rec["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == os.environ["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"   # forced too
    assert os.environ["PYTHONPATH"].split(":")[:2] == [str(ph.ROOT), str(tmp_path)] and os.environ["PYTHONPATH"].endswith(":/x")
    assert os.environ["VLLM_PLUGINS"] == "lora_filesystem_resolver,solar_open2,solar_open2_dummy"   # the load format's too
    assert rec["TRITON_CACHE_AUTOTUNING"] == os.environ["TRITON_CACHE_AUTOTUNING"]
    monkeypatch.delenv("VLLM_DISABLE_SHARED_EXPERTS_STREAM", raising=False)
    rec = ph.setup_environment(tmp_path, {"VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1", "NCCL_NVLS_ENABLE": "0"})
    assert rec["VLLM_DISABLE_SHARED_EXPERTS_STREAM"] == os.environ["VLLM_DISABLE_SHARED_EXPERTS_STREAM"] == "1"

def test_env_flag_parses_repeats_and_names_bad_pairs():
    a = ph.parse_args(["--phase", "graphs", "--env", "VLLM_DISABLE_SHARED_EXPERTS_STREAM=1", "--env", "X_Y=a=b"])
    assert a.env == [("VLLM_DISABLE_SHARED_EXPERTS_STREAM", "1"), ("X_Y", "a=b")]
    assert ph.settings(a, "graphs")["env"] == {"VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1", "X_Y": "a=b"}
    assert ph.settings(ph.parse_args(["--phase", "graphs"]), "graphs")["env"] == {}
    for bad in ("NOVALUE", "1X=2", "=3"):
        with pytest.raises(SystemExit): ph.parse_args(["--phase", "graphs", "--env", bad])
    assert ph.parse_ab(["seq=--moe-backend emulation --env VLLM_DISABLE_SHARED_EXPERTS_STREAM=1"]) == \
        [("seq", ["--moe-backend", "emulation", "--env", "VLLM_DISABLE_SHARED_EXPERTS_STREAM=1"])]

# --------------------------------------------------------------------------------------------------------------
# log capture and parsing
# --------------------------------------------------------------------------------------------------------------

def test_log_capture_collects_children_output(tmp_path, capfd):
    log = tmp_path / "engine.log"
    with ph.LogCapture(log) as cap:
        os.write(1, b"parent line\n")
        subprocess.run([sys.executable, "-c", "import sys; print('child stdout'); print('child stderr', file=sys.stderr)"])
        pid = os.fork()
        if pid == 0:
            os.write(1, b"forked child\n"); os._exit(0)
        os.waitpid(pid, 0)
        seen = cap.text()
    for s in ("parent line", "child stdout", "child stderr", "forked child"): assert s in seen
    assert "child stdout" in capfd.readouterr().out          # echoed to the original stdout too
    os.write(1, b"after\n")
    assert "after" not in log.read_text() and "after" in capfd.readouterr().out   # file descriptors restored

def _sample_log(tokens="591,969", conc="14.45"):
    "Lines as vLLM 0.25.1 writes them for this run (format strings of the files named in brackets), in a pipe (no colour)."
    return textwrap.dedent(f"""\
    INFO 11-30 10:00:01 [utils.py:253] non-default args: {{'model': '/tmp/m', 'skip_tokenizer_init': True}}
    INFO 11-30 10:00:05 [model.py:1776] Using max model len 40960
    INFO 11-30 10:00:06 [vllm.py:1043] Asynchronous scheduling is enabled.
    (EngineCore pid=4123) INFO 11-30 10:00:09 [core.py:115] Initializing a V1 LLM engine (v0.25.1) with config: model='/tmp/m', load_format=dummy, tensor_parallel_size=2
    (EngineCore pid=4123) WARNING 11-30 10:00:09 [multiproc_executor.py:921] Reducing Torch parallelism from 16 threads to 1 to avoid unnecessary CPU contention.
    (Worker_TP0 pid=4201) INFO 11-30 10:00:19 [pynccl.py:113] vLLM is using nccl==2.28.3
    (Worker_TP0 pid=4201) INFO 11-30 10:00:20 [cuda_communicator.py:264] Using ['CUSTOM', 'SYMM_MEM', 'PYNCCL'] all-reduce backends (in dispatch order) for group 'tp:0' out of potential backends: ['CUSTOM', 'SYMM_MEM', 'PYNCCL'].
    (Worker_TP0 pid=4201) INFO 11-30 10:00:21 [cuda.py:476] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].
    (Worker_TP0 pid=4201) INFO 11-30 10:00:22 [nvfp4.py:210] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', 'FLASHINFER_CUTEDSL_BATCHED', 'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN', 'HUMMING', 'EMULATION'].
    (Worker_TP1 pid=4202) INFO 11-30 10:00:22 [nvfp4.py:210] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['MARLIN'].
    (Worker_TP0 pid=4201) INFO 11-30 10:00:40 [gpu_model_runner.py:5306] Model loading took 71.62 GiB memory and 17.204519 seconds
    (Worker_TP0 pid=4201) INFO 11-30 10:00:41 [interface.py:890] Setting attention block size to 1072 tokens to ensure that attention page size is >= mamba page size.
    (Worker_TP0 pid=4201) INFO 11-30 10:00:41 [interface.py:914] Padding mamba page size by 1.13% to ensure that mamba page size and attention page size are exactly equal.
    (Worker_TP0 pid=4201) INFO 11-30 10:01:05 [backends.py:1149] Dynamo bytecode transform time: 21.40 s
    (Worker_TP0 pid=4201) INFO 11-30 10:01:50 [monitor.py:34] torch.compile took 66.12 s in total
    (Worker_TP0 pid=4201) INFO 11-30 10:03:10 [gpu_worker.py:459] Initial free memory 139.21 GiB, reserved 14.9 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does not respect the gpu_memory_utilization config.
    (EngineCore pid=4123) INFO 11-30 10:03:11 [kv_cache_utils.py:2146] GPU KV cache size: {tokens} tokens
    (EngineCore pid=4123) INFO 11-30 10:03:11 [kv_cache_utils.py:2148] Maximum concurrency for 40,960 tokens per request: {conc}x
    (Worker_TP0 pid=4201) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 7/7 [00:03<00:00,  2.10it/s]
    (Worker_TP0 pid=4201) INFO 11-30 10:03:40 [gpu_model_runner.py:6707] Graph capturing finished in 24 secs, took 1.31 GiB
    (EngineCore pid=4123) INFO 11-30 10:03:41 [core.py:337] init engine (profile, create kv cache, warmup model) took 181.55 s (compilation: 66.12 s)
    (Worker_TP1 pid=4202) ERROR 11-30 10:03:42 [gpu_worker.py:1] something went wrong once
    """)

def test_parse_engine_log_sums_triton_autotuning_per_function():
    block = ("(Worker_TP{r} pid=4{r}) Triton autotuning for function chunk_kda_fwd_kernel,\n(Worker_TP{r} pid=4{r}) with key as "
             "(8192, 64, 'torch.bfloat16'),\n(Worker_TP{r} pid=4{r}) finished after {s}s,\n(Worker_TP{r} pid=4{r}) best "
             "config selected: BLOCK_K: 64, num_warps: 4;\n")
    other = "Triton autotuning for function l2norm_fwd_kernel,\nwith key as (128,),\nfinished after 0.50s,\nbest config selected: x;\n"
    a = ph.parse_engine_log(_sample_log() + block.format(r=0, s="12.25") + block.format(r=1, s="11.75") + other)["autotune"]
    assert a == {"runs": 3, "seconds": 24.5, "by_function": {"chunk_kda_fwd_kernel": {"runs": 2, "seconds": 24.0},
                                                             "l2norm_fwd_kernel": {"runs": 1, "seconds": 0.5}}}
    assert ph.parse_engine_log(_sample_log())["autotune"] == {"runs": 0, "seconds": 0.0, "by_function": {}}
    assert ph.RUN_ENV["TRITON_PRINT_AUTOTUNING"] == "1"
    txt = ph.summary_text({"phase": "graphs", "figures": {}, "engine": {"log_final": {"autotune": a, "init_engine_s": 186.6}}})
    assert "Triton autotuning 3 keys, 24.5 s over all processes, most: chunk_kda_fwd_kernel 24.0 s" in txt

def test_parse_engine_log():
    r = ph.parse_engine_log(_sample_log())
    assert (r["kv_cache_tokens"], r["max_concurrency"], r["max_concurrency_len"]) == (591969, 14.45, 40960)
    assert r["nvfp4_moe_backend"] == "MARLIN" and r["nvfp4_moe_candidates"][0] == "FLASHINFER_TRTLLM"
    assert r["moe_backends"] == [["MARLIN", "NvFp4"]] and r["attention_backends"] == ["FLASH_ATTN"]
    assert (r["block_size"], r["mamba_padding_pct"]) == (1072, 1.13)
    assert r["model_loading"] == [{"proc": "Worker_TP0", "gib": 71.62, "seconds": 17.204519}]
    assert (r["initial_free_gib"], r["kv_reserved_gib"]) == (139.21, 14.9)
    assert (r["graph_capture_s"], r["graph_capture_gib"]) == (24.0, 1.31)
    assert (r["init_engine_s"], r["compilation_s"], r["torch_compile_s"], r["dynamo_s"]) == (181.55, 66.12, 66.12, 21.4)
    assert r["async_scheduling"] == "enabled" and r["vllm_version_logged"] == "0.25.1"
    assert r["errors"] == ["Worker_TP1: something went wrong once"] and r["n_warnings"] == 1
    assert r["allreduce_backends"] == {"tp:0": ["CUSTOM", "SYMM_MEM", "PYNCCL"]} and r["nccl_version"] == "2.28.3"
    assert len(r["comm_lines"]) == 2 and r["comm_lines"][0] == "Worker_TP0: vLLM is using nccl==2.28.3"
    empty = ph.parse_engine_log("no vllm here\n")
    assert empty["kv_cache_tokens"] is None and empty["model_loading"] == [] and empty["nvfp4_moe_backend"] is None

def test_log_records_strip_colour_and_skip_other_lines():
    col = "\x1b[36m(EngineCore pid=7)\x1b[0m \x1b[32mINFO\x1b[0m \x1b[90m11-30 10:03:11\x1b[0m \x1b[90m[kv_cache_utils.py:2146]\x1b[0m GPU KV cache size: 1,234 tokens"
    recs = ph.log_records(col + "\nprogress bar 50%|#####\n")
    assert recs == [{"proc": "EngineCore", "pid": "7", "level": "INFO", "src": "kv_cache_utils.py:2146",
                     "msg": "GPU KV cache size: 1,234 tokens"}]
    assert ph.parse_engine_log(col)["kv_cache_tokens"] == 1234

def test_rank_config_is_one_tp2_rank_served_at_tp1(tmp_path):
    "--config rank: the real model's per-rank shapes at TP1, with the same KV pool, bytes and roofline as a TP2 rank."
    r, real = ph.parse_args(["--config", "rank", "--phase", "graphs"]), ph.parse_args(["--phase", "graphs"])
    assert (r.tp, real.tp) == (1, 2) and (r.max_model_len, r.kv_bytes, r.decode_contexts) == (real.max_model_len, real.kv_bytes, real.decode_contexts)
    cr, cf = ph.model_config("rank"), ph.model_config("real")
    assert (cr.num_attention_heads, cr.num_key_value_heads, cr.kda_num_heads, cr.moe_intermediate_size, cr.vocab_size) == (32, 4, 32, 640, 98_304)
    assert cr.quantization_config == cf.quantization_config                 # same BF16 module names, same NVFP4 block
    assert ph.kv_prediction(r)["log_lines"] == ph.kv_prediction(real)["log_lines"]
    assert math.isclose(ph.decode_roofline(cr, 1, 2144)["per_seq_tok_s"], ph.decode_roofline(cf, 2, 2144)["per_seq_tok_s"])
    assert ph.n_allreduces(cr, 1) == 0 and ph.n_allreduces(cf, 2) == 97
    assert ph.engine_kwargs(r, tmp_path, "graphs")["tensor_parallel_size"] == 1
    assert ph.stable_model_dir("rank") != ph.stable_model_dir("real")
    d = ph.write_model_dir("rank", tmp_path / "m")
    assert SolarOpen2Config.from_pretrained(d).to_dict() == cr.to_dict()
    assert "not the TP2 figure" in ph.new_result(r, "graphs", [])["config_note"] and ph.new_result(real, "graphs", [])["config_note"] is None
    assert ph.run_name("rank", "graphs", "gk6") == "perf_h200_rank_graphs_gk6"
    with pytest.raises(ValueError, match="expected one of"): ph.model_config("huge")

def test_kv_pool_prediction_matches_the_logged_lines():
    a = ph.parse_args(["--phase", "eager"])
    pred = ph.kv_prediction(a)
    assert pred["log_lines"] == ["GPU KV cache size: 591,969 tokens", "Maximum concurrency for 40,960 tokens per request: 14.45x"]
    assert (pred["block_size"], pred["num_blocks"], pred["page_bytes"]) == (1072, 607, 2_195_456)
    c = ph.compare_kv(pred, ph.parse_engine_log(_sample_log()))
    assert c["match"] is True and c["block_size_match"] is True
    c = ph.compare_kv(pred, ph.parse_engine_log(_sample_log(tokens="591,970")))
    assert c["match"] is False and c["tokens_match"] is False and c["concurrency_match"] is True
    assert ph.compare_kv(pred, ph.parse_engine_log(""))["match"] is None
    t = ph.parse_args(["--config", "tiny", "--phase", "eager"])   # the tiny dry run predicts its own pool
    pt = ph.kv_prediction(t)
    assert pt["gpu_kv_cache_tokens"] == budget.plan(tp=1, kv_cache_memory_bytes="2g", max_model_len=8192, max_num_seqs=64,
                                                    cfg=SolarOpen2Config.tiny()).gpu_kv_cache_tokens

def test_parse_smi():
    text = "0, 1000, 143771\n1, 900, 143771\n0, 90000, 143771\n1, 88000, 143771\ngarbage\n0, [N/A], 1\n"
    r = ph.parse_smi(text)
    assert r["peak_used_mib"] == {"0": 90000.0, "1": 88000.0} and r["samples"] == {"0": 2, "1": 2}
    assert r["peak_used_gib"]["0"] == round(90000 / 1024, 3) and r["total_mib"]["1"] == 143771.0
    assert ph.parse_smi("") == {"peak_used_mib": {}, "total_mib": {}, "peak_used_gib": {}, "samples": {}}

# --------------------------------------------------------------------------------------------------------------
# figures from token arrival times
# --------------------------------------------------------------------------------------------------------------

def _rec(prompt, t_add, first, gap, n):
    return {"prompt_len": prompt, "t_add": t_add, "times": [first + i * gap for i in range(n)], "tokens": list(range(n))}

def test_single_stream_stats():
    s = ph.single_stream_stats(_rec(2048, 10.0, 10.5, 0.004, 101))
    assert math.isclose(s["ttft_s"], 0.5) and math.isclose(s["prefill_tok_s"], 4096)
    assert math.isclose(s["decode_tok_s"], 250, rel_tol=1e-9) and math.isclose(s["itl_median_ms"], 4, rel_tol=1e-6)
    assert s["stall_s"] == 0 and math.isclose(s["itl_max_ms"], 4, rel_tol=1e-6)
    r = _rec(2048, 0.0, 1.0, 0.005, 101)
    r["times"] = r["times"][:40] + [x + 0.3 for x in r["times"][40:]]         # one 300 ms stall after token 39
    st = ph.single_stream_stats(r)
    assert math.isclose(st["stall_s"], 0.3, rel_tol=1e-6) and st["itl_top"][0] == [39, 305.0]
    assert math.isclose(st["decode_s"], 0.8) and math.isclose(st["itl_median_ms"], 5, rel_tol=1e-6)
    one = ph.single_stream_stats(_rec(8192, 0.0, 2.0, 0.0, 1))
    assert one["prefill_tok_s"] == 4096 and "decode_tok_s" not in one
    with pytest.raises(ValueError): ph.single_stream_stats({"prompt_len": 1, "t_add": 0, "times": [], "tokens": []})

def test_batch_stats_uses_the_all_decoding_window():
    recs = [_rec(512, 0.0, 1.0 + 0.1 * i, 0.01, 101) for i in range(4)]   # staggered starts, 100 tok/s each
    s = ph.batch_stats(recs)
    assert s["window"] == "all-decoding" and math.isclose(s["window_s"], 1.0 - 0.3)
    assert math.isclose(s["decode_tok_s"], 400, rel_tol=0.02) and math.isclose(s["per_seq_tok_s"], 100, rel_tol=0.02)
    assert math.isclose(s["ttft_max_s"], 1.3)
    flat = [_rec(512, 0.0, 1.0 + i, 0.001, 3) for i in range(3)]        # no common window: fallback
    assert ph.batch_stats(flat)["window"] == "fallback"
    with pytest.raises(ValueError): ph.batch_stats([_rec(1, 0, 1, 0.1, 1)])

class FakeEngine:
    """LLMEngine's add_request / step / has_unfinished_requests, emitting DELTA outputs one token per step: ids that
    vary along a request and with its prompt, or, `degenerate` (what NaN logits give), one id for everything."""
    degenerate = False
    def __init__(self, step_s=0.001): self.reqs, self.step_s, self.asked = {}, step_s, {}
    def add_request(self, rid, prompt, params):
        assert set(prompt) == {"prompt_token_ids"} and params.max_tokens >= 1 and params.ignore_eos
        self.reqs[rid] = [len(prompt["prompt_token_ids"]), params.max_tokens, sum(prompt["prompt_token_ids"]) % 100_003]
        self.asked[rid] = (len(prompt["prompt_token_ids"]), params.max_tokens)
    def has_unfinished_requests(self): return any(v[1] > 0 for v in self.reqs.values())
    def step(self):
        time.sleep(self.step_s)
        outs = []
        for rid, v in self.reqs.items():
            if v[1] > 0:
                v[1] -= 1
                tok = 0 if self.degenerate else 7 + v[2] + v[1] % 3
                outs.append(SimpleNamespace(request_id=rid, outputs=[SimpleNamespace(token_ids=[tok])]))
        return outs

def test_run_requests_with_a_fake_engine():
    pytest.importorskip("vllm")
    recs = ph.run_requests(FakeEngine(), [[1] * 10, [2] * 20], 5, "t")
    assert [r["prompt_len"] for r in recs] == [10, 20] and all(len(r["times"]) == 5 == len(r["tokens"]) for r in recs)
    assert all(r["times"] == sorted(r["times"]) and r["times"][0] > r["t_add"] for r in recs)
    assert ph.single_stream_stats(recs[0])["decode_tok_s"] > 0
    s = ph.output_sanity(recs)
    assert (s["distinct_ids_min"], s["distinct_ids_max"], s["degenerate"], s["passed"], s["note"]) == (3, 3, False, True, "")
    same = [{"tokens": [5] * 32}]
    assert (ph.output_sanity(same)["degenerate"], ph.output_sanity(same)["passed"]) == (True, False)
    assert ph.output_sanity([{"tokens": [5] * 4}])["passed"] is None                # four tokens: too few to tell
    firsts = ph.first_token_sanity([{"tokens": [5]}, {"tokens": [6]}])
    assert (firsts["passed"], ph.first_token_sanity([{"tokens": [5]}, {"tokens": [5]}])["passed"]) == (True, False)
    assert ph.first_token_sanity([{"tokens": [5]}])["passed"] is None               # one prompt: nothing to compare

# --------------------------------------------------------------------------------------------------------------
# rooflines
# --------------------------------------------------------------------------------------------------------------

def test_rooflines_come_from_the_budget():
    cfg = SolarOpen2Config.real()
    r = ph.decode_roofline(cfg, 2, 2048 + 96)
    assert math.isclose(r["per_seq_tok_s"], budget.decode_ceiling("h200", cfg, 2, 2144))
    assert math.isclose(r["per_seq_tok_s"] * r["bytes_per_step_per_rank"], 4.8e12)
    b = ph.decode_roofline(cfg, 2, 576, 64)
    assert math.isclose(b["aggregate_tok_s"], 64 * budget.decode_ceiling("h200", cfg, 2, 576, batch=64))
    assert b["aggregate_tok_s"] > 5 * r["per_seq_tok_s"]                   # batching amortises the weights
    f = ph.with_roofline({"decode_tok_s": 240.0}, r, "decode_tok_s", "per_seq_tok_s", "decode-bandwidth")
    assert math.isclose(f["fraction_of_roofline"], 240.0 / r["per_seq_tok_s"]) and f["value_tok_s"] == 240.0

def test_prefill_flops_and_step_model():
    cfg = SolarOpen2Config.real()
    dense = 2 * (cfg.active_params() - cfg.vocab_size * cfg.hidden_size) / 2
    f8, f32 = ph.prefill_flops_per_token(cfg, 2, 8192), ph.prefill_flops_per_token(cfg, 2, 32768)
    assert dense < f8 < f32 < 1.5 * dense
    assert math.isclose(f32 - f8, 12 * 4 * 64 * 128 * (32768 - 8192) / 2 / 2)
    assert math.isclose(ph.prefill_roofline(cfg, 2, 8192)["tok_s"], ph.H200_BF16_FLOPS / f8)
    us = ph.predicted_step_us(cfg, 2, 2048, allreduce_us=10.0)
    mem = sum(v for k, v in us.items() if k not in ("allreduce", "total"))
    assert math.isclose(mem, 1e6 * budget.decode_bytes(cfg, 2, 2048) / 4.8e12)
    assert us["allreduce"] == 97 * 10.0 and math.isclose(us["total"], mem + 970)
    assert ph.predicted_step_us(SolarOpen2Config.tiny(), 1, 512)["allreduce"] == 0

# --------------------------------------------------------------------------------------------------------------
# the profile
# --------------------------------------------------------------------------------------------------------------

KERNELS = {
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "allreduce",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)": "allreduce",
    "void marlin_moe_wna16::Marlin<(vllm::ScalarType::Id)5, 256, 1, 8, 8, 8, true, false, 8, true>(int4 const*, ...)": "moe",
    "humming": "moe",                                                  # Humming's JIT GEMM (moe_backend humming)
    "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 2, true>(...)": "allreduce",
    "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*)": "moe",
    "void vllm::moe::grouped_topk_fused_kernel<float, 8>(float*, ...)": "moe",
    "fused_recurrent_gated_delta_rule_fwd_kernel": "kda",
    "kda_gate_fwd_kernel": "kda",
    "_causal_conv1d_update_kernel": "kda",
    "layer_norm_gated_fwd_kernel": "kda",
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "kda",
    "void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<...>>>(...)": "attention",
    "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(...)": "attention",
    "nvjet_hsh_128x64_64x5_2x1_v_bz_coopB_TNT": "dense_gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "dense_gemm",
    "void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, ...)": "norm_act",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norm_act",
    "void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::BFloat16>(c10::BFloat16 const&)), true>(...)": "norm_act",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)": "sampling",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4> >(...)": "norm_act",
    "some_unknown_kernel": "other",
}

def test_classify_kernel():
    for name, fam in KERNELS.items(): assert ph.classify_kernel(name) == fam, name
    assert ph.classify_kernel("Memcpy DtoD (Device -> Device)", "gpu_memcpy") == "memcpy"

def _trace(steps=4):
    ev, t = [], 0.0
    for s in range(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)", "ts": t, "dur": 900})
        for name, dur in (("nvjet_hsh_128x64_64x5_2x1_v_bz_coopB_TNT", 300), ("void marlin_moe_wna16::Marlin<...>", 100),
                          ("fused_recurrent_gated_delta_rule_fwd_kernel", 20), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 40)):
            ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur}); t += dur + 10
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": t, "dur": 5}); t += 500
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 3})
    return {"traceEvents": ev}

def test_summarize_trace():
    s = ph.summarize_trace(_trace(4), top_n=3)
    assert s["steps"] == 4 and s["kernel_us"] == 4 * 465
    fam = {r["family"]: r for r in s["families"]}
    assert fam["dense_gemm"]["us_per_step"] == 300 and fam["moe"]["us_per_step"] == 100 and fam["memcpy"]["kernels"] == 4
    assert [r["family"] for r in s["families"]][:2] == ["dense_gemm", "moe"]
    assert len(s["top_kernels"]) == 3 and s["top_kernels"][0]["avg_us"] == 300
    assert math.isclose(s["gpu_busy_us"], 4 * 465) and 0 < s["gpu_busy_fraction"] < 1
    assert ph.summarize_trace(_trace(4), steps=2)["families"][0]["us_per_step"] == 600
    rows = {r["family"]: r for r in ph.compare_profile(s, {"dense_gemm": 150.0, "moe": 100.0, "allreduce": 0.0})}
    assert rows["dense_gemm"]["measured_over_predicted"] == 2.0 and rows["moe"]["measured_over_predicted"] == 1.0
    assert rows["allreduce"]["measured_over_predicted"] is None and rows["attention"]["measured_us_per_step"] is None
    assert _busy_us([(0, 10), (5, 12), (20, 21)]) == 13

def test_host_waits_tell_a_serial_step_from_an_overlapped_one():
    """Two steps of each kind: the host waits 2 ms, then prepares for 3 ms and launches the graph (4 ms of kernels).
    Serial: the wait was for the step before, so the GPU idles through the preparation. Overlapped: the step before's
    kernels still run during it. Waits under 50 us are not counted."""
    from benchmarks.engine.perf.trace import host_waits
    def trace(overlap):
        ev, t = [], 0.0
        for _ in range(2):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": t, "dur": 2000})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": t + 2000, "dur": 10})
            if overlap: ev.append({"ph": "X", "cat": "kernel", "name": "k_prev", "ts": t + 2000, "dur": 3000})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": t + 5000, "dur": 50})
            ev.append({"ph": "X", "cat": "kernel", "name": "k", "ts": t + 5100, "dur": 4000}); t += 9200
        return {"traceEvents": ev}
    serial, over = host_waits(trace(False), steps=2), host_waits(trace(True), steps=2)
    assert (serial["calls"], serial["us_per_step"], serial["longest_us"]) == (2, 2000.0, 2000.0)
    assert (serial["prep_after_wait_us"], serial["gpu_idle_in_prep_us"]) == (3000.0, 3000.0)
    assert (over["prep_after_wait_us"], over["gpu_idle_in_prep_us"]) == (3000.0, 0.0)
    assert serial["by_call"] == {"cudaEventSynchronize": {"calls": 2, "us": 4000.0}}
    assert ph.summarize_trace(trace(False))["host_waits"]["calls"] == 2
    assert host_waits({"traceEvents": []})["prep_after_wait_us"] is None

def _layer_trace(layers=3):
    "Synthetic decode step: per layer an all-reduce, a KDA mixer, an all-reduce, a MoE with a shared expert on stream 2."
    ev, t = [], 0.0
    def k(name, dur, stream=7, gap=1.0):
        nonlocal t
        ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur, "args": {"stream": stream}}); t += dur + gap
    for i in range(layers):
        k("allreduce_fusion_kernel_oneshot_lamport", 5)
        k("nvjet_qkvb", 28 + i); k("kda_gate_fwd_kernel", 2); k("fused_recurrent_gated_delta_rule_fwd_kernel", 4)
        k("allreduce_fusion_kernel_oneshot_lamport", 5)
        k("gemvx_router", 5); k("grouped_topk_kernel", 4)
        ev.append({"ph": "X", "cat": "kernel", "name": "nvjet_shared", "ts": t, "dur": 6, "args": {"stream": 9}})   # overlaps
        k("marlin_moe_gemm", 16 if i != 1 else 18, gap=0.0)
    k("allreduce_fusion_kernel_oneshot_lamport", 5)
    return {"traceEvents": ev}

def test_layer_segments_cut_at_allreduces_and_take_medians(tmp_path):
    seg = ph.layer_segments(_layer_trace(3))
    assert set(seg) == {"kda mixer", "moe"}
    kda, moe = seg["kda mixer"], seg["moe"]
    assert (kda["segments"], kda["with_signature"]) == (3, 3) and [x["us"] for x in kda["kernels"]] == [29, 2, 4]
    assert kda["kernel_us"] == 35 and kda["span_us"] == 37                  # median layer: 29 + 1 + 2 + 1 + 4
    assert [x["name"] for x in moe["kernels"]] == ["gemvx_router", "grouped_topk_kernel", "nvjet_shared", "marlin_moe_gemm"]
    assert [x["stream"] for x in moe["kernels"]] == [7, 7, 9, 7] and moe["kernels"][3]["us"] == 16
    assert moe["span_us"] == 5 + 1 + 4 + 1 + 16                            # the shared expert overlaps the GEMM
    assert ph.layer_segments(_layer_trace(1)) == {}                          # one segment of a kind: no median
    p = tmp_path / "t.json"; p.write_text(json.dumps(_layer_trace(3)))
    r = subprocess.run(PERF + ["layers", str(p)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "kda mixer: 3 segments, 3 with the sequence below" in r.stdout and "stream 9  nvjet_shared" in r.stdout
    r = subprocess.run(PERF + ["layers", str(tmp_path / "none.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no such trace file" in r.stderr

def test_layer_segments_of_a_tp1_trace_cut_at_the_norms():
    "--config rank traces have no all-reduce: the residual add + RMSNorm kernels cut them instead."
    tp2 = _layer_trace(3)
    tp1 = {"traceEvents": [dict(e, name="triton_red_fused_add_fused_add_rms_norm_1") if "allreduce" in e["name"] else e
                           for e in tp2["traceEvents"]]}
    assert ph.layer_segments(tp1) == ph.layer_segments(tp2)
    assert ph.layer_segments(tp1, cut="allreduce") == {}                     # nothing to cut at
    assert ph.layer_segments(tp2, cut="norm") == {}
    with pytest.raises(ValueError, match="cut must be"): ph.layer_segments(tp1, cut="layer")

def test_trace_files_rank0_first(tmp_path):
    import gzip
    for n in ("dp0_pp0_tp1_dcp0_ep0_rank1.123.pt.trace.json.gz", "dp0_pp0_tp0_dcp0_ep0_rank0.124.pt.trace.json.gz"):
        with gzip.open(tmp_path / n, "wt") as f: json.dump(_trace(1), f)
    fs = ph.find_traces(tmp_path)
    assert [p.name for p in fs] == ["dp0_pp0_tp0_dcp0_ep0_rank0.124.pt.trace.json.gz", "dp0_pp0_tp1_dcp0_ep0_rank1.123.pt.trace.json.gz"]
    assert ph.summarize_trace(ph.load_trace(fs[0]))["steps"] == 1

# --------------------------------------------------------------------------------------------------------------
# results: assembly, merge, the log, the plot
# --------------------------------------------------------------------------------------------------------------

def _phase_result(a, phase, scale):
    "A phase JSON as run_phase assembles it, with synthetic figures (`scale` x a fixed fraction of each roofline)."
    cfg = SolarOpen2Config.real()
    res = ph.new_result(a, phase, ["--phase", phase])
    res.update(status="complete", gpu={"name": "NVIDIA H200"}, versions={"vllm": "0.25.1"})
    res["kv_pool"] = {"predicted": ph.kv_prediction(a)}
    res["kv_pool"]["comparison"] = ph.compare_kv(res["kv_pool"]["predicted"], ph.parse_engine_log(_sample_log()))
    res["engine"] = {"init_s": 180.0, "log_final": ph.parse_engine_log(_sample_log())}
    for c in a.decode_contexts:
        roof = ph.decode_roofline(cfg, a.tp, c + a.decode_tokens / 2)
        res["figures"][f"decode_bs1_ctx{c}"] = ph.with_roofline({"kind": "decode", "context": c, "batch": 1,
            "decode_tok_s": scale * 0.3 * roof["per_seq_tok_s"]}, roof, "decode_tok_s", "per_seq_tok_s", "decode-bandwidth")
    for c in a.prefill_contexts:
        roof = ph.prefill_roofline(cfg, a.tp, c)
        res["figures"][f"prefill_ctx{c}"] = ph.with_roofline({"kind": "prefill", "context": c, "batch": 1,
            "prefill_tok_s": 0.2 * roof["tok_s"]}, roof, "prefill_tok_s", "tok_s", "prefill-compute")
    for b in a.batch_sizes:
        roof = ph.decode_roofline(cfg, a.tp, a.batch_prompt + a.batch_tokens / 2, b)
        res["figures"][f"decode_bs{b}"] = ph.with_roofline({"kind": "batch", "context": a.batch_prompt, "batch": b,
            "decode_tok_s": scale * 0.2 * roof["aggregate_tok_s"]}, roof, "decode_tok_s", "aggregate_tok_s", "decode-bandwidth")
    res["profile"] = ph.summarize_trace(_trace(3)) | {"vs_prediction": []}
    res["sanity"] = {k: {"passed": True, "degenerate": False} for k in res["figures"]}     # as measure() records them
    return res

def test_json_roundtrip_merge_and_acceptance(tmp_path):
    a = ph.parse_args(["--phase", "eager", "--results-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    e, g = _phase_result(a, "eager", 1.0), _phase_result(a, "graphs", 2.5)
    ph.write_json(e, ph.out_paths(a, "perf_h200_eager.json"))
    ph.write_json(g, ph.out_paths(a, "perf_h200_graphs.json"))
    assert (tmp_path / "out" / "perf_h200_eager.json").exists()
    r = ph.load_results(tmp_path)
    assert r["eager"]["figures"].keys() == e["figures"].keys() and r["merged"] is None
    assert r["eager"]["settings"]["kv_cache_memory_bytes"] == 16_000_000_000 and r["eager"]["command"].endswith("--phase eager")
    m = ph.merge(r["eager"], r["graphs"])
    assert [x["figure"] for x in m["rows"]] == ["decode_bs1_ctx2048", "decode_bs1_ctx32768", "prefill_ctx8192",
                                               "prefill_ctx32768", "decode_bs8", "decode_bs32", "decode_bs64"]
    d = m["rows"][0]
    assert math.isclose(d["graphs_over_eager"], 2.5) and math.isclose(d["graphs_fraction"], 0.75)
    acc = m["acceptance"]
    assert acc["graphs_over_eager_ok"] is True and acc["fraction_ok"] is True and acc["kv_pool_match"] == {"eager": True, "graphs": True}
    assert m["nvfp4_moe_backend"] == {"eager": "MARLIN", "graphs": "MARLIN"}
    only = ph.merge(r["eager"], None)
    assert only["rows"][0]["graphs_tok_s"] is None and only["acceptance"]["graphs_over_eager_ok"] is None
    with pytest.raises(ValueError, match="nothing to merge"): ph.merge(None, None)
    assert ph.main(["--phase", "merge", "--results-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "perf_h200.json").read_text())["acceptance"]["graphs_over_eager_ok"] is True
    txt = ph.summary_text(r["graphs"])
    assert "decode_bs1_ctx2048" in txt and "match=True" in txt and "MARLIN" in txt

def test_merge_without_results_exits_2(tmp_path, capsys):
    assert ph.main(["--phase", "merge", "--results-dir", str(tmp_path)]) == 2
    assert "nothing to merge" in capsys.readouterr().err

def test_prediction_log(tmp_path, capsys):
    a = ph.parse_args(["--phase", "graphs", "--results-dir", str(tmp_path)])
    res = tmp_path / "g.json"
    ph.write_json(_phase_result(a, "graphs", 2.0), [res])
    measured = json.loads(res.read_text())["figures"]["decode_bs1_ctx2048"]["value_tok_s"]
    log = tmp_path / "log.jsonl"
    argv = ["--change", "fuse KDA q/k/v projections", "--figure", "decode_bs1_ctx2048", "--predicted", "300",
            "--results", str(res), "--log", str(log), "--baseline", "250"]
    assert ph.cli_log(argv) == 0
    rows = ph.read_log(log)
    assert len(rows) == 1 and set(rows[0]) == set(ph.LOG_FIELDS)
    assert math.isclose(rows[0]["measured_tok_s"], measured) and math.isclose(rows[0]["measured_over_predicted"], round(measured / 300, 3))
    assert ph.cli_log(["--change", "x", "--figure", "nope", "--predicted", "1", "--results", str(res), "--log", str(log)]) == 2
    assert "no figure 'nope'" in capsys.readouterr().err
    assert ph.cli_log(["--change", "x", "--figure", "f", "--predicted", "-1", "--log", str(log)]) == 2
    assert ph.main(["log", "--change", "graph sizes", "--figure", "decode_bs8", "--predicted", "900", "--log", str(log)]) == 0
    assert [r["measured_tok_s"] for r in ph.read_log(log)] == [measured, None]
    assert [(r["config"], r["measured_from"]) for r in ph.read_log(log)] == [("real", "window")] * 2
    rk = ph.parse_args(["--config", "rank", "--phase", "graphs"])              # a rank run, logged by its median
    g = _phase_result(rk, "graphs", 2.0)
    g["figures"]["decode_bs1_ctx2048"]["itl_median_ms"] = 4.0
    ph.write_json(g, [res])
    assert ph.cli_log(["--change", "r", "--figure", "decode_bs1_ctx2048", "--predicted", "240", "--results", str(res),
                       "--measured-from", "median", "--log", str(log)]) == 0
    last = ph.read_log(log)[-1]
    assert (last["config"], last["measured_from"], last["measured_tok_s"]) == ("rank", "median", 250.0)
    assert ph.cli_log(["--change", "r", "--figure", "prefill_ctx8192", "--predicted", "1", "--results", str(res),
                       "--measured-from", "median", "--log", str(log)]) == 2
    assert "no itl_median_ms" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--config 'huge'"): ph.log_entry("c", "f", 1.0, config="huge")
    assert ph.read_log(tmp_path / "absent.jsonl") == []

def test_committed_prediction_log_is_well_formed():
    rows = ph.read_log()
    assert rows, "benchmarks/results/perf_log.jsonl should hold the baseline predictions"
    for r in rows:
        assert set(r) == set(ph.LOG_FIELDS) and r["predicted_tok_s"] > 0 and r["figure"]

def test_plot_with_and_without_results(tmp_path):
    pytest.importorskip("matplotlib")
    none = {"eager": None, "graphs": None, "merged": None}
    d = pp.panel_data(none)
    assert not d["measured"] and [r["key"] for r in d["decode"]] == ["decode_bs1_ctx2048", "decode_bs1_ctx32768"]
    assert math.isclose(d["decode"][0]["roofline"], ph.decode_roofline(SolarOpen2Config.real(), 2, 2048 + 96)["per_seq_tok_s"])
    pp.plot(none, tmp_path / "empty.png")
    a = ph.parse_args(["--phase", "eager"])
    res = {"eager": _phase_result(a, "eager", 1.0), "graphs": _phase_result(a, "graphs", 2.5), "merged": None}
    d = pp.panel_data(res)
    assert d["measured"] and math.isclose(d["decode"][0]["graphs"], 2.5 * d["decode"][0]["eager"]) and set(d["profile"]) == {"eager", "graphs"}
    pp.plot(res, tmp_path / "full.png")
    for f in ("empty.png", "full.png"): assert (tmp_path / f).read_bytes()[:4] == b"\x89PNG"

# --------------------------------------------------------------------------------------------------------------
# a whole phase against a fake engine: log capture, KV comparison, figures, profile, JSON, shutdown
# --------------------------------------------------------------------------------------------------------------

class FakeLLM:
    "Stands in for vllm.LLM: logs what vLLM 0.25.1 logs at start-up (to fd 1), serves FakeEngine, writes traces."
    last = None
    def __init__(self, **kw):
        FakeLLM.last, self.kw, self.shut, self.profiling = self, kw, False, None
        pred = ph.kv_prediction(SimpleNamespace(tp=kw["tensor_parallel_size"], kv_bytes=kw["kv_cache_memory_bytes"],
                                                max_model_len=kw["max_model_len"], max_num_seqs=kw["max_num_seqs"], config="real"))
        os.write(1, _sample_log(tokens=f"{pred['gpu_kv_cache_tokens']:,}", conc=f"{pred['max_concurrency']:.2f}").encode())
        self.llm_engine = FakeEngine()
        self.llm_engine.engine_core = SimpleNamespace(shutdown=lambda timeout=None: setattr(self, "shut", True))
    def start_profile(self): self.profiling = True
    def stop_profile(self):
        import gzip
        d = Path(self.kw["profiler_config"]["torch_profiler_dir"]); d.mkdir(parents=True, exist_ok=True)
        for r in (0, 1):
            with gzip.open(d / f"dp0_pp0_tp{r}_dcp0_ep0_rank{r}.1.pt.trace.json.gz", "wt") as f: json.dump(_trace(5), f)

@pytest.fixture
def isolated_env(monkeypatch):
    env, path = dict(os.environ), list(sys.path)
    yield monkeypatch
    os.environ.clear(); os.environ.update(env); sys.path[:] = path

def _fake_phase(tmp_path, isolated_env, extra=(), name="perf_h200_graphs"):
    vllm = pytest.importorskip("vllm")
    isolated_env.setattr(vllm, "LLM", FakeLLM, raising=False)
    isolated_env.setattr(prun, "register_plugin", lambda: "fake.register")
    argv = ["--phase", "graphs", "--decode-contexts", "2048", "--prefill-contexts", "8192", "--batch-sizes", "8",
            "--decode-tokens", "16", "--batch-tokens", "8", "--prefill-repeats", "2", "--profile", "--profile-steps", "5",
            "--results-dir", str(tmp_path / "res"), "--out", str(tmp_path / "out"), *extra]
    rc = ph.main(argv)
    return rc, json.loads((tmp_path / "res" / f"{name}.json").read_text())

def test_a_whole_phase_against_a_fake_engine(tmp_path, isolated_env):
    rc, r = _fake_phase(tmp_path, isolated_env)
    assert rc == 0 and r["status"] == "complete" and r["errors"] == [] and r["skipped"] == [], r.get("traceback")
    assert sorted(r["figures"]) == ["decode_bs1_ctx2048", "decode_bs8", "prefill_ctx8192"]
    assert r["kv_pool"]["comparison"]["match"] is True and r["engine"]["log"]["nvfp4_moe_backend"] == "MARLIN"
    kw = FakeLLM.last.kw
    assert kw["load_format"] == "solar_open2_dummy" and kw["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 32, 64]
    assert (r["dummy_weights"]["name"], r["settings"]["dummy_weights"], r["settings"]["load_format"]) == \
        ("realistic-v1", "realistic-v1", "solar_open2_dummy") and "router" in r["dummy_weights"]["distribution"]
    from vllm.model_executor.model_loader import get_model_loader                      # registered in this process too
    from vllm.config.load import LoadConfig
    assert type(get_model_loader(LoadConfig(load_format="solar_open2_dummy"))).__name__ == "DummyWeightsLoader"
    cfg = SolarOpen2Config.from_pretrained(kw["model"])
    assert cfg.num_hidden_layers == 48 and cfg.quantization_config["quant_method"] == "compressed-tensors"
    assert FakeLLM.last.shut and FakeLLM.last.profiling
    p = r["profile"]
    assert p["steps"] == 5 and p["trace_file"].startswith("dp0_pp0_tp0_") and p["families"][0]["family"] == "dense_gemm"
    assert {x["family"] for x in p["vs_prediction"]} >= {"dense_gemm", "moe", "kda", "attention", "allreduce"}
    assert r["env"]["NCCL_NVLS_ENABLE"] == "0" and r["plugin"]["register"] == "fake.register"
    # the shim is written only when the package's own entry point is not installed (CI installs it)
    assert (r["plugin"]["shim"] or ph.installed_entry_point() is not None) and "solar_open2.vllm:register" in r["plugin"]["entry_point_seen"]
    assert (tmp_path / "out" / "perf_h200_graphs.json").exists()
    log = (tmp_path / "out" / "perf_h200_graphs.log").read_text()
    assert "GPU KV cache size" in log and "NvFp4 MoE backend" in log
    f = r["figures"]["decode_bs1_ctx2048"]
    assert f["value_tok_s"] > 0 and math.isclose(f["fraction_of_roofline"], f["value_tok_s"] / f["roofline_tok_s"])
    assert r["memory"]["source"].startswith("nvidia-smi") and r["wall_s"] > 0

def test_the_ceilings_are_the_gpu_it_ran_on(tmp_path, isolated_env):
    "On an H100 every decode ceiling and the step model use its 3.35 TB/s (nvidia-smi's name), not the H200's 4.8."
    isolated_env.setattr(prun, "gpu_info", lambda: {"name": "NVIDIA H100 80GB HBM3", "count": 1, "gpus": []})
    rc, r = _fake_phase(tmp_path, isolated_env)
    assert rc == 0 and (r["roofline"]["gpu"], r["roofline"]["bandwidth_Bps"]) == ("h100", 3.35e12)
    cfg = SolarOpen2Config.real()
    f = r["figures"]["decode_bs1_ctx2048"]
    assert math.isclose(f["roofline_tok_s"], budget.decode_ceiling(3.35e12, cfg, 2, 2048 + 16 / 2))
    assert math.isclose(r["roofline"]["batch"]["8"]["bandwidth_Bps"], 3.35e12)
    assert math.isclose(r["figures"]["prefill_ctx8192"]["decode_roofline_tok_s"], budget.decode_ceiling(3.35e12, cfg, 2, 8192))
    step = r["roofline"]["predicted_step_us"]["2048"]
    assert math.isclose(step["moe"], ph.predicted_step_us(cfg, 2, 2048, bandwidth=3.35e12)["moe"])

def test_only_and_variant_limit_the_measurements_and_name_the_files(tmp_path, isolated_env):
    rc, r = _fake_phase(tmp_path, isolated_env, ["--only", "decode,profile", "--variant", "fused"], "perf_h200_graphs_fused")
    assert rc == 0 and r["status"] == "complete" and sorted(r["figures"]) == ["decode_bs1_ctx2048"] and r["profile"]["steps"] == 5
    assert [t["what"] for t in r["timeline"][1:]] == ["warmup", "decode_bs1_ctx2048", "profile"]
    assert (r["settings"]["variant"], r["settings"]["only"]) == ("fused", ["decode", "profile"])
    assert (tmp_path / "out" / "perf_h200_graphs_fused.log").exists()

def test_only_warmup_starts_the_engine_and_measures_nothing(tmp_path, isolated_env):
    "The cache-warming run for a fresh machine: engine, warm-up, no figures."
    rc, r = _fake_phase(tmp_path, isolated_env, ["--only", "warmup", "--variant", "warm"], "perf_h200_graphs_warm")
    assert rc == 0 and r["status"] == "complete" and r["figures"] == {} and not r.get("profile")
    assert [t["what"] for t in r["timeline"][1:]] == ["warmup"]
    with pytest.raises(SystemExit): ph.parse_args(["--phase", "graphs", "--only", "warm"])

def test_only_skips_the_checks_of_what_it_does_not_measure():
    a = ph.parse_args(["--phase", "graphs", "--only", "decode,profile", "--max-model-len", "16k", "--decode-contexts", "2048"])
    assert a.prefill_contexts == [8192, 32768]                                # 32K > 16K, but prefill is not measured
    with pytest.raises(SystemExit): ph.parse_args(["--phase", "graphs", "--only", "prefill", "--max-model-len", "16k", "--decode-contexts", "2048"])
    with pytest.raises(SystemExit): ph.parse_args(["--phase", "graphs", "--only", "prefill", "--max-model-len", "16k", "--prefill-contexts", "8k"])   # warm-up: 32K decode

@pytest.mark.parametrize("argv, needle", [
    (["--phase", "ab", "--ab", "x=--fuse-kda-proj"], "at least two"),
    (["--phase", "ab", "--ab", "x=", "--ab", "x=--fuse-kda-proj"], "distinct"),
    (["--phase", "ab", "--ab", "a b=", "--ab", "c="], "NAME=FLAGS"),
    (["--phase", "ab", "--ab", "a=--phase eager", "--ab", "c="], "set by the A/B driver"),
    (["--variant", "a/b"], "--variant"),
    (["--only", "decode,nap"], "subset"),
])
def test_ab_and_only_refuse_bad_input(argv, needle, capsys):
    with pytest.raises(SystemExit) as e: ph.parse_args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err

def test_ab_runs_each_variant_as_a_child_and_summarises_ratios(tmp_path, monkeypatch):
    calls = []
    def fake_run(cmd, log, timeout_s, **kw):
        calls.append(cmd)
        v = cmd[cmd.index("--variant") + 1]
        assert log == tmp_path / f"ab_{v}.log" and abs(timeout_s - float(cmd[cmd.index("--deadline-s") + 1]) - prun.AB_GRACE_S) <= 0.5
        rate = {"separate": 100.0, "fused": 125.0, "splits": 110.0}[v]
        r = {"status": "complete", "command": " ".join(cmd), "settings": {"variant": v}, "engine": {"init_s": 90.0},
             "figures": {"decode_bs1_ctx2048": {"value_tok_s": rate, "fraction_of_roofline": rate / 479, "itl_median_ms": 1e3 / rate}},
             "sanity": {"decode_bs1_ctx2048": {"passed": True, "degenerate": False}},            # as the writer records it
             "profile": {"steps": 8, "step_us": 1e6 / rate, "gpu_busy_fraction": 0.85,
                         "families": [{"family": "dense_gemm", "us_per_step": 4000.0, "kernels": 8 * 800}]}}
        ph.write_json(r, [tmp_path / f"perf_h200_graphs_{v}.json"])
        log.write_text(f"variant {v} done\n")
        return 0
    monkeypatch.setattr(prun, "run_logged", fake_run)
    argv = ["--phase", "ab", "--ab", "separate=--no-fuse-kda-proj", "--ab", "fused=--fuse-kda-proj", "--only", "decode",
            "--results-dir", str(tmp_path), "--out", str(tmp_path), "--deadline-s", "600"]
    assert ph.main(argv) == 0
    assert [c[c.index("--variant") + 1] for c in calls] == ["separate", "fused"]
    assert "--no-fuse-kda-proj" in calls[0] and "--fuse-kda-proj" in calls[1] and "--ab" not in calls[0]
    assert all(c[c.index("--phase") + 1] == "graphs" and "--only" in c for c in calls)
    assert 325 <= float(calls[0][calls[0].index("--deadline-s") + 1]) <= 331     # the first keeps all but a warm start's reserve
    s = json.loads((tmp_path / "perf_h200_ab.json").read_text())
    assert s["baseline"] == "separate" and s["variants"]["fused"]["figures"]["decode_bs1_ctx2048"]["over_baseline"] == 1.25
    assert s["variants"]["separate"]["profile"]["kernels_per_step"] == 800
    calls.clear()                           # one rank: a warm start is about 80 s, so the cold first variant gets more
    ph.main(["--config", "rank", "--phase", "ab", "--ab", "separate=", "--ab", "fused=", "--ab", "splits=--attn-max-splits 8",
             "--only", "decode", "--results-dir", str(tmp_path), "--out", str(tmp_path), "--deadline-s", "500"])
    assert [c[c.index("--variant") + 1] for c in calls] == ["separate", "fused", "splits"]
    assert 295 <= float(calls[0][calls[0].index("--deadline-s") + 1]) <= 301
    assert calls[2][calls[2].index("--attn-max-splits") + 1] == "8" and calls[0][calls[0].index("--config") + 1] == "rank"

def test_ab_summary_carries_the_speculative_figures_and_the_step_ratio(tmp_path):
    """A speculative variant's figure keeps acceptance, mean accepted length and tokens per step, and its median step
    over the baseline's (the verify step's cost); the A/B plot draws them."""
    def run(rate, itl, **spec):
        return {"status": "complete", "figures": {"decode_bs1_ctx2048": {"value_tok_s": rate, "fraction_of_roofline": rate / 400,
                "itl_median_ms": itl, "tokens_per_step": spec.pop("tps", 1.0), **spec}},
                "sanity": {"decode_bs1_ctx2048": {"passed": True, "degenerate": False}}}
    s = ph.ab_summary({"base": run(200.0, 5.0), "draft3": run(160.0, 6.25, acceptance=0.0, mean_accepted_length=1.0),
                       "ngram3": run(420.0, 5.5, tps=2.6, acceptance=0.53, mean_accepted_length=2.6),
                       "old": {**run(100.0, 10.0), "figures": {"decode_bs1_ctx2048": {"value_tok_s": 100.0, "fraction_of_roofline": 0.25}}}})
    f = {n: v["figures"]["decode_bs1_ctx2048"] for n, v in s["variants"].items()}
    assert math.isclose(f["draft3"]["step_over_baseline"], 1.25) and f["draft3"]["acceptance"] == 0.0
    assert (f["ngram3"]["mean_accepted_length"], f["ngram3"]["tokens_per_step"]) == (2.6, 2.6) and math.isclose(f["ngram3"]["over_baseline"], 2.1)
    assert f["base"]["step_over_baseline"] == 1.0 and "step_over_baseline" not in f["old"]
    fig = pp.plot_ab(s, tmp_path / "ab.png")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("step x1.25" in t for t in texts) and any("acc 53%, L 2.60" in t for t in texts)

def test_spec_roofline_is_the_budget_chapters_verify_floor(tmp_path):
    """A speculative figure's ceiling: one verify of 1 + k tokens moves `budget.verify_bytes`; its ratio to one token's
    bytes is the floor of the A/B's step ratio (1.51x at k = 3, TP2 rank, 2K); MAL x bandwidth / bytes is the tok/s
    ceiling; k = 0 is a plain decode step; the A/B summary carries the floor beside the measured step ratio."""
    cfg = SolarOpen2Config.real()
    r = ph.spec_roofline(cfg, 2, 2048, 3, 2.5, 3.35e12)
    assert r["tokens"] == 4 and 1.50 < r["floor_ratio"] < 1.51, r
    assert math.isclose(r["per_seq_tok_s"], 2.5 * 3.35e12 / budget.verify_bytes(cfg, 2, 2048, 4))
    assert math.isclose(r["step_us"], budget.verify_bytes(cfg, 2, 2048, 4) / 3.35e12 * 1e6)
    assert ph.spec_roofline(cfg, 2, 2048, 0, 1.0)["floor_ratio"] == 1.0
    assert ph.spec_roofline(cfg, 2, 2048, 3)["per_seq_tok_s"] is None          # no counters (a draft head): no ceiling
    fig = {"value_tok_s": 72.0, "fraction_of_roofline": 0.2, "itl_median_ms": 13.95, "tokens_per_step": 1.0,
           "acceptance": 0.0, "mean_accepted_length": 1.0, "spec_roofline": r}
    base = {"value_tok_s": 159.0, "fraction_of_roofline": 0.48, "itl_median_ms": 6.27, "tokens_per_step": 1.0}
    ok = {"decode_bs1_ctx2048": {"passed": True, "degenerate": False}}
    s = ph.ab_summary({"base": {"status": "complete", "figures": {"decode_bs1_ctx2048": base}, "sanity": ok},
                       "ngram3": {"status": "complete", "figures": {"decode_bs1_ctx2048": fig}, "sanity": ok}})
    f = s["variants"]["ngram3"]["figures"]["decode_bs1_ctx2048"]
    assert f["verify_floor"] == r["floor_ratio"] and math.isclose(f["step_over_baseline"], 13.95 / 6.27)
    assert s["variants"]["base"]["figures"]["decode_bs1_ctx2048"]["verify_floor"] is None
    texts = [t.get_text() for t in pp.plot_ab(s, tmp_path / "ab.png").axes[0].texts]
    assert any("step x2.22 (floor x1.51)" in t for t in texts) and not any("floor" in t for t in texts if "x1.000" in t), texts

def test_ab_kills_a_hung_variant_and_runs_the_next(tmp_path, monkeypatch, capsys):
    """A variant whose engine hangs (an EAGLE-3 engine with full graphs did, 2026-12-07) is killed with stack dumps past
    its share of the deadline plus AB_GRACE_S; the next variant still runs, and the A/B's status says it failed."""
    from benchmarks import common
    ran = []
    def child(cmd, log, timeout_s, **kw):                       # the real run_logged over a stand-in engine
        v = cmd[cmd.index("--variant") + 1]; ran.append(v)
        body = "import time; time.sleep(60)" if v == "hung" else "print('ok')"
        return common.run_logged([sys.executable, "-c", body], log, timeout_s, grace_s=1.0)
    monkeypatch.setattr(prun, "run_logged", child)
    monkeypatch.setattr(prun, "AB_GRACE_S", 1.0)
    t = time.perf_counter()
    rc = ph.main(["--config", "tiny", "--phase", "ab", "--ab", "hung=", "--ab", "next=", "--only", "decode",
                  "--results-dir", str(tmp_path), "--out", str(tmp_path), "--deadline-s", "2"])
    assert ran == ["hung", "next"] and rc != 0 and time.perf_counter() - t < 30
    assert "SIGKILL" in (tmp_path / "ab_hung.log").read_text() and (tmp_path / "ab_next.log").read_text() == "ok\n"
    assert "hung still running" in capsys.readouterr().out

def test_the_graphs_warmup_decodes_as_far_as_the_measurement(tmp_path, isolated_env):
    "The graphs warm-up stream crosses every KV block the measured stream will (a first crossing stalled one window)."
    for phase, want in (("graphs", 20), ("eager", 16)):
        rc, _ = _fake_phase(tmp_path / phase, isolated_env, ["--phase", phase, "--decode-tokens", "20", "--only", "decode"],
                            f"perf_h200_{phase}")
        asked = FakeLLM.last.llm_engine.asked
        warm = [v for k, v in asked.items() if "warm-1" in k]
        meas = [v for k, v in asked.items() if "dec2048" in k]
        assert rc == 0 and warm == [(2048, want)] and meas == [(2048, 20)], asked

def test_a_phase_past_its_deadline_skips_and_says_so(tmp_path, isolated_env):
    rc, r = _fake_phase(tmp_path, isolated_env, ["--deadline-s", "1"])
    assert rc == 0 and r["status"] == "partial" and r["figures"] == {}
    assert [s["what"] for s in r["skipped"]] == ["warmup", "decode_bs1_ctx2048", "prefill_ctx8192", "decode_bs8", "profile"]
    assert r["kv_pool"]["comparison"]["match"] is True                # the engine facts are there all the same

def test_measurement_needs_are_sized_per_phase(tmp_path, isolated_env):
    "Each measurement's time need is eager-sized (a 6 tok/s engine); with CUDA graphs it is 0.3x, so a 40 s deadline holds all."
    rc, g = _fake_phase(tmp_path, isolated_env, ["--deadline-s", "40"])
    assert rc == 0 and g["status"] == "complete" and g["skipped"] == []
    rc, e = _fake_phase(tmp_path, isolated_env, ["--deadline-s", "40", "--phase", "eager"], "perf_h200_eager")
    assert rc == 0 and [x["what"] for x in e["skipped"]][:1] == ["warmup"]

def test_a_failing_engine_is_reported(tmp_path, isolated_env):
    vllm = pytest.importorskip("vllm")
    def boom(**kw): raise RuntimeError("no NvFp4 MoE backend")
    isolated_env.setattr(vllm, "LLM", boom, raising=False)
    isolated_env.setattr(prun, "register_plugin", lambda: "fake.register")
    rc = ph.main(["--phase", "eager", "--results-dir", str(tmp_path)])
    r = json.loads((tmp_path / "perf_h200_eager.json").read_text())
    assert rc == 1 and r["status"] == "failed" and "no NvFp4 MoE backend" in r["error"] and "RuntimeError" in r["traceback"]

def test_a_figure_is_written_only_with_its_sanity_gate(tmp_path):
    "The writer raises for a figure without its check; a failed or unchecked figure lands in gated_out, not in figures."
    a = ph.parse_args(["--phase", "graphs", "--results-dir", str(tmp_path)])
    res = _phase_result(a, "graphs", 1.0)
    del res["sanity"]["decode_bs8"]
    with pytest.raises(ValueError, match="decode_bs8.*no sanity check"): ph.write_result(res, [tmp_path / "r.json"])
    assert not (tmp_path / "r.json").exists()
    res["sanity"]["decode_bs8"] = ph.output_sanity([{"tokens": [5] * 32}] * 8)             # every request one id
    res["sanity"]["prefill_ctx8192"] = ph.first_token_sanity([{"tokens": [5]}])           # one prompt: unchecked
    ph.write_result(res, [tmp_path / "r.json"])
    r = json.loads((tmp_path / "r.json").read_text())
    assert "decode_bs8" not in r["figures"] and "prefill_ctx8192" not in r["figures"] and "decode_bs1_ctx2048" in r["figures"]
    assert (r["gated_out"]["decode_bs8"]["why"], r["gated_out"]["prefill_ctx8192"]["why"]) == ("the check failed", "unchecked")
    assert r["gated_out"]["decode_bs8"]["figure"] == res["figures"]["decode_bs8"]           # kept as the record
    assert r["gate"]["gated_out"] == ["decode_bs8", "prefill_ctx8192"] and r["schema"] == 2
    assert ph.gated(r) == ph.gated(ph.gated(r))                                              # idempotent
    old = _phase_result(a, "graphs", 1.0); del old["sanity"]                                 # a file from before the gate
    assert ph.gated(old, strict=False)["figures"] == {} and ph.merge(None, ph.gated(old, strict=False))["rows"] == []

def test_degenerate_outputs_are_gated_out_of_a_whole_phase(tmp_path, isolated_env):
    "NaN-like logits (every token one id): the phase runs, its JSON says why, and no figure is reported."
    isolated_env.setattr(FakeEngine, "degenerate", True)
    rc, r = _fake_phase(tmp_path, isolated_env, ["--only", "decode,batch,prefill"])
    assert rc == 0 and r["figures"] == {} and sorted(r["gated_out"]) == ["decode_bs1_ctx2048", "decode_bs8", "prefill_ctx8192"]
    assert all(g["why"] == "the check failed" for g in r["gated_out"].values())
    assert "GATED OUT" in ph.summary_text({**r, "figures": {k: g["figure"] for k, g in r["gated_out"].items()}})

def test_markdown_table():
    rows = [{"a": 1234.5, "b": None, "c": True}, {"a": 2.0, "b": "x", "c": False}]
    t = pp.markdown_table(rows, [("A", "a", ",.1f"), ("B", "b", ""), ("C", "c", ""), ("2A", lambda r: 2 * r["a"], ".0f")])
    assert t == "| A | B | C | 2A |\n|---|---|---|---|\n| 1,234.5 | — | yes | 2469 |\n| 2.0 | x | no | 4 |\n"

def test_vllm_loads_the_shimmed_plugin_in_a_fresh_process(tmp_path):
    "What every engine-core / worker / registry process does: `load_general_plugins()` finds the shim's entry point."
    pytest.importorskip("vllm")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "probe_plugin.py").write_text(
        "import os\ndef register():\n    open(os.environ['PROBE_MARKER'], 'a').write('registered\\n')\n")
    # a name of its own: with the package installed, its `solar_open2` entry point would shadow a probe of that name
    # (vLLM keeps one plugin per name, the last one discovered)
    root = ph.write_plugin_shim(tmp_path / "shim", entry_point="solar_open2_probe = probe_plugin:register")
    env = dict(os.environ, PROBE_MARKER=str(tmp_path / "marker"))
    env.pop("VLLM_PLUGINS", None)
    ph.prepend_path(env, tmp_path / "pkg", root)
    code = "from vllm.plugins import load_general_plugins as f; f(); f()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "marker").read_text() == "registered\n"          # once per process


def test_ab_plot_and_rows(tmp_path):
    pytest.importorskip("matplotlib")
    fig = lambda r: {"decode_bs1_ctx2048": {"value_tok_s": r, "fraction_of_roofline": r / 479, "itl_median_ms": 1e3 / r,
                                            "over_baseline": r / 100}}
    ab = {"baseline": "a", "variants": {"a": {"figures": fig(100.0), "profile": {"families_us_per_step": {"dense_gemm": 4000.0, "moe": 2000.0}}},
                                        "b": {"figures": fig(110.0), "profile": None}}}
    rows = pp.ab_rows(ab)
    assert [(r["variant"], round(r["roofline"]), r["over_baseline"]) for r in rows] == [("a", 479, 1.0), ("b", 479, 1.1)]
    pp.plot_ab(ab, tmp_path / "ab.png")
    assert (tmp_path / "ab.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no figures"): pp.plot_ab({"baseline": "a", "variants": {"a": {"figures": {}}}})
    (tmp_path / "perf_h200_ab.json").write_text(json.dumps(ab))
    assert pp.main(["--ab", "--results-dir", str(tmp_path)]) == 0 and (tmp_path / "perf_h200_ab.png").exists()
    assert pp.main(["--ab", "--results-dir", str(tmp_path / "nowhere")]) == 2

def test_progress_rows_and_plot(tmp_path):
    "--progress: the measured outcomes of one figure and phase, in log order; planned rows and other figures left out."
    log = [{"figure": "decode_bs1_ctx2048", "phase": "graphs", "change": "baseline, CUDA graphs", "date": "d", "predicted_tok_s": 250.0,
            "measured_tok_s": 107.6, "results": "a.json"},
           {"figure": "decode_bs1_ctx2048", "phase": "graphs", "change": "planned: x", "date": "d", "predicted_tok_s": 120.0,
            "measured_tok_s": None},
           {"figure": "decode_bs64", "phase": "graphs", "change": "outcome: y", "date": "d", "predicted_tok_s": 1.0, "measured_tok_s": 2.0},
           {"figure": "decode_bs1_ctx2048", "phase": "eager", "change": "outcome: z", "date": "d", "predicted_tok_s": 1.0, "measured_tok_s": 2.0},
           {"figure": "decode_bs1_ctx2048", "phase": "graphs", "change": "outcome: fused KDA projections (qkvb_proj); A/B", "date": "d",
            "predicted_tok_s": 120.0, "measured_tok_s": 143.1, "results": "b.json"}]
    rows = pp.progress_rows(log)
    assert [(r["label"], r["predicted"], r["measured"]) for r in rows] == [("baseline, CUDA graphs", 250.0, 107.6),
                                                                           ("fused KDA projections", 120.0, 143.1)]
    pp.plot_progress(log, 478.6, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="no measured decode_bs1_ctx2048"): pp.plot_progress(log[1:2], 478.6, tmp_path / "q.png")
    log.append({"figure": "decode_bs1_ctx2048", "phase": "graphs", "config": "rank", "change": "outcome (rank): r6 (all on)", "date": "d",
                "predicted_tok_s": 207.7, "measured_tok_s": 211.6})
    assert [r["label"] for r in pp.progress_rows(log)] == ["baseline, CUDA graphs", "fused KDA projections"]   # rows without a config: real
    assert [r["label"] for r in pp.progress_rows(log, config="rank")] == ["r6"]
    pp.plot_progress(log, 478.6, tmp_path / "r.png", config="rank")
    assert (tmp_path / "r.png").stat().st_size > 10_000

def test_stop_smi_stops_the_sampler_once(tmp_path):
    "The measurements run without the nvidia-smi sampler (it cost one decode window a 317 ms gap): stop_smi ends it."
    import subprocess
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert ph.stop_smi(p) is True and p.poll() is not None
    assert ph.stop_smi(p) is False and ph.stop_smi(None) is False               # already stopped; none started
    with ph.smi_monitor(tmp_path / "smi.csv", 0) as q: assert q is None          # interval 0: no sampler at all
    a = ph.parse_args(["--phase", "graphs"])
    assert (a.smi_during_measure, a.smi_ab, a.smi_interval_ms) == (False, False, 500)
    assert ph.settings(ph.parse_args(["--phase", "graphs", "--smi-ab"]), "graphs")["smi_ab"] is True

def test_the_sampler_stops_before_the_measurements(tmp_path, isolated_env):
    "A stand-in nvidia-smi that keeps running in loop mode: stopped after the warm-up by default, after decode with --smi-ab."
    isolated_env.setattr(prun.shutil, "which", lambda name: "/usr/bin/" + name)
    isolated_env.setattr(prun, "SMI_QUERY", [sys.executable, "-c", "import sys, time; print('0, 1000, 143771', flush=True); "
                                           "time.sleep(600 if '-lms' in sys.argv else 0)"])
    rc, r = _fake_phase(tmp_path, isolated_env, ["--only", "decode"])
    assert rc == 0 and r["smi_stopped_after_warmup"] is True, r.get("traceback")
    assert r["memory"]["samples"] == {"0": 2} and "warm-up, plus one sample at the end" in r["memory"]["source"]
    assert r["figure_details"]["decode_bs1_ctx2048"]["smi_running"] is False           # measured without the sampler
    rc, r = _fake_phase(tmp_path, isolated_env, ["--only", "decode", "--smi-ab", "--variant", "ab"], "perf_h200_graphs_ab")
    assert rc == 0 and "smi_stopped_after_warmup" not in r and "whole phase" in r["memory"]["source"]
    assert r["figure_details"]["decode_bs1_ctx2048"]["smi_running"] is True            # the A/B's first half: with it
    d = r["figure_details"]["decode_bs1_ctx2048_nosmi"]
    assert d["smi_stopped"] is True and d["decode_tok_s"] > 0
    assert [t["what"] for t in r["timeline"][1:]] == ["warmup", "decode_bs1_ctx2048", "decode_bs1_ctx2048_nosmi"]

def test_source_digest_names_the_code_not_the_commit(tmp_path):
    "The digest changes with any byte of the package, the benchmarks or the scripts, and with nothing else."
    for f in ("solar_open2/a.py", "solar_open2/vllm/b.py", "benchmarks/c.py", "scripts/d.py", "nbs/e.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True); (tmp_path / f).write_text("x = 1\n")
    d0 = kb.source_digest(tmp_path)
    assert len(d0) == 16 and kb.source_digest(tmp_path) == d0
    (tmp_path / "nbs" / "e.py").write_text("x = 2\n")                          # not code that runs
    assert kb.source_digest(tmp_path) == d0
    (tmp_path / "solar_open2" / "vllm" / "b.py").write_text("x = 2\n")
    assert kb.source_digest(tmp_path) != d0
    assert kb.git_dirty(tmp_path) is None                                      # not a git checkout
    head = kb.result_head("x", "cpu", tmp_path)
    assert head["source_sha256"] == kb.source_digest(tmp_path) and head["git_commit"] is None


# --------------------------------------------------------------------------------------------------------------
# which dummy weights a run serves, and the gate in every summary
# --------------------------------------------------------------------------------------------------------------

def test_the_dummy_weights_are_selected_recorded_and_registered_in_every_process(tmp_path):
    "realistic-v1 by default (the load format's entry point in the shim, so the engine core and workers have it); vllm: plain."
    a, plain = ph.parse_args(["--phase", "graphs"]), ph.parse_args(["--phase", "graphs", "--dummy-weights", "vllm"])
    assert (a.dummy_weights, ph.dummy_weights(a)["load_format"], ph.dummy_weights(plain)["load_format"]) == \
        ("realistic-v1", "solar_open2_dummy", "dummy")
    assert prun.DUMMY_ENTRY_POINT in ph.shim_entry_points(a) and prun.DUMMY_ENTRY_POINT not in ph.shim_entry_points(plain)
    root = ph.write_plugin_shim(tmp_path, ph.shim_entry_points(a))
    text = (root / ph.SHIM_DIST / "entry_points.txt").read_text()
    assert "solar_open2_dummy = solar_open2.vllm.dummy:register_loader" in text
    assert ph.new_result(a, "graphs", [])["dummy_weights"]["name"] == "realistic-v1"
    assert "vLLM's DummyModelLoader" in ph.new_result(plain, "graphs", [])["dummy_weights"]["distribution"]
    line = ("(EngineCore pid=7) INFO 12-04 03:00:00 [dummy.py:1] solar_open2: dummy weights realistic-v1: 1200 tensors, "
            "30720 NVFP4 matrices, block scales [52, 448], global divisors [25663.5, 27513.1], routing max/mean load 1.310")
    assert ph.parse_engine_log(line)["dummy_weights"].startswith("realistic-v1: 1200 tensors")


def test_merge_and_ab_report_only_figures_that_passed_their_gate():
    "A file written before the gate (figures ungated) cannot bring a failed or unchecked figure into a summary."
    fig = lambda v: {"kind": "batch", "context": 512, "batch": 32, "value_tok_s": v, "roofline_tok_s": 3000.0,
                     "roofline_kind": "decode-bandwidth", "fraction_of_roofline": v / 3000}
    old = {"status": "complete", "figures": {"decode_bs8": fig(800.0), "decode_bs32": fig(2600.0), "decode_bs64": fig(3900.0)},
           "sanity": {"decode_bs8": {"passed": True}, "decode_bs32": {"passed": False, "degenerate": True}}}   # bs64: none
    m = ph.merge(None, old)
    assert [r["figure"] for r in m["rows"]] == ["decode_bs8"] and m["gated_out"]["graphs"] == ["decode_bs32", "decode_bs64"]
    ab = ph.ab_summary({"base": old, "other": {**old, "sanity": {k: {"passed": True} for k in old["figures"]}}})
    assert list(ab["variants"]["base"]["figures"]) == ["decode_bs8"] and ab["variants"]["base"]["gated_out"] == ["decode_bs32", "decode_bs64"]
    assert ab["variants"]["other"]["figures"]["decode_bs32"]["over_baseline"] is None     # no baseline that passed: no ratio


def test_the_history_view_shows_every_figure_with_its_verdict_and_is_never_current():
    """`merge(gate=False)` (chapter 09a's view of runs made before the gate) keeps every measured figure, gated out or
    not, and labels each row with its verdict; the default merge of the same files keeps only what passed."""
    fig = lambda v: {"kind": "decode", "context": 2048, "batch": 1, "value_tok_s": v, "roofline_tok_s": 480.0,
                     "roofline_kind": "decode-bandwidth", "fraction_of_roofline": v / 480}
    e = {"status": "complete", "figures": {"decode_bs1_ctx2048": fig(6.0)}, "sanity": {"decode_bs1_ctx2048": {"degenerate": True}}}
    g = ph.gated({"status": "complete", "figures": {"decode_bs1_ctx2048": fig(107.0), "decode_bs8": {**fig(800.0), "kind": "batch", "batch": 8}},
                  "sanity": {"decode_bs1_ctx2048": {"degenerate": True}, "decode_bs8": {"passed": True}}})
    assert "decode_bs1_ctx2048" in g["gated_out"]                                   # the writer's view moved it out
    hist = ph.merge(e, g, gate=False)
    assert hist["phase"] == "merged_as_measured"
    assert {r["figure"]: r["gate"] for r in hist["rows"]} == {"decode_bs1_ctx2048": "failed", "decode_bs8": "passed"}
    assert abs(hist["acceptance"]["graphs_over_eager_decode_bs1"] - 107 / 6) < 1e-9
    cur = ph.merge(e, g)
    assert [r["figure"] for r in cur["rows"]] == ["decode_bs8"] and cur["acceptance"]["graphs_over_eager_decode_bs1"] is None


def test_a_draft_head_run_serves_a_random_eagle3_head_that_times_the_verify_step(tmp_path):
    """`--draft-head K` gives vLLM an EAGLE-3 speculative config over a random head of the published draft's shape (its
    five taps at the served model's depths, a reduced draft vocabulary), written once beside the model's config; the
    KV prediction counts the 1 + K state slots and says what it leaves out; bad values are refused naming the flag."""
    import json
    from safetensors import safe_open
    a = ph.parse_args(["--config", "tiny", "--phase", "graphs", "--draft-head", "3", "--draft-vocab", "256"])
    kw = ph.engine_kwargs(a, tmp_path, "graphs")
    sc = kw["speculative_config"]
    assert sc["method"] == "eagle3" and sc["num_speculative_tokens"] == 3 and Path(sc["model"]).parent == tmp_path
    cfg = json.loads((Path(sc["model"]) / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 256 and cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4, 6, 7]
    with safe_open(str(Path(sc["model"]) / "model.safetensors"), "pt") as f:
        assert f.get_tensor("d2t").tolist() == [0] * 256 and f.get_slice("lm_head.weight").get_shape() == [256, 256]
    assert ph.engine_kwargs(a, tmp_path, "graphs")["speculative_config"] == sc                   # written once, reused
    assert any("draft head" in w for w in ph.kv_prediction(a)["warnings"])
    assert "speculative_config" not in ph.engine_kwargs(ph.parse_args(["--config", "tiny", "--phase", "graphs"]), tmp_path, "graphs")
    assert ph.settings(a, "graphs")["draft_head"] == 3
    from benchmarks.engine.spec import scaled_taps
    assert scaled_taps(ph.model_config("rank").num_hidden_layers) == [3, 15, 27, 39, 47]        # the rank config: the published taps
    for bad in (["--draft-head", "0"], ["--draft-head", "3", "--draft-vocab", "999999"]):
        with pytest.raises(SystemExit): ph.parse_args(["--config", "tiny", *bad])


def test_an_ngram_run_serves_vllms_prompt_lookup_and_reports_what_each_verify_step_yielded(tmp_path):
    """`--ngram K` (issue 27's end-to-end figure): vLLM's ngram proposer with up to K tokens a step, stats on so the
    speculative counters can be read, the KV prediction counting 1 + K state slots; `--prompt-period P` repeats one
    random block; a speculative step's tokens arrive together and count as one step (`tokens_per_step`); bad values
    and two methods at once are refused naming the flag."""
    a = ph.parse_args(["--config", "tiny", "--phase", "graphs", "--ngram", "3", "--prompt-period", "64"])
    kw = ph.engine_kwargs(a, tmp_path, "graphs")
    assert kw["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                        "prompt_lookup_min": 2} and kw["disable_log_stats"] is False
    plain = ph.parse_args(["--config", "tiny", "--phase", "graphs"])
    assert "speculative_config" not in ph.engine_kwargs(plain, tmp_path, "graphs")
    assert ph.engine_kwargs(plain, tmp_path, "graphs")["disable_log_stats"] is True
    stats = ph.parse_args(["--config", "tiny", "--phase", "graphs", "--log-stats"])             # an A/B's baseline: the same host cost
    assert ph.engine_kwargs(stats, tmp_path, "graphs")["disable_log_stats"] is False and ph.settings(stats, "graphs")["log_stats"]
    pred = lambda argv: budget.plan(tp=1, kv_cache_memory_bytes=a.kv_bytes, max_model_len=a.max_model_len, kv_cache_dtype="auto",
                                    block_size=16, prefix_caching=False, max_num_seqs=64, cfg=ph.model_config("tiny"),
                                    num_speculative_tokens=argv).max_concurrency
    assert ph.kv_prediction(a)["max_concurrency"] == pred(3) != pred(0)
    s = ph.settings(a, "graphs"); assert (s["ngram"], s["ngram_gpu"], s["prompt_period"]) == (3, False, 64)
    g = ph.parse_args(["--config", "tiny", "--phase", "graphs", "--ngram", "3", "--ngram-gpu"])    # the GPU proposer
    assert ph.engine_kwargs(g, tmp_path, "graphs")["speculative_config"]["method"] == "ngram_gpu" and ph.settings(g, "graphs")["ngram_gpu"]
    with pytest.raises(SystemExit): ph.parse_args(["--config", "tiny", "--ngram-gpu"])             # needs --ngram K
    p = ph.token_prompt(200, 1024, 5, period=64)
    assert len(p) == 200 and p[64:128] == p[:64] and p[128:] == p[:72] and len(set(p[:64])) > 40
    assert ph.token_prompt(200, 1024, 5) != p and ph.token_prompt(10, 1024, 5, period=64) == ph.token_prompt(10, 1024, 5)
    assert ph.periodicity([5, 6, 7] + [1, 2, 3] * 10) == 3 and ph.periodicity(list(range(40))) is None
    r = _rec(2048, 0.0, 1.0, 0.01, 21)
    r["times"] = [1.0] + [1.0 + 0.01 * (1 + i // 2) for i in range(20)]      # after the first token, two tokens a step
    st = ph.single_stream_stats(r)
    assert st["steps"] == 10 and math.isclose(st["tokens_per_step"], 2) and math.isclose(st["itl_median_ms"], 10, rel_tol=1e-6)
    assert math.isclose(st["decode_tok_s"], 200, rel_tol=1e-6) and math.isclose(st["median_tok_s"], 200, rel_tol=1e-6)
    assert prun.spec_counters(plain, None) is None
    for bad in (["--ngram", "0"], ["--ngram", "17"], ["--ngram", "3", "--draft-head", "3"], ["--prompt-period", "-1"]):
        with pytest.raises(SystemExit): ph.parse_args(["--config", "tiny", *bad])


def test_prefill_flops_by_family_split_the_weights_and_the_mixers():
    """figures.prefill_flops_by_family: the routed experts (top-8 of 320, three matrices each) and the other weights
    make 2 x the active weights less the LM head; attention grows with the context (12 GQA layers), KDA does not."""
    cfg = SolarOpen2Config.real()
    for tp, ctx in ((1, 8192), (2, 8192), (2, 32768)):
        f = ph.prefill_flops_by_family(cfg, tp, ctx)
        assert math.isclose((f["moe"] + f["dense_gemm"]) * tp, 2 * (cfg.active_params() - cfg.vocab_size * cfg.hidden_size))
        assert math.isclose(f["attention"] * tp, 12 * 4 * 64 * 128 * ctx / 2) and f["dense_gemm"] > 0 and f["kda"] > 0
        assert f["moe"] * tp == 2 * cfg.num_experts_per_tok * 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.num_hidden_layers
    assert ph.prefill_flops_by_family(cfg, 2, 32768)["attention"] == 4 * ph.prefill_flops_by_family(cfg, 2, 8192)["attention"]
    assert ph.prefill_flops_by_family(cfg, 2, 32768)["kda"] == ph.prefill_flops_by_family(cfg, 2, 8192)["kda"]


def test_a_prefill_profile_gives_each_family_its_fraction_of_the_compute_ceiling():
    "run.prefill_profile_summary: per family, the FLOPs of the prompt at the peak against the kernels' time; chunks and completeness."
    cfg = SolarOpen2Config.real()
    s = ph.summarize_trace(_trace(4))
    out = prun.prefill_profile_summary(s, cfg, 2, 8192, 2048, peak=1e15)
    fam = {r["family"]: r for r in out["families"]}
    moe = ph.prefill_flops_by_family(cfg, 2, 8192)["moe"] * 8192
    assert math.isclose(fam["moe"]["ceiling_us"], round(1e6 * moe / 1e15, 1)) and math.isclose(fam["moe"]["flops"], moe)
    assert math.isclose(fam["moe"]["fraction_of_ceiling"], round(fam["moe"]["ceiling_us"] / fam["moe"]["us"], 4), rel_tol=1e-3)
    assert fam["allreduce"]["fraction_of_ceiling"] is None and fam["allreduce"]["flops"] == 0.0     # no FLOPs to ask of it
    assert out["chunks_expected"] == 4 and out["complete"] is True
    assert prun.prefill_profile_summary(s, cfg, 2, 32768, 2048)["complete"] is False              # 16 chunks, 4 steps traced


def test_a_phase_profiles_a_prefill_against_a_fake_engine(tmp_path, isolated_env):
    "--profile-prefill: one profiled prefill per prefill context, after a request of exactly the profiler's delay in steps."
    rc, r = _fake_phase(tmp_path, isolated_env, ["--only", "profile", "--profile-prefill", "--variant", "pp"], "perf_h200_graphs_pp")
    assert rc == 0 and r["status"] == "complete" and r["errors"] == [], r.get("errors")
    p = r["prefill_profiles"]["8192"]
    assert p["context"] == 8192 and p["trace_file"].startswith("dp0_pp0_tp0_") and p["fraction_of_ceiling"] > 0
    assert {f["family"] for f in p["families"]} >= {"dense_gemm", "moe", "kda"}
    asked = FakeLLM.last.llm_engine.asked
    assert asked[next(k for k in asked if k.startswith("pfw"))] == (8, prun.PROFILE_DELAY_STEPS)
    assert asked[next(k for k in asked if k.startswith("pfp8192"))] == (8192, 1)
    assert [t["what"] for t in r["timeline"][1:]] == ["warmup", "profile", "profile_prefill_ctx8192"]
