"""OpenAI's `logit_bias` on `dserve serve` with the default model, through the official
`openai` SDK (plus raw HTTP for bad input). The reference for what a bias must do is
the same request without it: a token the unbiased run generates never appears once
banned (-100), greedy and sampled; a boosted token (+100) is all the output; the
logprobs stay those of the unbiased model (vLLM v1's default `raw_logprobs`)."""
import asyncio
import collections

import openai
import pytest

import server_util

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    server_util.DEFAULT_MODEL = default_model
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with server_util.running(dserve_bin, default_model, "--served-model-name", "smollm2",
                             "--max-model-len", 1024, "--max-num-seqs", 16, "--threads", 2,
                             "--seed", 0, log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0,
                         timeout=300)


post = server_util.post_json


def token_id(server, text):
    """The id of the one token whose text is `text` (checked both ways)."""
    status, body = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200 and len(body["tokens"]) == 1, (text, body)
    status, back = post(server, "/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and back["prompt"] == text
    return body["tokens"][0]


def completion_tokens(client, **kw):
    """Each choice's generated tokens (as text) and logprobs object."""
    r = client.completions.create(model="smollm2", prompt=PROMPT, logprobs=1, **kw)
    return [(c.logprobs.tokens, c.logprobs) for c in r.choices]


def test_banned_token_never_appears_greedy(server, client):
    [(tokens, lp)] = completion_tokens(client, max_tokens=12, temperature=0)
    banned = tokens[0]  # " Paris"
    banned_id = token_id(server, banned)
    [(biased, blp)] = completion_tokens(client, max_tokens=12, temperature=0,
                                        extra_body={"logit_bias": {str(banned_id): -100}})
    assert banned not in biased, biased
    # The first position is scored before the bias, as vLLM's raw logprobs are: the
    # banned token is still the best alternative there, with its unbiased logprob.
    assert blp.top_logprobs[0][banned] == pytest.approx(lp.token_logprobs[0], abs=1e-4)
    assert blp.token_logprobs[0] < lp.token_logprobs[0]


def test_banned_token_never_appears_sampled(server, client):
    kw = dict(max_tokens=12, temperature=1.0, n=8, seed=11)
    unbiased = completion_tokens(client, **kw)
    # The token most choices contain (" Paris", "."...): it would otherwise appear.
    counts = collections.Counter(t for tokens, _ in unbiased for t in set(tokens))
    banned, n_choices = counts.most_common(1)[0]
    assert n_choices >= 3, counts
    banned_id = token_id(server, banned)
    biased = completion_tokens(client, **kw, extra_body={"logit_bias": {str(banned_id): -100}})
    for tokens, _ in biased:
        assert banned not in tokens, (banned, tokens)


def test_boosted_token_dominates_chat(server, client):
    boosted = " banana"
    boosted_id = token_id(server, boosted)
    for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 5}):
        r = client.chat.completions.create(
            model="smollm2", messages=CHAT, max_tokens=6, logprobs=True, **extra,
            extra_body={"logit_bias": {str(boosted_id): 100}, "ignore_eos": True})
        tokens = [e.token for e in r.choices[0].logprobs.content]
        assert tokens == [boosted] * 6, tokens
        assert r.choices[0].message.content == boosted * 6


def test_bias_is_per_request_in_a_batch(server):
    """Banned, boosted and unbiased requests decoded together: each gets what it gets alone."""
    boosted_id = token_id(server, " banana")
    paris_id = token_id(server, " Paris")
    requests = [{}, {"logit_bias": {str(paris_id): -100}}, {"logit_bias": {str(boosted_id): 100}}]

    async def run(bodies):
        c = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
        rs = await asyncio.gather(*[
            c.completions.create(model="smollm2", prompt=PROMPT, max_tokens=10, temperature=0,
                                 extra_body=b) for b in bodies])
        return [r.choices[0].text for r in rs]

    alone = [asyncio.run(run([b]))[0] for b in requests]
    together = asyncio.run(run(requests * 4))
    assert together == alone * 4
    assert alone[0].startswith(" Paris") and " Paris" not in alone[1]
    assert alone[2] == " banana" * 10


def test_bias_within_structured_output(server, client):
    """A bias picks among the tokens a constraint allows and never revives another."""
    kw = dict(model="smollm2", messages=CHAT, max_tokens=5, temperature=0)
    choices = ["Paris", "London"]
    first = client.chat.completions.create(**kw, extra_body={"guided_choice": choices})
    answer = first.choices[0].message.content
    assert answer in choices
    other = choices[1 - choices.index(answer)]
    # +100 on the other answer (one token) and on " banana", which the constraint
    # does not allow.
    bias = {str(token_id(server, other)): 100, str(token_id(server, " banana")): 100}
    r = client.chat.completions.create(**kw, extra_body={"guided_choice": choices,
                                                         "logit_bias": bias})
    assert r.choices[0].message.content == other


@pytest.mark.parametrize("bias,what", [
    ({"abc": 1}, "keys"),
    ({"-1": 1}, "keys"),
    ({"1.5": 1}, "keys"),
    ({"99999999999": 1}, "keys"),
    ({"49152": 1}, "vocabulary"),  # the default model's vocabulary is 49152 ids
    ({"5": 100.5}, "values"),
    ({"5": -101}, "values"),
    ({"5": "1"}, "values"),
    ({"5": None}, "values"),
    ([5], "object"),
    ("5:1", "object"),
])
def test_bad_logit_bias_is_a_400_naming_it(server, client, bias, what):
    for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})):
        status, got = post(server, path, {**body, "logit_bias": bias})
        assert status == 400, got
        assert got["error"]["param"] == "logit_bias" and what in got["error"]["message"], got
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="x", max_tokens=1,
                                  extra_body={"logit_bias": bias})
    assert "logit_bias" in str(e.value)


def test_edge_values_are_accepted(server, client):
    r = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=2, temperature=0,
                                  logit_bias={"0": -100, "49151": 100.0, "5": 0})
    assert r.choices[0].finish_reason == "length"
    r = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=2, temperature=0,
                                  logit_bias={})
    assert r.choices[0].text.startswith(" Paris")
