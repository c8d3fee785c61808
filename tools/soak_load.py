"""The request mix of tools/soak.py: each scenario sends one kind of request to an
OpenAI-compatible server, checks the answer the way the OpenAI API defines it, and
returns the label it is counted under ("200", "400", "200 cancelled", ...). A wrong
status, a malformed body, a broken stream or a transport error raises LoadError with a
kind (the summary counts errors by kind).

Scenarios (weights in MIX):
  chat_stream       a streamed chat completion read to `data: [DONE]`
  cancel_stream     a streamed completion closed after a few chunks (the server aborts it)
  structured        a chat completion under a JSON schema; its content must validate
  tool_call         a chat completion that must call a tool with arguments that validate
  long_prompt       a completion with a prompt of about 1500 tokens
  completion        a completion with n = 2 and logprobs
  bad_request       one of BAD_REQUESTS: must get its 4xx with an OpenAI error body
  slow_reader       a stream read a few bytes at a time
  slow_writer       a request whose body arrives in pieces over about 2 s
"""
import asyncio
import json
import random

import aiohttp
import jsonschema

TIMEOUT_S = 300

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "Lima", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}

WORDS = ("river stone lamp orbit cedar violet harbor engine meadow copper lantern signal "
         "glacier pepper quartz saddle thunder velvet willow anchor").split()


class LoadError(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Client:
    """One worker's view of the server: its base URL, model name and HTTP session."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str,
                 rng: random.Random):
        self.session, self.base_url, self.model, self.rng = session, base_url, model, rng
        host_port = base_url.split("://", 1)[1]
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)

    async def post_json(self, path: str, body) -> tuple[int, dict]:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        async with self.session.post(self.base_url + path, data=data,
                                     headers={"Content-Type": "application/json"}) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except json.JSONDecodeError:
                raise LoadError("malformed_body", f"{path} {r.status}: {text[:200]!r}")


def expect_status(path: str, status: int, want: int, body):
    if status != want:
        raise LoadError(f"status_{status}", f"{path}: want {want}, got {status}: {str(body)[:300]}")


def sse_events(raw: str) -> list[str]:
    """The data of each SSE event in `raw`, in order."""
    return [line[len("data: "):] for line in raw.split("\n") if line.startswith("data: ")]


def check_stream_events(events: list[str], want_choices: int = 1) -> str:
    """Checks an SSE completion stream ends with [DONE] and every chunk is JSON with
    choices; returns the last finish_reason seen."""
    if not events or events[-1] != "[DONE]":
        raise LoadError("stream_unterminated", f"last events {events[-2:]!r}")
    finish = None
    for e in events[:-1]:
        try:
            chunk = json.loads(e)
        except json.JSONDecodeError:
            raise LoadError("stream_malformed_chunk", e[:200])
        if "error" in chunk:
            raise LoadError("stream_error_event", e[:300])
        for c in chunk.get("choices", []):
            if c.get("index", 0) >= want_choices:
                raise LoadError("stream_bad_index", e[:200])
            finish = c.get("finish_reason") or finish
    if finish not in ("stop", "length"):
        raise LoadError("stream_no_finish_reason", f"finish_reason {finish!r}")
    return finish


def chat_body(c: Client, content: str, max_tokens: int, **extra) -> dict:
    return {"model": c.model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, **extra}


async def chat_stream(c: Client) -> str:
    body = chat_body(c, "Tell me about " + words(c.rng, 6), c.rng.randint(8, 48), stream=True,
                     temperature=0.7, seed=c.rng.randrange(1 << 30))
    async with c.session.post(c.base_url + "/v1/chat/completions", json=body) as r:
        raw = await r.text()
        expect_status("chat stream", r.status, 200, raw)
    check_stream_events(sse_events(raw))
    return "200"


async def cancel_stream(c: Client) -> str:
    body = {"model": c.model, "prompt": "Once upon a time " + words(c.rng, 8), "max_tokens": 200,
            "stream": True, "ignore_eos": True}
    r = await c.session.post(c.base_url + "/v1/completions", json=body)
    try:
        expect_status("cancel stream", r.status, 200, "")
        want = c.rng.randint(1, 5)
        seen = 0
        async for line in r.content:
            if line.startswith(b"data: "):
                seen += 1
                if seen >= want:
                    break
        if seen < want:
            raise LoadError("stream_ended_early", f"{seen} of {want} chunks before the close")
    finally:
        r.close()  # drops the connection mid-stream: the server must abort the request
    return "200 cancelled"


async def structured(c: Client) -> str:
    body = chat_body(c, "Describe a person as JSON.", 64, temperature=0.8,
                     response_format={"type": "json_schema",
                                      "json_schema": {"name": "person", "schema": PERSON_SCHEMA,
                                                      "strict": True}})
    status, reply = await c.post_json("/v1/chat/completions", body)
    expect_status("structured", status, 200, reply)
    choice = reply["choices"][0]
    if choice["finish_reason"] == "stop":
        try:
            jsonschema.validate(json.loads(choice["message"]["content"]), PERSON_SCHEMA)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            raise LoadError("structured_invalid", f"{choice['message']['content']!r}: {e}")
    return "200"


async def tool_call(c: Client) -> str:
    body = chat_body(c, "What is the weather in " + c.rng.choice(["Paris", "Lima", "Oslo"]) + "?",
                     64, tools=[WEATHER_TOOL], tool_choice="required", temperature=0.5)
    status, reply = await c.post_json("/v1/chat/completions", body)
    expect_status("tool call", status, 200, reply)
    choice = reply["choices"][0]
    if choice["finish_reason"] == "length":
        return "200"  # cut short: arguments may be incomplete
    calls = choice["message"].get("tool_calls") or []
    if choice["finish_reason"] != "tool_calls" or not calls:
        raise LoadError("tool_call_missing", json.dumps(choice)[:300])
    fn = calls[0]["function"]
    try:
        if fn["name"] != "get_weather":
            raise jsonschema.ValidationError(f"function {fn['name']!r}")
        jsonschema.validate(json.loads(fn["arguments"]), WEATHER_TOOL["function"]["parameters"])
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        raise LoadError("tool_call_invalid", f"{fn!r}: {e}")
    return "200"


async def long_prompt(c: Client) -> str:
    body = {"model": c.model, "prompt": words(c.rng, 1500), "max_tokens": 8, "temperature": 0}
    status, reply = await c.post_json("/v1/completions", body)
    expect_status("long prompt", status, 200, reply)
    if reply["usage"]["prompt_tokens"] < 1000:
        raise LoadError("long_prompt_short", json.dumps(reply["usage"]))
    return "200"


async def completion(c: Client) -> str:
    max_tokens = c.rng.randint(4, 32)
    body = {"model": c.model, "prompt": words(c.rng, 12), "max_tokens": max_tokens, "n": 2,
            "logprobs": 2, "temperature": 1.0, "ignore_eos": True}
    status, reply = await c.post_json("/v1/completions", body)
    expect_status("completion", status, 200, reply)
    if len(reply["choices"]) != 2 or reply["usage"]["completion_tokens"] != 2 * max_tokens:
        raise LoadError("completion_wrong_length", json.dumps(reply["usage"]))
    for choice in reply["choices"]:
        if len(choice["logprobs"]["tokens"]) != max_tokens:
            raise LoadError("completion_wrong_logprobs", json.dumps(choice["logprobs"])[:300])
    return "200"


def bad_requests(model: str) -> list[tuple[str, str, object, int]]:
    """(method, path, body, status the OpenAI API answers) for requests that must fail."""
    msgs = [{"role": "user", "content": "hi"}]
    return [
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("POST", "/v1/chat/completions", {"model": model, "messages": "hi"}, 400),
        ("POST", "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": -1}, 400),
        ("POST", "/v1/chat/completions",
         {"model": model, "messages": msgs, "temperature": -1}, 400),
        ("POST", "/v1/completions", {"model": model, "prompt": "x", "top_p": 2}, 400),
        ("POST", "/v1/chat/completions", {"model": "no-such-model", "messages": msgs}, 404),
        ("POST", "/v1/completions", {"model": model, "prompt": "x", "max_tokens": 10 ** 9}, 400),
        ("POST", "/v1/chat/completions",
         {"model": model, "messages": msgs,
          "response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
         400),
        ("POST", "/v1/chat/completions",
         {"model": model, "messages": msgs, "tools": [WEATHER_TOOL],
          "tool_choice": {"type": "function", "function": {"name": "missing"}}}, 400),
        ("GET", "/v1/no-such-endpoint", None, 404),
        ("GET", "/v1/chat/completions", None, 405),
    ]


async def bad_request(c: Client) -> str:
    method, path, body, want = c.rng.choice(bad_requests(c.model))
    data = body if isinstance(body, bytes) else (None if body is None else json.dumps(body))
    async with c.session.request(method, c.base_url + path, data=data,
                                 headers={"Content-Type": "application/json"}) as r:
        text = await r.text()
        expect_status(f"bad request {path}", r.status, want, text)
    try:
        err = json.loads(text)["error"]
        if not isinstance(err["message"], str) or not err["message"]:
            raise KeyError("message")
    except (json.JSONDecodeError, KeyError, TypeError):
        raise LoadError("error_body_malformed", f"{path} {want}: {text[:200]!r}")
    return str(want)


def dechunk(raw: bytes) -> bytes:
    """The body of an HTTP/1.1 chunked transfer encoding."""
    out, i = b"", 0
    while True:
        end = raw.index(b"\r\n", i)
        size = int(raw[i:end].split(b";")[0], 16)
        if size == 0:
            return out
        out += raw[end + 2:end + 2 + size]
        i = end + 2 + size + 2


async def raw_exchange(c: Client, head: bytes, body_parts: list[bytes], part_delay: float,
                       read_size: int, read_delay: float) -> tuple[int, bytes]:
    """Sends `head` then the body in parts `part_delay` apart, and reads the reply
    `read_size` bytes every `read_delay` s: (status, body, de-chunked)."""
    reader, writer = await asyncio.open_connection(c.host, c.port)
    try:
        writer.write(head)
        for part in body_parts:
            await writer.drain()
            await asyncio.sleep(part_delay)
            writer.write(part)
        await writer.drain()
        raw = b""
        while True:
            piece = await reader.read(read_size)
            if not piece:
                break
            raw += piece
            if read_delay:
                await asyncio.sleep(read_delay)
    finally:
        writer.close()
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        raise LoadError("raw_no_headers", repr(raw[:200]))
    status = int(raw.split(b" ", 2)[1])
    headers, body = raw[:head_end].lower(), raw[head_end + 4:]
    if b"transfer-encoding: chunked" in headers:
        body = dechunk(body)
    return status, body


def request_head(c: Client, path: str, n_body: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {c.host}:{c.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {n_body}\r\n"
            f"Connection: close\r\n\r\n").encode()


async def slow_reader(c: Client) -> str:
    body = json.dumps(chat_body(c, "Say something about " + words(c.rng, 4), 24,
                                stream=True)).encode()
    status, reply = await raw_exchange(c, request_head(c, "/v1/chat/completions", len(body)),
                                       [body], 0.0, read_size=64, read_delay=0.05)
    expect_status("slow reader", status, 200, reply[:300])
    check_stream_events(sse_events(reply.decode()))
    return "200"


async def slow_writer(c: Client) -> str:
    body = json.dumps({"model": c.model, "prompt": words(c.rng, 10), "max_tokens": 8}).encode()
    third = len(body) // 3
    parts = [body[:third], body[third:2 * third], body[2 * third:]]
    status, reply = await raw_exchange(c, request_head(c, "/v1/completions", len(body)), parts,
                                       0.7, read_size=65536, read_delay=0.0)
    expect_status("slow writer", status, 200, reply[:300])
    if json.loads(reply)["choices"][0]["finish_reason"] not in ("stop", "length"):
        raise LoadError("slow_writer_bad_reply", reply[:300].decode(errors="replace"))
    return "200"


# Scenario, weight. Long prompts are heavy on a small CPU: fewer of them.
MIX = [
    (chat_stream, 4),
    (cancel_stream, 2),
    (structured, 2),
    (tool_call, 2),
    (long_prompt, 1),
    (completion, 3),
    (bad_request, 3),
    (slow_reader, 1),
    (slow_writer, 1),
]


async def run_one(c: Client, scenario=None) -> tuple[str, str]:
    """Runs `scenario`, or one drawn from MIX: (scenario name, label). Raises LoadError."""
    if scenario is None:
        scenario = c.rng.choices([s for s, _ in MIX], weights=[w for _, w in MIX])[0]
    try:
        label = await asyncio.wait_for(scenario(c), TIMEOUT_S)
    except LoadError as e:
        e.scenario = scenario.__name__
        raise
    except asyncio.TimeoutError:
        err = LoadError("timeout", f"no answer in {TIMEOUT_S} s")
        err.scenario = scenario.__name__
        raise err
    except (aiohttp.ClientError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
        err = LoadError(type(e).__name__, str(e)[:300])
        err.scenario = scenario.__name__
        raise err
    return scenario.__name__, label
