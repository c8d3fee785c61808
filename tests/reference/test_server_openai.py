"""`dserve serve` on the default model, driven only through the official `openai` SDK
(plus raw HTTP where the SDK cannot send the bad input). References: transformers'
greedy continuation and chat template (tokenisation of the rendered conversation),
prometheus_client's parser for /metrics."""
import asyncio
import json
import math
import time
import urllib.request

import openai
import pytest

import server_util
from test_smollm2_reference import reference  # noqa: F401  (fixture)

API_KEY = "sk-test-0123456789"
MAX_MODEL_LEN = 1024
MAX_BODY = 1 << 20
# Greedy text is compared up to the first position where transformers' top two logits
# are closer than this: past such a near-tie the engine's int8-quantised activations
# may pick the other token (prompt 1 has a 0.081 gap at token 12).
TIE_MARGIN = 0.1


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    server_util.DEFAULT_MODEL = default_model
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    # A float32 KV cache: greedy text and prompt logprobs are compared with transformers
    # (float32 keys and values) up to tight near-tie margins.
    with server_util.running(dserve_bin, default_model, "--api-key", API_KEY,
                             "--served-model-name", "smollm2", "--max-model-len", MAX_MODEL_LEN,
                             "--max-num-seqs", 64, "--threads", 2, "--seed", 0,
                             "--max-body-bytes", MAX_BODY, "--kv-cache-dtype", "float32",
                             log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=300)


def raw_post(server, path, body: bytes, headers=None):
    req = urllib.request.Request(server.base_url + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {API_KEY}", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def assert_openai_error(status, body, want_status):
    assert status == want_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["message"]


# ---- behaviour against references --------------------------------------------------

def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["smollm2"]


@pytest.mark.parametrize("index", range(3))
def test_greedy_completion_matches_transformers(client, reference, index):  # noqa: F811
    ref = reference["prompts"][index]
    ties = [i for i, m in enumerate(ref["margins"]) if m < TIE_MARGIN]
    n = ties[0] if ties else len(ref["greedy"])
    if n == 0:
        pytest.skip("near-tie at the first token")
    r = client.completions.create(model="smollm2", prompt=ref["ids"], max_tokens=n,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(ref["ids"])
    assert r.usage.completion_tokens == n
    assert r.choices[0].finish_reason == "length"
    tok = _hf_tokenizer()
    assert r.choices[0].text == tok.decode(ref["greedy"][:n])


_TOK = None


def _hf_tokenizer():
    """transformers' tokenizer (and chat template) read from the default model's GGUF."""
    global _TOK
    if _TOK is None:
        import transformers
        transformers.logging.set_verbosity_error()
        p = server_util.DEFAULT_MODEL
        _TOK = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return _TOK


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one, please."}],
]


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_chat_prompt_matches_transformers_template(server, client, conv):
    tok = _hf_tokenizer()
    messages = CONVERSATIONS[conv]
    want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want_ids = tok(want, add_special_tokens=False)["input_ids"]
    status, body = raw_post(server, "/tokenize", json.dumps({"messages": messages}).encode())
    assert status == 200, body
    assert body["tokens"] == want_ids
    r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=8,
                                       temperature=0)
    assert r.usage.prompt_tokens == len(want_ids)
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens >= 1


def test_stream_equals_non_stream_and_usage(client):
    kw = dict(model="smollm2", prompt="The ocean is", max_tokens=24, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])

    messages = CONVERSATIONS[0]
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model="smollm2", messages=messages,
                                                 max_tokens=24, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_string(client):
    kw = dict(model="smollm2", prompt="Once upon a time, in a small village", max_tokens=40,
              temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    words = full.split(" ")
    assert len(words) > 6, full
    stop = " " + words[len(words) // 2]  # a word in the middle, with its leading space
    cut = full[:full.index(stop)]
    r = client.completions.create(**kw, stop=[stop])
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(**kw, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut


def test_n_and_seed(client):
    kw = dict(model="smollm2", prompt="My favourite animal is", max_tokens=16, temperature=1.0,
              n=2, seed=1234)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert len(a.choices) == 2 and [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text  # choices get seed + index, as vLLM
    c = client.completions.create(**{**kw, "seed": 99})
    assert [x.text for x in c.choices] != [x.text for x in a.choices]
    # Streamed n=2: every chunk names its choice; each choice finishes once.
    chunks = list(client.completions.create(**kw, stream=True))
    texts = ["", ""]
    finished = [0, 0]
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] += choice.text
            finished[choice.index] += choice.finish_reason is not None
    assert texts == [x.text for x in a.choices] and finished == [1, 1]


def test_chat_seed_reproducible(client):
    kw = dict(model="smollm2", messages=CONVERSATIONS[0], max_tokens=16, temperature=0.9,
              seed=7)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_logprobs(client):
    r = client.completions.create(model="smollm2", prompt="The ocean is", max_tokens=8,
                                  temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == \
        r.usage.completion_tokens
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and 1 <= len(top) <= 3
        assert abs(max(top.values()) - val) < 1e-5  # greedy: the chosen token is the best
    assert lp.text_offset[0] == 0
    c = client.chat.completions.create(model="smollm2", messages=CONVERSATIONS[0], max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token


def test_echo(client):
    r = client.completions.create(model="smollm2", prompt="Hello there", max_tokens=4,
                                  temperature=0, echo=True)
    assert r.choices[0].text.startswith("Hello there")


# ---- bad input ---------------------------------------------------------------------

def test_bad_requests_get_openai_errors(server, client):
    bad = [
        (b"{not json", 400),
        (b"[" * 100000, 400),
        (json.dumps({"model": "smollm2", "prompt": "x", "temperature": "hot"}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "x", "max_tokens": 0}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "x", "n": 1000}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "x", "logit_bias": {"1": 500}}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "x", "frobnicate": True}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "x", "top_p": 0}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "x", "temperature": -1}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": [999999999]}).encode(), 400),
        (json.dumps({"model": "nope", "prompt": "x"}).encode(), 404),
    ]
    for body, want in bad:
        status, got = raw_post(server, "/v1/completions", body)
        assert_openai_error(status, got, want)
    status, got = raw_post(server, "/v1/chat/completions",
                           json.dumps({"model": "smollm2", "messages": []}).encode())
    assert_openai_error(status, got, 400)
    status, got = raw_post(server, "/v1/completions",
                           json.dumps({"prompt": "x" * (2 * MAX_BODY)}).encode())
    assert_openai_error(status, got, 413)

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", messages=[], max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="word " * 2000, max_tokens=4)
    assert "maximum context length" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smollm2", prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smollm2", prompt="x", n=500)
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        c.completions.create(model="smollm2", prompt="x", max_tokens=2)
    for auth in ("", "Bearer", "Bearer " + API_KEY[:-1], "Basic " + API_KEY):
        status, got = raw_post(server, "/v1/completions",
                               json.dumps({"prompt": "x", "max_tokens": 2}).encode(),
                               headers={"Authorization": auth})
        assert_openai_error(status, got, 401)
    # ... and everyone else is still served.
    r = client.completions.create(model="smollm2", prompt="Still there?", max_tokens=3,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens >= 1
    assert server.get("/health")[0] == 200


# ---- load, disconnects and metrics -------------------------------------------------

def _metric(families, name, **labels):
    total = 0.0
    for s in families[name].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created"):
            total += s.value
    return total


def test_metrics_add_up(server, client):
    before = server.metrics()
    usages = []
    for i in range(5):
        r = client.completions.create(model="smollm2", prompt=f"Count: {'one ' * (i + 1)}",
                                      max_tokens=4 + i, temperature=0)
        usages.append(r.usage)
    after = server.metrics()

    def delta(name, **labels):
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    finished = sum(delta("vllm:request_success", finished_reason=r) for r in ("stop", "length"))
    assert finished == 5
    assert delta("vllm:prompt_tokens") == sum(u.prompt_tokens for u in usages)
    assert delta("vllm:generation_tokens") == sum(u.completion_tokens for u in usages)
    assert delta("vllm:e2e_request_latency_seconds") >= 5  # _count (+ buckets/sum) moved
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries",
                 "vllm:prefix_cache_hits", "vllm:num_preemptions",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        assert name in after, name
        assert all(s.labels.get("model_name") == "smollm2" for s in after[name].samples)


def test_256_streaming_clients_and_50_disconnects(server):
    async def main():
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY,
                                    max_retries=0, timeout=600)

        async def one(i):
            stream = await client.completions.create(
                model="smollm2", prompt=f"Request {i}: tell me about", max_tokens=12,
                temperature=0.8, seed=i, stream=True, extra_body={"ignore_eos": True})
            n = 0
            async for chunk in stream:
                n += 1
                if i < 50 and n == 2:
                    await stream.close()  # the client goes away mid-stream
                    return "dropped"
            return "done"

        return await asyncio.gather(*(one(i) for i in range(256)))

    results = asyncio.run(main())
    assert results.count("done") == 206 and results.count("dropped") == 50
    # Dropped requests were aborted and every block went back (cached blocks are free).
    # The gauges are refreshed after each engine step: allow that one step.
    for _ in range(50):
        m = server.metrics()
        if _metric(m, "vllm:kv_cache_usage_perc") == 0.0:
            break
        time.sleep(0.1)
    assert _metric(m, "vllm:kv_cache_usage_perc") == 0.0
    assert _metric(m, "vllm:num_requests_running") == 0
    assert _metric(m, "vllm:num_requests_waiting") == 0


def test_echo_logprobs_score_the_prompt_like_transformers(client, reference):  # noqa: F811
    """Evaluation harnesses score text with echo + logprobs + max_tokens 1: every prompt
    token after the first gets transformers' log-probability (the Q4_1 model with
    int8-quantised activations: close, not equal)."""
    ids = reference["text_ids"][:300]
    want = reference["logprobs"][:299]  # log p(ids[k + 1] | ids[:k + 1])
    r = client.completions.create(model="smollm2", prompt=ids, max_tokens=1, temperature=0,
                                  echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    got = lp.token_logprobs[1:300]
    assert len(lp.token_logprobs) == 301  # the prompt, then the generated token
    # Per token the quantised model wanders (dserve perplexity shows the same ~0.06 mean
    # gap); over the text, perplexity agrees within 2%.
    diffs = [abs(a - b) for a, b in zip(got, want)]
    assert sum(diffs) / len(diffs) < 0.1, sum(diffs) / len(diffs)
    ppl_got = math.exp(-sum(got) / len(got))
    ppl_want = math.exp(-sum(want) / len(want))
    assert abs(ppl_got / ppl_want - 1) < 0.02, (ppl_got, ppl_want)
    assert r.usage.prompt_tokens == 300


def test_streamed_text_never_splits_a_character(client):
    kw = dict(model="smollm2", prompt="日本の首都は東京です。富士山は", max_tokens=32,
              temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    assert any(ord(ch) > 127 for ch in whole), whole  # multi-byte characters were produced
    pieces = [c.choices[0].text for c in client.completions.create(**kw, stream=True)
              if c.choices]
    # A character split across chunks would come out as two U+FFFD pieces here.
    assert "".join(pieces) == whole
