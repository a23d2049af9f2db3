"""On the GPU: the tiny Solar-Open2 behind vLLM's OpenAI server returns `reasoning` and `content` split at
`<|think:end|>`, non-streaming and streaming.

    python -m benchmarks.engine.chat_server [--out DIR] [--workdir DIR] [--start-timeout-s 270] [--deadline-s 330]

What it does, in one process tree that it always tears down (also on failure, on SIGTERM and on Ctrl-C):

1. writes the tiny checkpoint in Nota's NVFP4 compressed-tensors layout (`solar_open2.checkpoint.make_tiny`, with
   its tokenizer and the chat template of `solar_open2.chat`) into a temporary directory;
2. starts `vllm serve DIR` (`python -m vllm.entrypoints.cli.main serve`, in its own session) with
   `--reasoning-parser solar_open2 --enable-auto-tool-choice --tool-call-parser solar_open2
   --served-model-name solar-tiny --max-model-len 4096 --enforce-eager --gpu-memory-utilization 0.3`, a free port,
   prefix caching off, and `--logits-processors benchmarks.engine.chat_server:ScriptedTokensLogitsProcessor` (below);
3. waits for `/health`, then sends chat completions with the standard library (`urllib`) and checks the answers;
4. writes `gpu_chat_server.json` (and the server log `gpu_chat_server.log`) to `--out` (default `$OUT`), prints the
   JSON, and exits 0 when the acceptance line holds, 1 when it does not, 2 on bad arguments.

How the plugin reaches every vLLM process without a pip install: the entry-point shim of
the engine benchmark (`benchmarks.engine.perf.run`, imported, not copied): a throw-away `*.dist-info` declaring the `vllm.general_plugins`
entry point `solar_open2 = solar_open2.vllm:register`, put on PYTHONPATH with the repository root, so the API
server, the engine core and the workers all run `register()` through `load_general_plugins()`. The parsers are
also named to the server with `--reasoning-parser-plugin` / `--tool-parser-plugin` pointing at a four-line file
that makes the same lazy registrations (`solar_open2.vllm.parsers`) the plugin's `register()` makes, so the run does
not depend on which of the two lands first; `--parsers-via-plugin-only` drops that file. A side process records
whether `load_general_plugins()` alone registers the model and both parsers (`plugin.registry_check`).

Forcing the marker. Random weights never emit `<|think:end|>` (id 131) on their own, and vLLM's `reasoning` comes
from generated text only (an assistant message prefilled through `continue_final_message` is prompt, which the
parser never sees), so the marker has to be forced while generating. Two independent ways, both plain OpenAI chat
requests, greedy:

* `budget`: vLLM 0.25.1's own `thinking_token_budget` request field. With `--reasoning-parser`, vLLM builds its
  `ReasoningConfig` from the parser's `reasoning_start_str` / `reasoning_end_str` (ours: `<|think:start|>` /
  `<|think:end|>`, ids 130 / 131); the sampler counts the thinking tokens after the prompt's open
  `<|think:start|>` and, once the budget is spent, sets the end token's logit to 1e9 after every other logits
  step. `allowed_token_ids` keeps every other token to ordinary ASCII word tokens of the tiny vocabulary (no
  special token, no EOS, no `<` or `|`), so a marker can neither be sampled nor spelled by accident, and the
  answer runs to `max_tokens`. The text is whatever the random model picks, so it is checked against the returned
  `token_ids`: id 131 exactly once, with tokens before and after it, reasoning == decode(ids before it),
  content == decode(ids after it).
* `scripted`: a vLLM v1 logits processor (`ScriptedTokensLogitsProcessor`, built lazily from this module when the
  server imports it) that, for a request carrying `vllm_xargs: {"scripted_token_ids": [...]}`, masks every logit
  but the next scripted id. The script is the tiny tokenizer's encoding of `reasoning<|think:end|>content<|im:end|>`
  (`<|im:end|>` = 129 is an EOS id, so the request stops there), and the expected split is exact: the reference
  parser `solar_open2.chat.parse_chat_output` on the scripted text. `scripted_tool` does the same with a tool call
  after the marker (`tools` + `tool_choice: auto`) and expects the OpenAI `tool_calls` entry (optional: not part of
  the acceptance line).

Each is sent twice, once plain and once streaming (SSE); the reassembled stream must equal the plain answer. No
request sets `skip_special_tokens`: the parsers' `adjust_request` must keep the markers in the detokenised text by
itself, as it will for any OpenAI client. vLLM 0.25.1 names the field `reasoning` (`reasoning_content` is only
accepted on input messages); both spellings are read and the one seen is reported.

Accepted when at least one forcing method passes both its plain and its streaming check (every check is still
reported). On the GPU machine, after the vLLM staging of ../shared/device/README.md:

    export PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH && python3 -m benchmarks.engine.chat_server
"""
from __future__ import annotations
import argparse, contextlib, datetime, functools, json, os, platform, re, shutil, signal, socket
import subprocess, sys, tempfile, time, urllib.error, urllib.request
from pathlib import Path

from benchmarks.common import ROOT, out_dir_default
from solar_open2 import chat     # stdlib only; the server process imports this module too (the logits processor)

SCHEMA = 1
NAME = "gpu_chat_server"                                # the result files' name
MODULE = "benchmarks.engine.chat_server"
PARSER = "solar_open2"
SERVED_MODEL = "solar-tiny"
THINK_END_ID = chat.SPECIAL_TOKENS[chat.THINK_END]      # 131
IM_END_ID = chat.SPECIAL_TOKENS[chat.IM_END]            # 129
SCRIPT_KEY = "scripted_token_ids"                       # the vllm_xargs key the logits processor reads
LOGITS_PROCESSOR = "ScriptedTokensLogitsProcessor"
LOGITS_PROCESSOR_FQCN = f"{MODULE}:{LOGITS_PROCESSOR}"  # importable by the server: the repository is on its PYTHONPATH
MARKERS = tuple(chat.SPECIAL_TOKENS)                    # every special-token string (none may leak into a field)
SERVER_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}          # thinking_token_budget and custom logits processors need V1
REQUIRED_METHODS = ("budget", "scripted")               # acceptance: one of these passes plain and streaming

# the parser registrations of `solar_open2.vllm.parsers` (chapter 11a), as a file for --*-parser-plugin
PARSER_PLUGIN_SOURCE = f'''"""Names the Solar-Open2 parsers to vLLM (written by {MODULE})."""
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
ReasoningParserManager.register_lazy_module("{PARSER}", "solar_open2.vllm.parsers", "SolarOpen2ReasoningParser")
ToolParserManager.register_lazy_module("{PARSER}", "solar_open2.vllm.parsers", "SolarOpen2ToolParser")
'''

REGISTRY_CHECK = ("import json; from vllm.plugins import load_general_plugins; load_general_plugins(); "
                  "from vllm import ModelRegistry; from vllm.reasoning import ReasoningParserManager as R; "
                  "from vllm.tool_parsers import ToolParserManager as T; "
                  f"print('REGISTRY ' + json.dumps({{'model': 'SolarOpen2ForCausalLM' in ModelRegistry.get_supported_archs(), "
                  f"'reasoning_parser': '{PARSER}' in R.list_registered(), 'tool_parser': '{PARSER}' in T.list_registered()}}))")

USER = "What is the capital of Japan?"
SCRIPT_TEXT = "The user asks for the capital of Japan. It is Tokyo." + chat.THINK_END + "The capital of Japan is Tokyo."
TOOL_USER = "What is the weather in Seoul for the next 3 days?"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
TOOL_SCRIPT_TEXT = ("The user wants the weather in Seoul, so I call the tool." + chat.THINK_END + chat.TOOL_CALL_START
                    + "get_weather\n" + chat.TOOL_ARG_START + "city" + chat.TOOL_ARG_VALUE + "Seoul" + chat.TOOL_ARG_END
                    + "\n" + chat.TOOL_ARG_START + "days" + chat.TOOL_ARG_VALUE + "3" + chat.TOOL_ARG_END + "\n"
                    + chat.TOOL_CALL_END)
BUDGET, BUDGET_MAX_TOKENS = 6, 16

# ----------------------------------------------------------------------------------------------------------------
# the scripted-tokens logits processor (runs inside vLLM's engine; the class is built on first attribute access)
# ----------------------------------------------------------------------------------------------------------------

def script_of(extra_args)->tuple|None:
    "The scripted token ids of a request's `extra_args` (`vllm_xargs`), None when absent; ValueError when malformed."
    if not extra_args or extra_args.get(SCRIPT_KEY) is None: return None
    s = extra_args[SCRIPT_KEY]
    if not isinstance(s, (list, tuple)) or not s or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in s):
        raise ValueError(f"vllm_xargs.{SCRIPT_KEY} must be a non-empty list of token ids, got {s!r}")
    return tuple(s)

def scripted_logits(script:tuple, output_ids:list, logits):
    "One request's logits row [V]: every logit -inf but the next scripted id (0), unchanged once the script is spent."
    n = len(output_ids)
    if n >= len(script) or script[n] >= logits.shape[-1]: return logits
    out = logits.new_full(logits.shape, float("-inf"))
    out[script[n]] = 0.0
    return out

def _build_logits_processor():
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class ScriptedTokensLogitsProcessor(AdapterLogitsProcessor):
        "Forces the token ids of `vllm_xargs.scripted_token_ids`, one per step; other requests are untouched."
        @classmethod
        def validate_params(cls, params): script_of(params.extra_args)
        def is_argmax_invariant(self)->bool: return False          # it decides the argmax: applied to greedy too
        def new_req_logits_processor(self, params):
            s = script_of(params.extra_args)
            return None if s is None else functools.partial(scripted_logits, s)

    ScriptedTokensLogitsProcessor.__module__ = __name__
    return ScriptedTokensLogitsProcessor

def __getattr__(name:str):
    # PEP 562: vLLM loads `benchmarks.engine.chat_server:ScriptedTokensLogitsProcessor`; building the class needs vllm, which this
    # script's own process (and the CPU tests) never import.
    if name == LOGITS_PROCESSOR:
        cls = globals()[name] = _build_logits_processor()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# ----------------------------------------------------------------------------------------------------------------
# tokens and requests
# ----------------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"\u0120?[A-Za-z]+")     # byte-level BPE: U+0120 ('Ġ') is the space byte

def ordinary_token_ids(tokenizer_json:dict)->list:
    "Ids of the tokenizer's plain word tokens (letters, optionally after one space): no special or added token."
    added = {t["id"] for t in tokenizer_json.get("added_tokens", [])}
    ids = sorted(i for t, i in tokenizer_json["model"]["vocab"].items() if i not in added and _WORD.fullmatch(t))
    if not ids: raise ValueError("tokenizer.json: no plain word tokens found for allowed_token_ids")
    return ids

def chat_request(messages:list, max_tokens:int, stream:bool=False, **extra)->dict:
    "An OpenAI chat-completions body for the served tiny model: greedy, token ids returned."
    body = {"model": SERVED_MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True, "stream": stream, **extra}
    return body

def budget_request(allowed_ids:list, budget:int=BUDGET, max_tokens:int=BUDGET_MAX_TOKENS, stream:bool=False)->dict:
    "Method `budget`: vLLM forces `<|think:end|>` after `budget` thinking tokens; the rest are plain words."
    if not 0 < budget < max_tokens - 1: raise ValueError(f"budget {budget} must leave room for the marker and content in {max_tokens} tokens")
    return chat_request([{"role": "user", "content": USER}], max_tokens, stream,
                        thinking_token_budget=budget, allowed_token_ids=list(allowed_ids))

def scripted_request(script_ids:list, stream:bool=False, tools:list|None=None, user:str=USER)->dict:
    "Method `scripted`: the logits processor forces `script_ids` (ending in `<|im:end|>`, a stop id)."
    extra = {"vllm_xargs": {SCRIPT_KEY: list(script_ids)}, "stop_token_ids": [IM_END_ID]}
    if tools: extra.update(tools=tools, tool_choice="auto")
    return chat_request([{"role": "user", "content": user}], len(script_ids), stream, **extra)

def encode_script(tokenizer, text:str)->list:
    "Token ids of `text` + `<|im:end|>` (markers as their single special ids)."
    ids = list(tokenizer.encode(text + chat.IM_END, add_special_tokens=False).ids)
    if ids[-1] != IM_END_ID or ids.count(THINK_END_ID) != 1:
        raise ValueError(f"scripted text does not encode to one <|think:end|> and a final <|im:end|>: {ids}")
    return ids

def expected_output(text:str, tools:list|None=None)->dict:
    "The reference parser's split of the scripted model output (what the server must answer)."
    o = chat.parse_chat_output(text, thinking_open=True, tools=tools)
    return {"reasoning": o.reasoning, "content": o.content,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in o.tool_calls]}

# ----------------------------------------------------------------------------------------------------------------
# HTTP (standard library only)
# ----------------------------------------------------------------------------------------------------------------

class RequestFailed(RuntimeError):
    pass

def _post(url:str, body:dict, timeout:float):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    try: return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")[:2000]
        raise RequestFailed(f"HTTP {e.code} from {url}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise RequestFailed(f"{url}: {e}") from None

def post_json(url:str, body:dict, timeout:float=120)->dict:
    with _post(url, body, timeout) as r: data = r.read()
    try: out = json.loads(data)
    except json.JSONDecodeError: raise RequestFailed(f"{url}: answer is not JSON: {data[:500]!r}") from None
    if isinstance(out, dict) and (out.get("object") == "error" or "error" in out and "choices" not in out):
        raise RequestFailed(f"{url}: error answer: {json.dumps(out)[:2000]}")
    return out

def parse_sse(lines)->list:
    "The JSON events of a server-sent-event stream (`data: {...}` lines up to `data: [DONE]`); raises on an error event."
    events, done = [], False
    for raw in lines:
        line = (raw.decode("utf-8") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        if not line or line.startswith(":"): continue
        if not line.startswith("data:"): continue
        data = line[5:].strip()
        if data == "[DONE]": done = True; break
        ev = json.loads(data)
        if "error" in ev and "choices" not in ev: raise RequestFailed(f"error event in the stream: {data[:2000]}")
        events.append(ev)
    if not done: raise RequestFailed(f"stream ended without 'data: [DONE]' after {len(events)} events")
    return events

def post_sse(url:str, body:dict, timeout:float=120)->list:
    with _post(url, body, timeout) as r: return parse_sse(r)

def get(url:str, timeout:float=5)->tuple:
    "(status, body text) of a GET."
    with urllib.request.urlopen(url, timeout=timeout) as r: return r.status, r.read().decode("utf-8", "replace")

# ----------------------------------------------------------------------------------------------------------------
# answers: normalise, assemble, check
# ----------------------------------------------------------------------------------------------------------------

def _args(a):
    if isinstance(a, dict): return a
    try: return json.loads(a) if isinstance(a, str) and a.strip() else {}
    except json.JSONDecodeError: return a            # kept raw: the check reports it

def message_of(resp:dict)->dict:
    "The first choice of a non-streaming chat completion as {reasoning, content, tool_calls, finish_reason, token_ids, reasoning_field}."
    ch = resp["choices"][0]
    m = ch.get("message") or {}
    field = next((k for k in ("reasoning", "reasoning_content") if m.get(k) is not None), None)
    return {"reasoning": m.get(field) if field else None, "content": m.get("content"),
            "tool_calls": [{"name": (tc.get("function") or {}).get("name"), "arguments": _args((tc.get("function") or {}).get("arguments"))}
                           for tc in m.get("tool_calls") or []],
            "finish_reason": ch.get("finish_reason"), "token_ids": ch.get("token_ids"), "reasoning_field": field}

def assemble_stream(events:list)->dict:
    "Reassemble streamed chunks (choice 0) into the shape of `message_of`."
    r, c, ids, calls, finish, field, n = [], [], [], {}, None, None, 0
    for ev in events:
        for ch in ev.get("choices") or []:
            if ch.get("index", 0) != 0: continue
            n += 1
            d = ch.get("delta") or {}
            for k in ("reasoning", "reasoning_content"):
                if d.get(k) is not None: r.append(d[k]); field = field or k
            if d.get("content"): c.append(d["content"])
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", len(calls)), {"name": None, "arguments": ""})
                f = tc.get("function") or {}
                if f.get("name"): slot["name"] = slot["name"] or f["name"]
                if f.get("arguments"): slot["arguments"] += f["arguments"]
            if ch.get("token_ids"): ids += ch["token_ids"]
            if ch.get("finish_reason"): finish = ch["finish_reason"]
    return {"reasoning": "".join(r) if r else None, "content": "".join(c) if c else None,
            "tool_calls": [{"name": v["name"], "arguments": _args(v["arguments"])} for _, v in sorted(calls.items())],
            "finish_reason": finish, "token_ids": ids or None, "reasoning_field": field, "chunks": n}

def _s(x)->str: return (x or "").strip()

def leaks(text:str|None)->list:
    "Marker strings (or a `<|` fragment of one) found in `text`."
    t = text or ""
    found = [m for m in MARKERS if m in t]
    return found or (["<|"] if "<|" in t else [])

def split_problems(got:dict, expected:dict|None=None, decode=None, stop_ids=(2, IM_END_ID))->list:
    "Everything wrong with one answer's split; [] when right. `expected`: exact split; `decode`: ids -> text, to check against `token_ids`."
    p = []
    tool = bool(expected and expected.get("tool_calls"))
    if not _s(got.get("reasoning")): p.append("reasoning is empty")
    if not tool and not _s(got.get("content")): p.append("content is empty")
    if tool and not got.get("tool_calls"): p.append("no tool_calls")
    for f in ("reasoning", "content"):
        if leaks(got.get(f)): p.append(f"{f} contains marker text {leaks(got.get(f))}: {got.get(f)!r}")
    for tc in got.get("tool_calls") or []:
        if not isinstance(tc.get("arguments"), dict): p.append(f"tool call {tc.get('name')!r}: arguments are not a JSON object: {tc.get('arguments')!r}")
    ids = got.get("token_ids")
    if ids is not None:
        k = ids.count(THINK_END_ID)
        if k != 1: p.append(f"token_ids hold <|think:end|> ({THINK_END_ID}) {k} times, expected once")
        else:
            i = ids.index(THINK_END_ID)
            body = list(ids[i + 1:])
            if got.get("finish_reason") == "stop" and body and body[-1] in stop_ids: body = body[:-1]
            if i == 0: p.append("no generated token before <|think:end|>")
            if not body: p.append("no generated token after <|think:end|>")
            if decode is not None and not tool:
                if _s(decode(ids[:i])) != _s(got.get("reasoning")):
                    p.append(f"reasoning {got.get('reasoning')!r} != decoded ids before the marker {decode(ids[:i])!r}")
                if _s(decode(body)) != _s(got.get("content")):
                    p.append(f"content {got.get('content')!r} != decoded ids after the marker {decode(body)!r}")
    if expected is not None:
        for f in ("reasoning", "content"):
            if _s(got.get(f)) != _s(expected.get(f)): p.append(f"{f} {got.get(f)!r} != expected {expected.get(f)!r}")
        want = [(c["name"], c["arguments"]) for c in expected.get("tool_calls") or []]
        have = [(c.get("name"), c.get("arguments")) for c in got.get("tool_calls") or []]
        if have != want: p.append(f"tool_calls {have} != expected {want}")
    return p

def stream_problems(plain:dict, streamed:dict)->list:
    "Differences between the reassembled stream and the plain answer (same greedy request)."
    p = []
    if plain.get("token_ids") != streamed.get("token_ids"):
        # not a parsing difference: the engine generated other tokens (its split is still checked on its own ids)
        return [f"stream generated other token ids than the plain request: {streamed.get('token_ids')} vs {plain.get('token_ids')}"]
    for f in ("reasoning", "content", "tool_calls", "finish_reason"):
        a, b = plain.get(f), streamed.get(f)
        if f in ("reasoning", "content"): a, b = a or None, b or None
        if a != b: p.append(f"stream {f} {b!r} != plain {a!r}")
    return p

# ----------------------------------------------------------------------------------------------------------------
# the server
# ----------------------------------------------------------------------------------------------------------------

def perf_helpers():
    "The engine benchmark's plugin entry-point shim (`write_plugin_shim`, `installed_entry_point`, `prepend_path`, `RUN_ENV`)."
    from benchmarks.engine.perf import run
    return run

def free_port()->int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def server_command(model_dir, port:int, parser_plugin:Path|None=None, python:str=sys.executable, extra:list=())->list:
    "`vllm serve` for the tiny checkpoint with the Solar-Open2 parsers and the scripted-tokens logits processor."
    cmd = [python, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
           "--reasoning-parser", PARSER, "--enable-auto-tool-choice", "--tool-call-parser", PARSER,
           "--served-model-name", SERVED_MODEL, "--max-model-len", "4096", "--enforce-eager",
           "--gpu-memory-utilization", "0.3", "--host", "127.0.0.1", "--port", str(port),
           "--no-enable-prefix-caching", "--max-num-seqs", "8", "--seed", "0",
           "--logits-processors", LOGITS_PROCESSOR_FQCN]
    if parser_plugin is not None:
        cmd += ["--reasoning-parser-plugin", str(parser_plugin), "--tool-parser-plugin", str(parser_plugin)]
    return cmd + list(extra)

def server_env(base:dict, shim_root:Path|None)->dict:
    "The server's environment: offline vLLM settings, V1 runner, and PYTHONPATH = repository root, shim, then the rest."
    ph = perf_helpers()
    env = dict(base)
    for k, v in ph.RUN_ENV.items(): env.setdefault(k, v)
    env.update(SERVER_ENV)
    ph.prepend_path(env, *[d for d in (ROOT, shim_root) if d is not None])
    if env.get("VLLM_PLUGINS") and PARSER not in env["VLLM_PLUGINS"].split(","): env["VLLM_PLUGINS"] += "," + PARSER
    return env

def write_parser_plugin(work:Path)->Path:
    p = Path(work) / "solar_open2_parser_names.py"
    p.write_text(PARSER_PLUGIN_SOURCE)
    return p

def _die_with_parent():
    "In the child: SIGTERM when this script dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG; best effort)."
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)

def launch(cmd:list, env:dict, log_path:Path)->subprocess.Popen:
    "Start `cmd` in its own session (so the whole tree can be stopped), output to `log_path`."
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)

def wait_healthy(base_url:str, proc:subprocess.Popen, timeout:float, poll:float=1.0)->float:
    "Seconds until GET /health answers 200; raises if the server exits or `timeout` passes."
    t0 = time.monotonic()
    while True:
        rc = proc.poll()
        if rc is not None: raise RuntimeError(f"the server exited with code {rc} before /health answered")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if get(base_url + "/health", timeout=5)[0] == 200: return time.monotonic() - t0
        if time.monotonic() - t0 > timeout: raise TimeoutError(f"/health did not answer within {timeout:.0f} s")
        time.sleep(poll)

def stop(proc:subprocess.Popen|None, grace:float=30)->str|None:
    "Stop the server's whole process group (SIGTERM, then SIGKILL after `grace` s); returns how it ended."
    if proc is None: return None
    how = f"exited by itself ({proc.returncode})" if proc.poll() is not None else None
    if how is None:
        with contextlib.suppress(ProcessLookupError): os.killpg(proc.pid, signal.SIGTERM)
        try: proc.wait(grace); how = f"SIGTERM ({proc.returncode})"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError): os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10); how = "SIGKILL"
    with contextlib.suppress(ProcessLookupError): os.killpg(proc.pid, signal.SIGKILL)   # children left behind, if any
    return how

def log_tail(path:Path, lines:int=60)->list:
    try: return path.read_text("utf-8", "replace").splitlines()[-lines:]
    except OSError: return []

# ----------------------------------------------------------------------------------------------------------------
# the checks
# ----------------------------------------------------------------------------------------------------------------

def _short(body:dict)->dict:
    "A request body for the report (long id lists abridged)."
    b = dict(body)
    if "allowed_token_ids" in b: b["allowed_token_ids"] = f"{len(b['allowed_token_ids'])} plain word tokens"
    if "messages" in b: b["messages"] = [m.get("content") for m in b["messages"]]
    if "tools" in b: b["tools"] = [t["function"]["name"] for t in b["tools"]]
    return b

def run_check(base_url:str, body:dict, expected:dict|None, decode, timeout:float)->dict:
    "One method: the plain request, then the same streaming; the split and the stream checked."
    url = base_url + "/v1/chat/completions"
    res = {"request": _short(body), "problems": []}
    t = time.perf_counter()
    try:
        plain = message_of(post_json(url, {**body, "stream": False}, timeout))
        res["plain"] = plain
        res["problems"] += [f"plain: {x}" for x in split_problems(plain, expected, decode)]
        script = (body.get("vllm_xargs") or {}).get(SCRIPT_KEY)
        if script and plain.get("token_ids") != list(script):
            res["problems"].append(f"plain: generated {plain.get('token_ids')}, not the scripted ids {list(script)}")
        streamed = assemble_stream(post_sse(url, {**body, "stream": True}, timeout))
        res["stream"] = streamed
        res["problems"] += [f"stream: {x}" for x in split_problems(streamed, expected, decode)]
        res["problems"] += stream_problems(plain, streamed)
        if plain.get("token_ids") and THINK_END_ID in plain["token_ids"]:
            res["marker_index"] = plain["token_ids"].index(THINK_END_ID)
    except (RequestFailed, KeyError, IndexError, TypeError, ValueError) as e:
        res["problems"].append(f"{type(e).__name__}: {e}")
    res["seconds"] = round(time.perf_counter() - t, 2)
    res["passed"] = not res["problems"]
    return res

def run_checks(base_url:str, tokenizer, tokenizer_json:dict, deadline, request_timeout:float=150)->dict:
    "The three checks against a running server; `deadline()` = seconds left."
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
    script = encode_script(tokenizer, SCRIPT_TEXT)
    tool_script = encode_script(tokenizer, TOOL_SCRIPT_TEXT)
    plans = {
        "budget": (budget_request(ordinary_token_ids(tokenizer_json)), None),
        "scripted": (scripted_request(script), expected_output(decode(script[:-1]))),
        "scripted_tool": (scripted_request(tool_script, tools=TOOLS, user=TOOL_USER),
                          expected_output(decode(tool_script[:-1]), TOOLS)),
    }
    out = {}
    for name, (body, expected) in plans.items():
        left = deadline()
        if left < 10: out[name] = {"passed": False, "problems": [f"skipped: {left:.0f} s left before the deadline"]}; continue
        out[name] = run_check(base_url, body, expected, decode, min(request_timeout, left))
        if expected is not None: out[name]["expected"] = expected
        if name == "budget": out[name]["budget"] = body["thinking_token_budget"]
        print(f"[{NAME}] {name}: {'ok' if out[name]['passed'] else 'FAILED'} {out[name]['problems'][:3]}", flush=True)
    return out

def accepted(checks:dict)->bool:
    return any(checks.get(m, {}).get("passed") for m in REQUIRED_METHODS)

def reasoning_fields(checks:dict)->list:
    return sorted({c.get(k, {}).get("reasoning_field") for c in checks.values() for k in ("plain", "stream")} - {None})

# ----------------------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------------------

def build_parser()->argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=out_dir_default(),
                    help="where gpu_chat_server.json and .log go (default $OUT; else only the work directory)")
    ap.add_argument("--workdir", type=Path, help="work directory (default: a new temporary one, removed at the end when --out/$OUT is set)")
    ap.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    ap.add_argument("--start-timeout-s", type=float, default=270, help="wait this long for /health (cold start: KDA Triton autotune)")
    ap.add_argument("--deadline-s", type=float, default=330, help="send no request after this many seconds from the start")
    ap.add_argument("--request-timeout-s", type=float, default=150)
    ap.add_argument("--parsers-via-plugin-only", action="store_true",
                    help="do not pass --reasoning-parser-plugin/--tool-parser-plugin: the plugin's register() must name the parsers")
    ap.add_argument("--no-shim", action="store_true", help="do not write the entry-point shim (plugin pip-installed)")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more argument for `vllm serve`, repeatable; flags as --serve-arg=--flag")
    return ap

def write_report(res:dict, out:Path|None, work:Path)->list:
    paths = [work / f"{NAME}.json"] + ([Path(out) / f"{NAME}.json"] if out else [])
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(res, indent=1, default=str) + "\n")
    return paths

def main(argv:list|None=None)->int:
    a = build_parser().parse_args(argv)
    if a.start_timeout_s <= 0 or a.deadline_s <= 0 or a.request_timeout_s <= 0:
        build_parser().error("--start-timeout-s, --deadline-s and --request-timeout-s must be positive")
    t0 = time.monotonic()
    deadline = lambda: a.deadline_s - (time.monotonic() - t0)
    prev = None
    with contextlib.suppress(ValueError): prev = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    own_work = a.workdir is None
    work = Path(tempfile.mkdtemp(prefix="solar_open2_chatgpu_")) if own_work else Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / f"{NAME}.log"
    res = {"schema": SCHEMA, "script": f"python -m {MODULE}", "status": "started", "accepted": False,
           "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "argv": list(sys.argv[1:] if argv is None else argv), "python": platform.python_version(), "timeline": {}}
    proc = registry = None
    rc = 1
    try:
        from solar_open2.checkpoint import make_tiny
        model_dir = make_tiny(work / "tiny-nvfp4", "compressed-tensors")
        res["timeline"]["checkpoint_s"] = round(time.monotonic() - t0, 1)
        tokenizer_json = json.loads((model_dir / "tokenizer.json").read_text())
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        ph = perf_helpers()
        ep = ph.installed_entry_point()
        shim = None if (a.no_shim or ep is not None) else ph.write_plugin_shim(work / "plugin_shim")
        plugin_file = None if a.parsers_via_plugin_only else write_parser_plugin(work)
        env = server_env(os.environ, shim)
        port = a.port or free_port()
        base = f"http://127.0.0.1:{port}"
        cmd = server_command(model_dir, port, plugin_file, extra=a.serve_arg)
        res["server"] = {"command": cmd, "log": str(log_path),
                         "env": {k: env.get(k) for k in ("PYTHONPATH", "VLLM_PLUGINS", *ph.RUN_ENV, *SERVER_ENV)}}
        res["plugin"] = {"shim": str(shim) if shim else None, "entry_point_installed": str(ep) if ep else None,
                         "parser_plugin_file": str(plugin_file) if plugin_file else None}
        print(f"[{NAME}] starting: {' '.join(cmd)}", flush=True)
        proc = launch(cmd, env, log_path)
        # meanwhile: does the plugin alone register the model and both parsers? (a separate process, same environment)
        registry = subprocess.Popen([sys.executable, "-c", REGISTRY_CHECK], env=env, cwd=str(work), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        ready = wait_healthy(base, proc, min(a.start_timeout_s, max(deadline() - 20, 1)))
        res["timeline"]["server_ready_s"] = round(time.monotonic() - t0, 1)
        res["timeline"]["server_start_s"] = round(ready, 1)
        print(f"[{NAME}] server healthy after {ready:.0f} s", flush=True)
        with contextlib.suppress(Exception): res["server"]["version"] = json.loads(get(base + "/version")[1]).get("version")
        with contextlib.suppress(Exception): res["server"]["models"] = [m["id"] for m in json.loads(get(base + "/v1/models")[1])["data"]]
        res["checks"] = run_checks(base, tokenizer, tokenizer_json, deadline, a.request_timeout_s)
        res["reasoning_fields"] = reasoning_fields(res["checks"])
        res["accepted"] = accepted(res["checks"])
        res["all_passed"] = all(c.get("passed") for c in res["checks"].values())
        res["status"] = "passed" if res["accepted"] else "failed"
        rc = 0 if res["accepted"] else 1
    except BaseException as e:                                   # noqa: BLE001 - the report must say what happened
        import traceback
        res["status"], res["error"] = "error", f"{type(e).__name__}: {str(e)[:2000]}"
        res["traceback"] = traceback.format_exc()[-4000:]
        if isinstance(e, KeyboardInterrupt): rc = 130
        elif isinstance(e, SystemExit): rc = e.code if isinstance(e.code, int) and e.code else 1
    finally:
        res["server_stop"] = stop(proc)
        if registry is not None:
            try: txt = registry.communicate(timeout=max(5, min(120, deadline() + 60)))[0]
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError): os.killpg(registry.pid, signal.SIGKILL)
                txt = registry.communicate()[0] + "\n(timed out)"
            line = next((l for l in txt.splitlines() if l.startswith("REGISTRY ")), None)
            res.setdefault("plugin", {})["registry_check"] = json.loads(line[9:]) if line else {"error": txt[-1500:]}
        res["timeline"]["total_s"] = round(time.monotonic() - t0, 1)
        if res["status"] != "passed": res["log_tail"] = log_tail(log_path)
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError): shutil.copyfile(log_path, Path(a.out) / f"{NAME}.log")
        paths = write_report(res, a.out, work)
        print(json.dumps(res, indent=1, default=str), flush=True)
        print(f"[{NAME}] {res['status']}: accepted={res['accepted']}; wrote {', '.join(map(str, paths[1:] or paths))}", flush=True)
        if own_work and a.out: shutil.rmtree(work, ignore_errors=True)
        if prev is not None: signal.signal(signal.SIGTERM, prev)
    return rc

if __name__ == "__main__":
    sys.exit(main())
