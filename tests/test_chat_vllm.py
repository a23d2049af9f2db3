"""The Solar-Open2 chat parsers inside vLLM 0.25.1's own parser pipeline, on CPU.

Registered by name the way the plugin does it, composed by vLLM's `ParserManager` into the `DelegatingParser` its
OpenAI server uses, and driven the way the server drives it: `parse` for a finished response, `parse_delta` for each
streamed delta (with the prompt's token ids and `finished` on the last one). For recorded outputs, every split of the
stream (each character boundary, inside special tokens too; each token boundary; random chunkings) gives the
non-streaming result, which is also the pure parser's result (`solar_open2.chat.parse_chat_output`).
"""
import random

import pytest

pytest.importorskip("vllm")

from solar_open2.chat import SPECIAL_TOKENS, parse_chat_output, render_chat, segment  # noqa: E402

NAME = "solar_open2"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
MESSAGES = [{"role": "user", "content": "Earlier question"}, {"role": "assistant", "content": "Earlier answer"},
            {"role": "user", "content": "Weather in Seoul?"}]
CALL = ("<|tool_call:start|>get_weather\n<|tool_arg:start|>city<|tool_arg:value|>Seoul<|tool_arg:end|>\n"
        "<|tool_arg:start|>days<|tool_arg:value|>2<|tool_arg:end|>\n<|tool_call:end|>\n")
# (name, model output, reasoning_effort of the request)
RECORDED = [
    ("answer", "Two plus two.<|think:end|>It is **4**.", None),
    ("tool calls", "Need tools.<|think:end|>Checking.\n" + CALL + "<|tool_call:start|>get_time\n<|tool_call:end|>\n", "high"),
    ("call inside reasoning", "I will call " + CALL + "then answer", "medium"),
    ("closed thinking", "Sure. " + CALL, "low"),
    ("truncated in a marker", "Thinking about it <|think:e", None),
    ("unterminated call", "ok<|think:end|>Calling <|tool_call:start|>get_weather\n<|tool_arg:start|>city<|tool_ar", None),
    ("malformed", "hm<|think:end|>a<|tool_call:end|>b <|tool_call:start|>get weather\n<|tool_call:end|>"
                  "<|tool_call:start|>get_weather\n<|tool_arg:start|>opts<|tool_arg:value|>{bad<|tool_arg:end|>\n"
                  "<|tool_call:end|> <|think:end|>", "xhigh"),
]


class CharTokenizer:
    "Markers are single tokens at their ids; every other character is one token (1000 + code point)."

    def get_vocab(self):
        return dict(SPECIAL_TOKENS)

    def spans(self, text):
        "(start, end, id) of every token of `text`."
        out, at = [], 0
        for p in segment(text):
            for piece in ([p] if p in SPECIAL_TOKENS else list(p)):
                tid = SPECIAL_TOKENS.get(piece, 1000 + ord(piece[0]))
                out.append((at, at + len(piece), tid))
                at += len(piece)
        return out

    def encode(self, text):
        return [t for _, _, t in self.spans(text)]

    def decode(self, ids, **kw):
        inv = {v: k for k, v in SPECIAL_TOKENS.items()}
        return "".join(inv.get(i) or chr(i - 1000) for i in ids)


TOK = CharTokenizer()


@pytest.fixture(scope="module")
def parser_cls():
    from vllm.parser.parser_manager import ParserManager
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    # the registration the plugin's register() makes
    ReasoningParserManager.register_lazy_module(NAME, "solar_open2.vllm.parsers", "SolarOpen2ReasoningParser")
    ToolParserManager.register_lazy_module(NAME, "solar_open2.vllm.parsers", "SolarOpen2ToolParser")
    assert NAME in ReasoningParserManager.list_registered() and NAME in ToolParserManager.list_registered()
    return ParserManager.get_parser(tool_parser_name=NAME, reasoning_parser_name=NAME, enable_auto_tools=True)


def make_request(effort, **kw):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    return ChatCompletionRequest(messages=MESSAGES, model="solar", tools=TOOLS, reasoning_effort=effort, **kw)


def new_parser(parser_cls, request):
    "A parser as the server builds one per response: with the request's effective chat_template_kwargs."
    kwargs = request.build_chat_params(None, "string").chat_template_kwargs
    return parser_cls(TOK, request.tools, chat_template_kwargs=kwargs, model_config=None)


def normal(reasoning, content, calls):
    "vLLM reports whitespace-only content next to tool calls as None; empty strings are None."
    if content is not None and calls and not content.strip():
        content = None
    return reasoning or None, content or None, calls


def full(parser_cls, request, text):
    r, c, calls = new_parser(parser_cls, request).parse(text, request, enable_auto_tools=True)
    return normal(r, c, [(x.name, x.arguments) for x in calls or []])


def streamed(parser_cls, request, prompt_ids, text, cuts):
    p, spans = new_parser(parser_cls, request), TOK.spans(text)
    r, c, calls = "", "", []
    bounds = list(zip([0, *cuts], [*cuts, len(text)]))
    for k, (a, b) in enumerate(bounds):
        ids = [t for s, e, t in spans if a < e <= b]   # a token belongs to the delta that completes it
        d = p.parse_delta(text[a:b], ids, request, prompt_token_ids=prompt_ids, finished=k == len(bounds) - 1)
        if d is None:
            continue
        r += d.reasoning or ""
        c += d.content or ""
        for tc in d.tool_calls:
            assert tc.id and tc.type == "function" and tc.index == len(calls)
            calls.append((tc.function.name, tc.function.arguments))
    return normal(r, c, calls)


def all_splits(text):
    n = len(text)
    token_ends = [e for _, e, _ in TOK.spans(text)][:-1]
    rng = random.Random(n)
    yield from ([i] for i in range(1, n))                       # every character boundary
    yield token_ends                                            # token by token, as the server streams
    yield list(range(1, n))                                     # character by character
    for _ in range(40):
        yield sorted(rng.sample(range(1, n), rng.randint(2, min(n - 1, 15))))


@pytest.mark.parametrize("name,text,effort", RECORDED, ids=[r[0] for r in RECORDED])
def test_stream_equals_parse_every_split(parser_cls, name, text, effort):
    from solar_open2.chat import thinking_is_open
    request = make_request(effort)
    prompt_ids = TOK.encode(render_chat(MESSAGES, tools=TOOLS, reasoning_effort=effort))
    want = full(parser_cls, request, text)
    core = parse_chat_output(text, thinking_is_open(effort), TOOLS)
    assert want == normal(core.reasoning, core.content, [(x.name, x.arguments_json) for x in core.tool_calls])
    runs = 0
    for cuts in all_splits(text):
        assert streamed(parser_cls, request, prompt_ids, text, cuts) == want, (name, cuts)
        runs += 1
    assert runs > len(text)


def test_recorded_outputs_parse_as_specified(parser_cls):
    got = {name: full(parser_cls, make_request(effort), text) for name, text, effort in RECORDED}
    weather = ("get_weather", '{"city": "Seoul", "days": 2}')
    assert got["answer"] == ("Two plus two.", "It is **4**.", [])
    assert got["tool calls"] == ("Need tools.", "Checking.\n", [weather, ("get_time", "{}")])
    assert got["call inside reasoning"] == ("I will call ", "\nthen answer", [weather])  # text after a call keeps its newline
    assert got["closed thinking"] == (None, "Sure. ", [weather])
    assert got["truncated in a marker"] == ("Thinking about it <|think:e", None, [])      # held back, then flushed
    assert got["unterminated call"][1] == "Calling <|tool_call:start|>get_weather\n<|tool_arg:start|>city<|tool_ar"
    r, c, calls = got["malformed"]
    assert c == "a<|tool_call:end|>b <|tool_call:start|>get weather\n<|tool_call:end|> <|think:end|>"
    assert calls == [("get_weather", '{"opts": "{bad"}')]                                # bad JSON kept as text


def test_prompt_decides_open_or_closed(parser_cls):
    "The server asks the reasoning parser whether the prompt left thinking open, on the prompt's token ids."
    for effort, open_ in [(None, True), ("high", True), ("low", False), ("none", False)]:
        ids = TOK.encode(render_chat(MESSAGES, tools=TOOLS, reasoning_effort=effort))
        assert new_parser(parser_cls, make_request(effort)).is_reasoning_end(ids) == (not open_)


def test_requests_keep_special_tokens(parser_cls):
    request = make_request(None)
    assert request.skip_special_tokens in (True, None)          # None (vLLM 0.33.0): the server's default, True
    assert new_parser(parser_cls, request).adjust_request(request).skip_special_tokens is False


def test_tool_choice_none_keeps_text(parser_cls):
    request = make_request(None, tool_choice="none")
    text = "ok<|think:end|>" + CALL
    prompt_ids = TOK.encode(render_chat(MESSAGES, tools=TOOLS))
    assert full(parser_cls, request, text) == ("ok", CALL, [])
    assert streamed(parser_cls, request, prompt_ids, text, [5, 20, 40]) == ("ok", CALL, [])
