"""vLLM's `prompt_logprobs` on `dserve serve` with the default model, through the official
`openai` SDK (the field comes back as an extra the SDK keeps). References:
transformers' log-softmax of the same prompt tokens (the cached fixture of
test_smollm2_reference: the Q4_1 model with int8-quantised activations is close to it,
not equal), transformers' tokenizer for `decoded_token`, and the completions endpoint's
own echo + logprobs scoring, which must agree entry for entry."""
import math

import openai
import pytest

import server_util
from test_server_openai import _hf_tokenizer
from test_smollm2_reference import reference  # noqa: F401  (fixture)

N_TOP = 3


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    server_util.DEFAULT_MODEL = default_model
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    # A float32 KV cache, as the other comparisons with transformers use.
    with server_util.running(dserve_bin, default_model, "--served-model-name", "smollm2",
                             "--max-model-len", 1024, "--threads", 2, "--seed", 0,
                             "--kv-cache-dtype", "float32", log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0,
                         timeout=300)


post = server_util.post_json


def check_structure(prompt_logprobs, ids, n_top):
    """vLLM's shape: null, then per token {id: {logprob, rank, decoded_token}} holding the
    actual token and the n_top best (ranks 1..n_top, logprobs falling with rank)."""
    assert len(prompt_logprobs) == len(ids)
    assert prompt_logprobs[0] is None
    for pos, (entry, actual) in enumerate(zip(prompt_logprobs[1:], ids[1:]), start=1):
        assert all(set(v) == {"logprob", "rank", "decoded_token"} for v in entry.values())
        assert str(actual) in entry, (pos, entry)
        mine = entry[str(actual)]
        top = sorted((v for v in entry.values() if v["rank"] <= n_top), key=lambda v: v["rank"])
        assert [v["rank"] for v in top] == list(range(1, n_top + 1)), (pos, entry)
        assert len(entry) in (n_top, n_top + 1)
        lps = [v["logprob"] for v in top]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
        assert sum(math.exp(lp) for lp in lps) <= 1 + 1e-5
        assert mine["rank"] >= 1
        if n_top:
            assert mine["logprob"] <= lps[0] + 1e-6
            if mine["rank"] > n_top:  # outside the top: below every one of them
                assert len(entry) == n_top + 1 and mine["logprob"] <= lps[-1] + 1e-6
            else:  # inside: it is the alternative of its rank
                assert top[mine["rank"] - 1] is mine
        elif mine["rank"] == 1:
            assert len(entry) == 1


def test_prompt_logprobs_match_transformers(client, reference):  # noqa: F811
    ids = reference["text_ids"][:300]
    want = reference["logprobs"][:299]  # transformers: log p(ids[k + 1] | ids[:k + 1])
    r = client.completions.create(model="smollm2", prompt=ids, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": N_TOP})
    pl = r.choices[0].prompt_logprobs
    check_structure(pl, ids, N_TOP)
    got = [pl[k][str(ids[k])]["logprob"] for k in range(1, 300)]
    diffs = [abs(a - b) for a, b in zip(got, want)]
    assert sum(diffs) / len(diffs) < 0.1, sum(diffs) / len(diffs)
    ppl_got, ppl_want = math.exp(-sum(got) / len(got)), math.exp(-sum(want) / len(want))
    assert abs(ppl_got / ppl_want - 1) < 0.02, (ppl_got, ppl_want)
    # Ranks against transformers: a token it gives more than 70% is the favourite here
    # too; one it gives less than 1 / vocabulary cannot be.
    ranks = [pl[k][str(ids[k])]["rank"] for k in range(1, 300)]
    sure = [rank for rank, lp in zip(ranks, want) if lp > math.log(0.7)]
    never = [rank for rank, lp in zip(ranks, want) if lp < math.log(1 / 49152) - 1]
    assert len(sure) > 20 and all(rank == 1 for rank in sure)
    assert len(never) >= 3 and all(rank > 1 for rank in never)
    # decoded_token is transformers' decode of the single id, as vLLM's.
    tok = _hf_tokenizer()
    for entry in pl[1:]:
        for key, v in entry.items():
            want_text = tok.decode([int(key)])
            if "\ufffd" not in want_text:  # a part of a UTF-8 character: no text of its own
                assert v["decoded_token"] == want_text, (key, v)


def test_prompt_logprobs_equal_echo_logprobs(client):
    prompt = "The quick brown fox jumps over the lazy dog because it"
    kw = dict(model="smollm2", prompt=prompt, max_tokens=1, temperature=0)
    r = client.completions.create(**kw, extra_body={"prompt_logprobs": N_TOP})
    pl = r.choices[0].prompt_logprobs
    assert r.choices[0].logprobs is None
    echo = client.completions.create(**kw, echo=True, logprobs=N_TOP)
    lp = echo.choices[0].logprobs
    n = r.usage.prompt_tokens
    assert len(pl) == n and lp.token_logprobs[0] is None and len(lp.tokens) == n + 1
    for k in range(1, n):
        # The echoed token, its logprob, and the alternatives (by text) are the same.
        actual = [v for v in pl[k].values() if v["decoded_token"] == lp.tokens[k]]
        assert actual and actual[0]["logprob"] == pytest.approx(lp.token_logprobs[k], abs=1e-5)
        assert {v["decoded_token"]: v["logprob"] for v in pl[k].values()} == \
            pytest.approx(lp.top_logprobs[k], abs=1e-5)
    # As vLLM, echo + logprobs carries prompt_logprobs too (the same scores).
    assert echo.choices[0].prompt_logprobs == pl


def test_prompt_logprobs_zero_and_many_prompts(server, client):
    prompts = ["Hello there, how are you?", "One two three four five"]
    r = client.completions.create(model="smollm2", prompt=prompts, n=2, max_tokens=2,
                                  temperature=0, extra_body={"prompt_logprobs": 0})
    assert len(r.choices) == 4
    for i, c in enumerate(r.choices):
        status, ids = post(server, "/tokenize", {"prompt": prompts[i // 2]})
        assert status == 200
        check_structure(c.prompt_logprobs, ids["tokens"], 0)
        assert c.prompt_logprobs == r.choices[i // 2 * 2].prompt_logprobs
    assert r.choices[0].prompt_logprobs != r.choices[2].prompt_logprobs


def test_chat_prompt_logprobs_at_the_top(server, client):
    messages = [{"role": "user", "content": "Name a colour."}]
    r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=2,
                                       temperature=0, extra_body={"prompt_logprobs": 2})
    status, ids = post(server, "/tokenize", {"messages": messages})
    assert status == 200 and len(ids["tokens"]) == r.usage.prompt_tokens
    check_structure(r.prompt_logprobs, ids["tokens"], 2)
    assert not hasattr(r.choices[0], "prompt_logprobs") or r.choices[0].prompt_logprobs is None
    # Without the field there is none.
    plain = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=2)
    assert getattr(plain, "prompt_logprobs", None) is None


@pytest.mark.parametrize("extra", [
    {"prompt_logprobs": -1},
    {"prompt_logprobs": 21},
    {"prompt_logprobs": 1.5},
    {"prompt_logprobs": "2"},
    {"prompt_logprobs": 2, "stream": True},
])
def test_bad_prompt_logprobs_is_a_400_naming_it(server, extra):
    for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                 "max_tokens": 1})):
        status, got = post(server, path, {**body, **extra})
        assert status == 400, got
        assert got["error"]["param"] == "prompt_logprobs", got
