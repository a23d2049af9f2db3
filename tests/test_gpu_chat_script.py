"""`benchmarks.engine.chat_server` (the chat parsers through vLLM's OpenAI server on the GPU) without a GPU.

The request builders against the tiny tokenizer and vLLM 0.25.1's request model; the answer checks against canned
responses in vLLM's own serialisation (`reasoning`, not `reasoning_content`, in 0.25.1) and against broken ones; the
scripted-tokens logits processor through vLLM's own loading path; the server command line and environment; the
server life cycle (health wait, process-group stop) and `main()` end to end against a stand-in for `vllm serve`: an
HTTP server in this file that answers the way vLLM's OpenAI server does (the reference parser splits, the same JSON
and SSE shapes), good or broken on request.
"""
import json, os, signal, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from benchmarks.engine import chat_server as gcs
from solar_open2 import chat

ROOT = Path(__file__).resolve().parents[1]
FQCN = "benchmarks.engine.chat_server:ScriptedTokensLogitsProcessor"


@pytest.fixture(scope="module")
def tok():
    from solar_open2.checkpoint import tiny_tokenizer
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def tok_json(tok):
    return json.loads(tok.to_str())


def decoder(tok):
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


# ---------------------------------------------------------------------------------------------------------------
# canned answers, exactly as vLLM 0.25.1 serialises them (ChatCompletionResponse.model_dump_json(); stream chunks
# with exclude_unset=True, the first one carrying the role)
# ---------------------------------------------------------------------------------------------------------------

PLAIN = json.loads(
    '{"id":"chatcmpl-8f1c","object":"chat.completion","created":1764460800,"model":"solar-tiny","choices":[{"index":0,'
    '"message":{"role":"assistant","content":"The capital of Japan is Tokyo.","refusal":null,"annotations":null,'
    '"audio":null,"function_call":null,"reasoning":"It is Tokyo."},"logprobs":null,"finish_reason":"stop",'
    '"stop_reason":null,"token_ids":[1001,1002,1003,131,2001,2002,129],"routed_experts":null}],"service_tier":null,'
    '"system_fingerprint":null,"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7,'
    '"prompt_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,'
    '"kv_transfer_params":null,"metrics":null}')

SSE = """data: {"id":"chatcmpl-8f1d","created":1764460801,"model":"solar-tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-8f1d","created":1764460801,"model":"solar-tiny","choices":[{"index":0,"delta":{"reasoning":"It is"},"logprobs":null,"finish_reason":null,"token_ids":[1001,1002]}]}

data: {"id":"chatcmpl-8f1d","created":1764460801,"model":"solar-tiny","choices":[{"index":0,"delta":{"reasoning":" Tokyo."},"logprobs":null,"finish_reason":null,"token_ids":[1003]}]}

data: {"id":"chatcmpl-8f1d","created":1764460801,"model":"solar-tiny","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[131]}]}

data: {"id":"chatcmpl-8f1d","created":1764460801,"model":"solar-tiny","choices":[{"index":0,"delta":{"content":"The capital of Japan"},"logprobs":null,"finish_reason":null,"token_ids":[2001]}]}

data: {"id":"chatcmpl-8f1d","created":1764460801,"model":"solar-tiny","choices":[{"index":0,"delta":{"content":" is Tokyo."},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[2002,129]}]}

data: [DONE]

"""

TOOL_PLAIN = json.loads(
    '{"id":"chatcmpl-8f1e","object":"chat.completion","created":1764460802,"model":"solar-tiny","choices":[{"index":0,'
    '"message":{"role":"assistant","content":null,"refusal":null,"annotations":null,"audio":null,"function_call":null,'
    '"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather",'
    '"arguments":"{\\"city\\": \\"Seoul\\", \\"days\\": 3}"}}],"reasoning":"I call the tool."},"logprobs":null,'
    '"finish_reason":"tool_calls","stop_reason":null,"token_ids":[1001,131,135,3001,136,129],"routed_experts":null}],'
    '"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":40,"total_tokens":46,"completion_tokens":6,'
    '"prompt_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,'
    '"kv_transfer_params":null,"metrics":null}')

TOOL_SSE = """data: {"id":"chatcmpl-8f1f","created":1764460803,"model":"solar-tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"chatcmpl-8f1f","created":1764460803,"model":"solar-tiny","choices":[{"index":0,"delta":{"reasoning":"I call the tool."},"logprobs":null,"finish_reason":null,"token_ids":[1001,131]}]}

data: {"id":"chatcmpl-8f1f","created":1764460803,"model":"solar-tiny","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[135,3001]}]}

data: {"id":"chatcmpl-8f1f","created":1764460803,"model":"solar-tiny","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-2","type":"function","index":0,"function":{"name":"get_weather","arguments":"{\\"city\\": \\"Seoul\\", \\"days\\": 3}"}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":[136,129]}]}

data: [DONE]

"""
TOOL_EXPECTED = {"reasoning": "I call the tool.", "content": None,
                 "tool_calls": [{"name": "get_weather", "arguments": {"city": "Seoul", "days": 3}}]}


def test_canned_answers_split_correctly():
    plain = gcs.message_of(PLAIN)
    assert plain["reasoning"] == "It is Tokyo." and plain["content"] == "The capital of Japan is Tokyo."
    assert plain["reasoning_field"] == "reasoning" and plain["finish_reason"] == "stop"
    streamed = gcs.assemble_stream(gcs.parse_sse(SSE.splitlines(keepends=True)))
    assert streamed["reasoning"] == plain["reasoning"] and streamed["content"] == plain["content"]
    assert streamed["token_ids"] == plain["token_ids"] and streamed["chunks"] == 6
    expected = {"reasoning": "It is Tokyo.", "content": "The capital of Japan is Tokyo.", "tool_calls": []}
    assert gcs.split_problems(plain, expected) == [] and gcs.split_problems(streamed, expected) == []
    assert gcs.stream_problems(plain, streamed) == []


def test_canned_tool_answers():
    plain = gcs.message_of(TOOL_PLAIN)
    streamed = gcs.assemble_stream(gcs.parse_sse(TOOL_SSE.splitlines()))
    assert plain["tool_calls"] == streamed["tool_calls"] == TOOL_EXPECTED["tool_calls"]
    assert gcs.split_problems(plain, TOOL_EXPECTED) == [] == gcs.split_problems(streamed, TOOL_EXPECTED)
    assert gcs.stream_problems(plain, streamed) == []
    # the same answer with the call left as raw text in content is caught
    raw = json.loads(json.dumps(TOOL_PLAIN))
    m = raw["choices"][0]["message"]
    m["content"], m["tool_calls"] = "<|tool_call:start|>get_weather\n<|tool_call:end|>", []
    p = gcs.split_problems(gcs.message_of(raw), TOOL_EXPECTED)
    assert any("no tool_calls" in x for x in p) and any("marker text" in x for x in p)


def test_legacy_reasoning_content_field_is_read():
    legacy = json.loads(json.dumps(PLAIN))
    m = legacy["choices"][0]["message"]
    m["reasoning_content"] = m.pop("reasoning")
    got = gcs.message_of(legacy)
    assert got["reasoning"] == "It is Tokyo." and got["reasoning_field"] == "reasoning_content"
    sse = SSE.replace('"reasoning":', '"reasoning_content":')
    s = gcs.assemble_stream(gcs.parse_sse(sse.splitlines()))
    assert s["reasoning"] == "It is Tokyo." and s["reasoning_field"] == "reasoning_content"


@pytest.mark.parametrize("edit, needle", [
    (lambda m, c: m.update(content=None), "content is empty"),
    (lambda m, c: m.update(reasoning=None), "reasoning is empty"),
    (lambda m, c: m.update(reasoning=None, content="It is Tokyo.<|think:end|>The capital of Japan is Tokyo."), "marker text"),
    (lambda m, c: m.update(reasoning="It is Tokyo.<|think:e"), "marker text"),
    (lambda m, c: c.update(token_ids=[1001, 1002, 2001, 129]), "0 times"),
    (lambda m, c: c.update(token_ids=[131, 2001, 129]), "no generated token before"),
    (lambda m, c: c.update(token_ids=[1001, 131, 129]), "no generated token after"),
    (lambda m, c: m.update(content="Paris."), "!= expected"),
])
def test_broken_answers_are_caught(edit, needle):
    bad = json.loads(json.dumps(PLAIN))
    edit(bad["choices"][0]["message"], bad["choices"][0])
    expected = {"reasoning": "It is Tokyo.", "content": "The capital of Japan is Tokyo.", "tool_calls": []}
    assert any(needle in x for x in gcs.split_problems(gcs.message_of(bad), expected)), needle


def test_stream_differences_are_caught():
    plain = gcs.message_of(PLAIN)
    streamed = gcs.assemble_stream(gcs.parse_sse(SSE.replace('" is Tokyo."', '" is Kyoto."').splitlines()))
    assert any("stream content" in x for x in gcs.stream_problems(plain, streamed))
    other = gcs.assemble_stream(gcs.parse_sse(SSE.replace("[2001]", "[2003]").splitlines()))
    assert any("other token ids" in x for x in gcs.stream_problems(plain, other))


def test_decode_check_against_token_ids(tok):
    ids = tok.encode("It is Tokyo.<|think:end|>The capital of Japan is Tokyo.<|im:end|>").ids
    got = {"reasoning": "It is Tokyo.", "content": "The capital of Japan is Tokyo.", "tool_calls": [],
           "finish_reason": "stop", "token_ids": ids}
    assert gcs.split_problems(got, None, decoder(tok)) == []
    got["content"] = "The capital of Japan is Seoul."
    assert any("decoded ids after the marker" in x for x in gcs.split_problems(got, None, decoder(tok)))


def test_sse_errors():
    with pytest.raises(gcs.RequestFailed, match="DONE"):
        gcs.parse_sse(SSE.split("data: [DONE]")[0].splitlines())
    err = 'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\ndata: [DONE]\n'
    with pytest.raises(gcs.RequestFailed, match="boom"):
        gcs.parse_sse(err.splitlines())


def test_canned_answers_follow_vllm_schema():
    "The canned JSON is what vLLM 0.25.1's response models accept (and its field is `reasoning`)."
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import (ChatCompletionResponse, ChatCompletionStreamResponse,
                                                                    ChatMessage)
    assert "reasoning" in ChatMessage.model_fields and "reasoning_content" not in ChatMessage.model_fields
    for r in (PLAIN, TOOL_PLAIN):
        assert json.loads(ChatCompletionResponse.model_validate(r).model_dump_json()) == r
    for sse in (SSE, TOOL_SSE):
        for ev in gcs.parse_sse(sse.splitlines()):
            assert json.loads(ChatCompletionStreamResponse.model_validate(ev).model_dump_json(exclude_unset=True)) == ev


# ---------------------------------------------------------------------------------------------------------------
# requests and tokens
# ---------------------------------------------------------------------------------------------------------------

def test_ordinary_token_ids(tok, tok_json):
    ids = gcs.ordinary_token_ids(tok_json)
    assert len(ids) > 100
    special = set(chat.SPECIAL_TOKENS.values()) | {0}
    assert not special & set(ids)
    text = tok.decode(ids, skip_special_tokens=False)
    assert all(ch.isalpha() or ch == " " for ch in text)
    with pytest.raises(ValueError, match="no plain word tokens"):
        gcs.ordinary_token_ids({"model": {"vocab": {"<|x|>": 5}}, "added_tokens": []})


def test_scripts_encode_and_expected_split(tok):
    ids = gcs.encode_script(tok, gcs.SCRIPT_TEXT)
    assert ids.count(gcs.THINK_END_ID) == 1 and ids[-1] == gcs.IM_END_ID == 129 and gcs.THINK_END_ID == 131
    exp = gcs.expected_output(tok.decode(ids[:-1], skip_special_tokens=False))
    assert exp == {"reasoning": "The user asks for the capital of Japan. It is Tokyo.",
                   "content": "The capital of Japan is Tokyo.", "tool_calls": []}
    tids = gcs.encode_script(tok, gcs.TOOL_SCRIPT_TEXT)
    texp = gcs.expected_output(tok.decode(tids[:-1], skip_special_tokens=False), gcs.TOOLS)
    assert texp["reasoning"].startswith("The user wants") and texp["content"] is None
    assert texp["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Seoul", "days": 3}}]
    with pytest.raises(ValueError, match="one <\\|think:end\\|>"):
        gcs.encode_script(tok, "no marker here")


def test_request_bodies(tok_json):
    allowed = gcs.ordinary_token_ids(tok_json)
    b = gcs.budget_request(allowed, stream=True)
    assert b["thinking_token_budget"] == gcs.BUDGET and b["allowed_token_ids"] == allowed and b["stream"] is True
    assert b["temperature"] == 0.0 and b["return_token_ids"] is True and b["model"] == "solar-tiny"
    assert "skip_special_tokens" not in b          # the parser's adjust_request must keep the markers by itself
    with pytest.raises(ValueError, match="budget"):
        gcs.budget_request(allowed, budget=15, max_tokens=16)
    s = gcs.scripted_request([5, 131, 6, 129], tools=gcs.TOOLS)
    assert s["vllm_xargs"] == {"scripted_token_ids": [5, 131, 6, 129]} and s["max_tokens"] == 4
    assert s["stop_token_ids"] == [129] and s["tool_choice"] == "auto" and s["tools"] == gcs.TOOLS
    assert "tools" not in gcs.scripted_request([5, 131, 6, 129])


def test_request_bodies_are_valid_vllm_requests(tok_json):
    "vLLM's own request model turns the bodies into the sampling parameters the methods rely on."
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    allowed = gcs.ordinary_token_ids(tok_json)
    sp = ChatCompletionRequest.model_validate(gcs.budget_request(allowed)).to_sampling_params(16, {})
    assert sp.thinking_token_budget == gcs.BUDGET and sorted(sp.allowed_token_ids) == allowed and sp.temperature == 0.0
    sp = ChatCompletionRequest.model_validate(gcs.scripted_request([5, 131, 6, 129], tools=gcs.TOOLS)).to_sampling_params(4, {})
    assert sp.extra_args == {"scripted_token_ids": [5, 131, 6, 129]} and 129 in sp.stop_token_ids


def test_thinking_budget_forces_the_marker_after_the_budget(tok, tok_json, monkeypatch):
    """Method `budget` through vLLM's own thinking-budget state, driven the way its sampler drives it: the rendered
    prompt (open `<|think:start|>`), random logits masked to the allowed ids; `<|think:end|>` comes once, at index N."""
    pytest.importorskip("vllm")
    import torch
    from vllm import SamplingParams
    from vllm.config.reasoning import ReasoningConfig
    import vllm.v1.sample.thinking_budget_state as tbs
    from vllm.v1.sample.logits_processor import BatchUpdate
    monkeypatch.setattr(tbs, "async_tensor_h2d", lambda data, dtype, device: torch.tensor(data, dtype=dtype, device=device))
    rc = ReasoningConfig(reasoning_parser="solar_open2")
    rc._reasoning_start_token_ids = tok.encode(chat.THINK_START, add_special_tokens=False).ids
    rc._reasoning_end_token_ids = tok.encode(chat.THINK_END, add_special_tokens=False).ids
    prompt = tok.encode(chat.render_chat([{"role": "user", "content": gcs.USER}]), add_special_tokens=False).ids
    assert prompt[-1] == 130
    body = gcs.budget_request(gcs.ordinary_token_ids(tok_json))
    mask = torch.ones(1024, dtype=torch.bool); mask[body["allowed_token_ids"]] = False
    g = torch.Generator().manual_seed(0)
    h = tbs.ThinkingBudgetStateHolder(rc, 4, 0, torch.device("cpu"), False)
    out = []
    sp = SamplingParams(thinking_token_budget=body["thinking_token_budget"], max_tokens=body["max_tokens"])
    h.sync_batch(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, sp, prompt, out)]))
    for _ in range(body["max_tokens"]):
        logits = torch.randn(1, 1024, generator=g).masked_fill(mask, float("-inf"))
        h.update_state([out], None, repeat_indices=None)
        out.append(int(h.apply_to_logits(logits, False, None)[0].argmax()))
    assert out.count(131) == 1 and out.index(131) == gcs.BUDGET
    got = {"reasoning": tok.decode(out[:gcs.BUDGET]), "content": tok.decode(out[gcs.BUDGET + 1:]), "tool_calls": [],
           "finish_reason": "length", "token_ids": out}
    assert gcs.split_problems(got, None, decoder(tok)) == []


# ---------------------------------------------------------------------------------------------------------------
# the logits processor
# ---------------------------------------------------------------------------------------------------------------

def test_scripted_logits():
    import torch
    row = torch.randn(10)
    out = gcs.scripted_logits((3, 7), [], row)
    assert int(out.argmax()) == 3 and torch.isinf(out).sum() == 9
    assert int(gcs.scripted_logits((3, 7), [3], row).argmax()) == 7
    assert gcs.scripted_logits((3, 7), [3, 7], row) is row                # script spent: untouched
    assert gcs.scripted_logits((3, 70), [3], row) is row                  # out of vocabulary: untouched, no crash
    assert gcs.script_of(None) is None and gcs.script_of({"other": 1}) is None
    assert gcs.script_of({"scripted_token_ids": [1, 2]}) == (1, 2)
    for bad in ([], "12", [1, -2], [1.5], [True]):
        with pytest.raises(ValueError, match="scripted_token_ids"):
            gcs.script_of({"scripted_token_ids": bad})


def test_logits_processor_in_vllm():
    "Loaded by FQCN the way `--logits-processors` loads it, then driven with vLLM's BatchUpdate."
    pytest.importorskip("vllm")
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, _load_logitsprocs_by_fqcns
    (cls,) = _load_logitsprocs_by_fqcns([gcs.LOGITS_PROCESSOR_FQCN])
    assert issubclass(cls, LogitsProcessor) and cls.__name__ == "ScriptedTokensLogitsProcessor"
    lp = cls(None, torch.device("cpu"), False)
    assert lp.is_argmax_invariant() is False
    out0, out1 = [], []
    lp.update_state(BatchUpdate(batch_size=2, removed=[], moved=[], added=[
        (0, SamplingParams(extra_args={"scripted_token_ids": [4, 131, 9]}), [1, 2], out0),
        (1, SamplingParams(), [1], out1)]))
    logits = torch.randn(2, 200)
    for want in (4, 131, 9):
        got = lp.apply(logits.clone())
        assert int(got[0].argmax()) == want and torch.isinf(got[0]).sum() == 199 and torch.equal(got[1], logits[1])
        out0.append(want)                                                 # the engine appends the sampled token
    assert torch.equal(lp.apply(logits.clone()), logits)                  # script spent: both rows untouched
    lp.update_state(BatchUpdate(batch_size=1, removed=[0], moved=[], added=[]))
    assert torch.equal(lp.apply(logits.clone()), logits)
    with pytest.raises(ValueError, match="scripted_token_ids"):
        cls.validate_params(SamplingParams(extra_args={"scripted_token_ids": "x"}))
    with pytest.raises(AttributeError):
        gcs.NoSuchThing


# ---------------------------------------------------------------------------------------------------------------
# the server command line, environment and plugin files
# ---------------------------------------------------------------------------------------------------------------

def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_server_command(tmp_path):
    cmd = gcs.server_command(tmp_path / "m", 8123, tmp_path / "p.py", python="python3", extra=["--foo"])
    assert cmd[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", str(tmp_path / "m")]
    assert _flag(cmd, "--reasoning-parser") == "solar_open2" and _flag(cmd, "--tool-call-parser") == "solar_open2"
    assert "--enable-auto-tool-choice" in cmd and "--enforce-eager" in cmd and "--no-enable-prefix-caching" in cmd
    assert _flag(cmd, "--served-model-name") == "solar-tiny" and _flag(cmd, "--max-model-len") == "4096"
    assert _flag(cmd, "--gpu-memory-utilization") == "0.3" and _flag(cmd, "--port") == "8123"
    assert _flag(cmd, "--logits-processors") == FQCN
    assert _flag(cmd, "--reasoning-parser-plugin") == _flag(cmd, "--tool-parser-plugin") == str(tmp_path / "p.py")
    assert cmd[-1] == "--foo"
    assert "--reasoning-parser-plugin" not in gcs.server_command(tmp_path / "m", 8123, None)


def test_server_command_parses_with_vllm(tmp_path, monkeypatch):
    "`vllm serve`'s own argument parser accepts the command line."
    pytest.importorskip("vllm")
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform
    monkeypatch.setattr(platforms, "_current_platform", CpuPlatform())    # building the parser infers a device
    from solar_open2.vllm.compat import make_arg_parser       # its home moved in vLLM 0.33.0
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    cmd = gcs.server_command(tmp_path / "m", 8123, tmp_path / "p.py")
    a = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", str(tmp_path / "m")] + cmd[5:])
    assert a.reasoning_parser == "solar_open2" and a.tool_call_parser == "solar_open2" and a.enable_auto_tool_choice
    assert a.logits_processors == [FQCN] and a.enforce_eager
    assert a.max_model_len == 4096 and a.port == 8123 and a.served_model_name == ["solar-tiny"]


def test_server_env_and_shim(tmp_path):
    ph = gcs.perf_helpers()
    shim = ph.write_plugin_shim(tmp_path / "shim")
    env = gcs.server_env({"PYTHONPATH": "/root/site", "VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_PLUGINS": "other",
                          "PATH": os.environ.get("PATH", "")}, shim)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), str(shim), "/root/site"]
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0" and env["TRITON_CACHE_AUTOTUNING"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_PLUGINS"] == "other,solar_open2"
    # a fresh interpreter with that PYTHONPATH sees the plugin entry point (the shim's, and the package's own when it is
    # installed, as in CI: both name the same function) and can import this module by name, from anywhere
    code = ("from importlib.metadata import entry_points; import benchmarks.engine.chat_server as g; "
            "print(sorted({e.value for e in entry_points(group='vllm.general_plugins') if e.name == 'solar_open2'}), g.LOGITS_PROCESSOR)")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PATH": os.environ.get("PATH", "")},
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "['solar_open2.vllm:register'] ScriptedTokensLogitsProcessor" in out.stdout


def test_parser_plugin_file_registers_both_parsers(tmp_path):
    pytest.importorskip("vllm")
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    p = gcs.write_parser_plugin(tmp_path)
    ReasoningParserManager.import_reasoning_parser(str(p))
    ToolParserManager.import_tool_parser(str(p))
    assert ReasoningParserManager.get_reasoning_parser("solar_open2").__name__ == "SolarOpen2ReasoningParser"
    assert ToolParserManager.get_tool_parser("solar_open2").__name__ == "SolarOpen2ToolParser"


def test_reasoning_config_marker_ids(tok):
    "thinking_token_budget forces what the parser names as reasoning_end_str; in the tiny tokenizer that is id 131."
    pytest.importorskip("vllm")
    from solar_open2.vllm.parsers import SolarOpen2ReasoningParser
    assert SolarOpen2ReasoningParser.reasoning_end_str.fget(None) == chat.THINK_END
    assert tok.encode(chat.THINK_END, add_special_tokens=False).ids == [gcs.THINK_END_ID]
    assert tok.encode(chat.THINK_START, add_special_tokens=False).ids == [130]


# ---------------------------------------------------------------------------------------------------------------
# a stand-in for `vllm serve`: the same endpoints and answer shapes, the reference parser splitting
# ---------------------------------------------------------------------------------------------------------------

def fake_generate(body, allowed_default=(300, 301)):
    "Token ids the way the two forcing methods make vLLM generate them, and the finish reason."
    script = (body.get("vllm_xargs") or {}).get("scripted_token_ids")
    if script:
        ids = list(script[:body["max_tokens"]])
        return ids, "stop" if ids[-1] in (body.get("stop_token_ids") or []) else "length"
    allowed = body.get("allowed_token_ids") or list(allowed_default)
    n, budget = body["max_tokens"], body.get("thinking_token_budget")
    ids = [allowed[(7 * i + 3) % len(allowed)] for i in range(n)]
    if budget is not None: ids[budget] = 131
    return ids, "length"


class FakeVLLM(BaseHTTPRequestHandler):
    tokenizer = None
    mode = "good"                 # "good" | "unsplit" (no reasoning parser: markers stay in content) | "dead"

    def log_message(self, *a): pass

    def _send(self, code, payload, ctype="application/json"):
        data = payload.encode() if isinstance(payload, str) else payload
        self.send_response(code); self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health": return self._send(200, b"")
        if self.path == "/version": return self._send(200, json.dumps({"version": "0.25.1"}))
        if self.path == "/v1/models": return self._send(200, json.dumps({"object": "list", "data": [{"id": "solar-tiny"}]}))
        self._send(404, json.dumps({"error": {"message": "not found"}}))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("model") != "solar-tiny":
            return self._send(404, json.dumps({"error": {"message": f"The model `{body.get('model')}` does not exist."}}))
        ids, finish = fake_generate(body)
        text_ids = ids[:-1] if finish == "stop" else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=False)
        tools = body.get("tools") if body.get("tool_choice") == "auto" else None
        if self.mode == "unsplit": out = chat.ChatOutput(None, text, [])
        else: out = chat.parse_chat_output(text, True, tools)
        if out.tool_calls: finish = "tool_calls"
        base = {"id": "chatcmpl-fake", "created": 1764460800, "model": "solar-tiny"}
        if not body.get("stream"):
            msg = {"role": "assistant", "content": out.content, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "reasoning": out.reasoning}
            if out.tool_calls: msg["tool_calls"] = [c.to_openai(f"chatcmpl-tool-{c.index}") for c in out.tool_calls]
            resp = {**base, "object": "chat.completion", "choices": [{"index": 0, "message": msg, "logprobs": None,
                    "finish_reason": finish, "stop_reason": None, "token_ids": ids, "routed_experts": None}],
                    "usage": {"prompt_tokens": 10, "total_tokens": 10 + len(ids), "completion_tokens": len(ids)}}
            return self._send(200, json.dumps(resp))
        chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                        "finish_reason": None}]}]
        stream = chat.ChatStream(True, tools) if self.mode == "good" else None
        for i, t in enumerate(ids):
            last = i == len(ids) - 1
            piece = "" if (last and finish in ("stop", "tool_calls") and t in (body.get("stop_token_ids") or [])) else \
                self.tokenizer.decode(ids[:i + 1], skip_special_tokens=False)[len(self.tokenizer.decode(ids[:i], skip_special_tokens=False)):]
            if stream is None: d = chat.StreamDelta(content=piece)
            else:
                d = stream.feed(piece)
                if last:
                    f = stream.finish(); d = chat.StreamDelta(d.reasoning + f.reasoning, d.content + f.content, d.tool_calls + f.tool_calls)
            delta = {}
            if d.reasoning: delta["reasoning"] = d.reasoning
            if d.content: delta["content"] = d.content
            if d.tool_calls: delta["tool_calls"] = [{**c.to_openai(f"chatcmpl-tool-{c.index}"), "index": c.index} for c in d.tool_calls]
            ch = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish if last else None, "token_ids": [t]}
            if last: ch["stop_reason"] = None
            chunks.append({**base, "choices": [ch]})
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self._send(200, sse, "text/event-stream")


def serve_fake(port, mode, tokenizer_file=None):
    "Run the stand-in on 127.0.0.1:`port` (a child process: `python this_file --fake-server PORT MODE [TOKENIZER]`)."
    from tokenizers import Tokenizer
    from solar_open2.checkpoint import tiny_tokenizer
    FakeVLLM.tokenizer = Tokenizer.from_file(tokenizer_file) if tokenizer_file else tiny_tokenizer()
    FakeVLLM.mode = mode
    ThreadingHTTPServer(("127.0.0.1", port), FakeVLLM).serve_forever()


@pytest.fixture
def fake_server(tok):
    servers = []

    def start(mode="good"):
        FakeVLLM.tokenizer, FakeVLLM.mode = tok, mode
        srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"
    yield start
    for s in servers: s.shutdown(); s.server_close()


def test_fake_server_answers_follow_vllm_schema(fake_server, tok, tok_json):
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse, ChatCompletionStreamResponse
    base = fake_server()
    body = gcs.scripted_request(gcs.encode_script(tok, gcs.TOOL_SCRIPT_TEXT), tools=gcs.TOOLS)
    ChatCompletionResponse.model_validate(gcs.post_json(base + "/v1/chat/completions", body))
    for ev in gcs.post_sse(base + "/v1/chat/completions", {**body, "stream": True}):
        ChatCompletionStreamResponse.model_validate(ev)


def test_run_checks_against_a_good_server(fake_server, tok, tok_json):
    base = fake_server("good")
    res = gcs.run_checks(base, tok, tok_json, lambda: 100.0, request_timeout=30)
    assert set(res) == {"budget", "scripted", "scripted_tool"}
    for name, r in res.items():
        assert r["passed"], (name, r["problems"])
    assert res["budget"]["marker_index"] == gcs.BUDGET and res["budget"]["plain"]["finish_reason"] == "length"
    assert res["scripted"]["plain"]["reasoning"] == res["scripted"]["expected"]["reasoning"]
    assert res["scripted_tool"]["stream"]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Seoul", "days": 3}}]
    assert gcs.accepted(res) and gcs.reasoning_fields(res) == ["reasoning"]


def test_run_checks_against_a_server_that_does_not_split(fake_server, tok, tok_json):
    res = gcs.run_checks(fake_server("unsplit"), tok, tok_json, lambda: 100.0, request_timeout=30)
    assert not any(r["passed"] for r in res.values()) and not gcs.accepted(res)
    assert all(any("marker text" in p for p in r["problems"]) for r in res.values())


def test_run_checks_reports_http_errors_and_the_deadline(fake_server, tok, tok_json, monkeypatch):
    monkeypatch.setattr(gcs, "SERVED_MODEL", "wrong-name")
    res = gcs.run_checks(fake_server(), tok, tok_json, lambda: 100.0, request_timeout=30)
    assert all(not r["passed"] and "HTTP 404" in r["problems"][0] for r in res.values())
    monkeypatch.undo()
    res = gcs.run_checks(fake_server(), tok, tok_json, lambda: 3.0, request_timeout=30)
    assert all(r["problems"][0].startswith("skipped") for r in res.values())


# ---------------------------------------------------------------------------------------------------------------
# the server's life cycle and main()
# ---------------------------------------------------------------------------------------------------------------

CHILD = r"""
import http.server, os, subprocess, sys, time
port, delay, pidfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])   # an 'engine core' grandchild
open(pidfile, "w").write(str(g.pid))
time.sleep(delay)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _alive(pid):
    try: os.kill(pid, 0)
    except ProcessLookupError: return False
    with open(f"/proc/{pid}/stat") as f: return f.read().split()[2] != "Z"


def test_launch_wait_and_stop_the_whole_group(tmp_path):
    port = gcs.free_port()
    pidfile = tmp_path / "g.pid"
    proc = gcs.launch([sys.executable, "-c", CHILD, str(port), "1.0", str(pidfile)], dict(os.environ), tmp_path / "log")
    try:
        waited = gcs.wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60, poll=0.2)
        assert 0.5 < waited < 60
        grandchild = int(pidfile.read_text())
        assert _alive(grandchild)
    finally:
        how = gcs.stop(proc, grace=10)
    assert how.startswith("SIGTERM") and proc.poll() is not None
    for _ in range(50):
        if not _alive(grandchild): break
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_server_dies_with_the_script(tmp_path):
    "If the script itself is killed (SIGKILL: no finally), the server it launched still gets SIGTERM."
    code = (f"import sys, os, time; import benchmarks.engine.chat_server as g; "
            f"p = g.launch([sys.executable, '-c', 'import time; time.sleep(600)'], dict(os.environ), "
            f"g.Path({str(tmp_path / 'log')!r})); print(p.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
    finally:
        parent.kill(); parent.wait(10)
    for _ in range(100):
        if not _alive(child): break
        time.sleep(0.1)
    assert not _alive(child)


def test_wait_healthy_fails_fast(tmp_path):
    proc = gcs.launch([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], dict(os.environ), tmp_path / "log")
    with pytest.raises(RuntimeError, match="exited with code 3"):
        gcs.wait_healthy(f"http://127.0.0.1:{gcs.free_port()}", proc, timeout=60, poll=0.1)
    assert gcs.log_tail(tmp_path / "log") == ["boom"]
    proc = gcs.launch([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), tmp_path / "log2")
    try:
        with pytest.raises(TimeoutError):
            gcs.wait_healthy(f"http://127.0.0.1:{gcs.free_port()}", proc, timeout=1, poll=0.2)
    finally:
        gcs.stop(proc, grace=5)
    assert proc.poll() is not None


def _fake_make_tiny(path, format="compressed-tensors", seed=0):
    "Only what the client side reads: the tokenizer (no weights: the stand-in server does not load any)."
    from solar_open2 import checkpoint
    from solar_open2.config import SolarOpen2Config
    p = Path(path); p.mkdir(parents=True)
    checkpoint._tokenizer_files(p, SolarOpen2Config.tiny())
    return p


@pytest.mark.parametrize("mode, rc", [("good", 0), ("unsplit", 1), ("dead", 1)])
def test_main_end_to_end_with_a_stand_in_server(tmp_path, monkeypatch, mode, rc):
    import solar_open2.checkpoint as ck
    monkeypatch.setattr(ck, "make_tiny", _fake_make_tiny)
    real = gcs.server_command

    def fake_cmd(model_dir, port, parser_plugin=None, python=sys.executable, extra=()):
        real(model_dir, port, parser_plugin, python, extra)             # the real one must still build
        if mode == "dead": return [sys.executable, "-c", "import sys; sys.exit(7)"]
        return [sys.executable, str(Path(__file__).resolve()), "--fake-server", str(port), mode, str(Path(model_dir) / "tokenizer.json")]
    monkeypatch.setattr(gcs, "server_command", fake_cmd)
    monkeypatch.setattr(gcs, "REGISTRY_CHECK", "print('REGISTRY ' + '{\"model\": false}')")
    out = tmp_path / "out"
    got = gcs.main(["--out", str(out), "--start-timeout-s", "60", "--deadline-s", "120", "--request-timeout-s", "30"])
    assert got == rc
    rep = json.loads((out / "gpu_chat_server.json").read_text())
    assert (out / "gpu_chat_server.log").exists()
    assert rep["accepted"] is (rc == 0) and rep["server_stop"] is not None
    assert rep["plugin"]["registry_check"] == {"model": False} and rep["plugin"]["parser_plugin_file"]
    if mode == "good":
        assert rep["status"] == "passed" and rep["all_passed"] and rep["reasoning_fields"] == ["reasoning"]
        assert rep["server"]["version"] == "0.25.1" and rep["server"]["models"] == ["solar-tiny"]
    elif mode == "unsplit":
        assert rep["status"] == "failed" and rep["log_tail"] is not None
    else:
        assert rep["status"] == "error" and "exited with code 7" in rep["error"]


if __name__ == "__main__" and sys.argv[1:2] == ["--fake-server"]:
    sys.path.insert(0, str(ROOT))
    serve_fake(int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
