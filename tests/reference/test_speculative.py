"""Speculative decoding (--speculative-config) against decoding without it.

Drafts are verified losslessly: each emitted token is the one the request would have
produced without drafts (the engine samples every verified position with the request's
own random stream, and a one-token draft is accepted when that sample equals it, which
is the rejection rule of speculative sampling for a one-hot proposal). So runs with and
without speculation must agree token for token, greedy or seeded-sampled, batched,
preempted, constrained or streamed. References we did not write: the engine run
without speculation, scipy's chi-square test, the openai SDK, jsonschema and
prometheus_client's parser.

engine_tool (tests/unit/engine/engine_tool.cc) runs requests through one LlmEngine with
and without --speculative-config; the servers run `dserve serve` on the default model.
"""
import asyncio
import json
import random
import time

import jsonschema
import openai
import pytest
import scipy.stats

import server_util
from conftest import run

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                    "prompt_lookup_min": 1, "prompt_lookup_max": 4})
THREADS = ["--threads", 2]


def _engine(test_tool, model, tmp_path, requests, *args):
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests))
    r = run([test_tool("engine_tool"), "--model", model, "--requests", path, *THREADS, *args])
    return json.loads(r.stdout)


def _repeating_prompt(rng, vocab, n_passage, n_repeats):
    """A random passage said n_repeats times, then its first half again: a model that
    has learnt to copy continues the passage, which prompt lookup proposes."""
    passage = [rng.randrange(10, vocab) for _ in range(n_passage)]
    return passage * n_repeats + passage[: n_passage // 2]


def _requests(vocab, n=32, seed=11):
    rng = random.Random(seed)
    return [{"prompt": _repeating_prompt(rng, vocab, rng.randrange(8, 40), rng.randrange(1, 4)),
             "max_tokens": rng.randrange(8, 48)} for _ in range(n)]


@pytest.fixture(scope="module")
def tiny_llama():
    from test_llama_reference import VOCAB, tiny_checkpoint
    return tiny_checkpoint("llama-f32-untied"), VOCAB


@pytest.fixture(params=["default", "tiny-llama"])
def engine_model(request, default_model, tiny_llama):
    if request.param == "default":
        return default_model, 49152
    return tiny_llama


def _acceptance(stats):
    return stats["spec_n_accepted_tokens"] / max(1, stats["spec_n_draft_tokens"])


def test_ngram_greedy_batch_equals_no_speculation(engine_model, test_tool, tmp_path):
    """32 requests batched (chunked prefill beside verify steps), with prompt-lookup
    drafts, against the same batch without drafts and each request alone."""
    model, vocab = engine_model
    reqs = _requests(vocab)
    batch = ["--mode", "batch", "--max-num-batched-tokens", 256]
    plain = _engine(test_tool, model, tmp_path, reqs, *batch)
    spec = _engine(test_tool, model, tmp_path, reqs, *batch, "--speculative-config", NGRAM)
    alone = _engine(test_tool, model, tmp_path, reqs, "--mode", "sequential",
                    "--no-enable-prefix-caching")
    assert plain["outputs"] == alone["outputs"]
    for i, (got, want) in enumerate(zip(spec["outputs"], plain["outputs"])):
        assert got == want, f"request {i} differs with speculation"
    s = spec["stats"]
    assert s["n_free_blocks"] == s["n_blocks"]  # rejected drafts leave no block behind
    assert s["spec_n_drafts"] > 0 and s["spec_n_accepted_tokens"] > 0
    assert s["spec_n_accepted_tokens"] == sum(s["spec_n_accepted_per_pos"])
    print(f"acceptance {_acceptance(s):.2f}, steps {s['n_steps']} vs {plain['stats']['n_steps']}")
    if vocab == 49152:
        # The real model copies the repeated passage: most drafts are accepted, and
        # accepted drafts are tokens generated without a forward pass of their own. (The
        # tiny model's random weights copy nothing: there most drafts are rejected,
        # which exercises the other path.)
        assert _acceptance(s) > 0.5
        assert s["n_steps"] < plain["stats"]["n_steps"]


def test_ngram_with_preemption_equals_no_speculation(default_model, test_tool, tmp_path):
    """A pool too small for the batch: drafts are dropped before anyone is preempted,
    preempted requests recompute, and outputs still equal the plain run."""
    reqs = _requests(49152, n=24, seed=5)
    args = ["--mode", "batch", "--max-num-batched-tokens", 128, "--num-blocks", 24]
    plain = _engine(test_tool, default_model, tmp_path, reqs, *args)
    spec = _engine(test_tool, default_model, tmp_path, reqs, *args, "--speculative-config", NGRAM)
    assert spec["stats"]["n_preemptions"] > 0
    assert spec["outputs"] == plain["outputs"]
    assert spec["stats"]["n_free_blocks"] == spec["stats"]["n_blocks"] == 24


def _pooled_chi_square(a, b):
    """p-value of chi-square homogeneity of two samples of tokens; categories expected
    fewer than 5 times pooled into one."""
    cats = sorted(set(a) | set(b))
    ca = [a.count(c) for c in cats]
    cb = [b.count(c) for c in cats]
    big = [i for i in range(len(cats)) if ca[i] + cb[i] >= 10]
    rest_a = sum(ca) - sum(ca[i] for i in big)
    rest_b = sum(cb) - sum(cb[i] for i in big)
    table = [[ca[i] for i in big] + [rest_a], [cb[i] for i in big] + [rest_b]]
    table = [[x for x, y in zip(*table) if x + y > 0]] + [[y for x, y in zip(*table) if x + y > 0]]
    return scipy.stats.chi2_contingency(table).pvalue


@pytest.mark.parametrize("which", ["default", "tiny-llama"])
def test_sampled_first_three_tokens_agree(which, default_model, tiny_llama, test_tool, tmp_path):
    """Temperature 1 over 2,000 seeds, one prompt that repeats a passage: the first
    three generated tokens are distributed alike with and without speculation (a
    chi-square test at significance 0.001 per position), and, since verification draws
    each position with the request's own random stream, equal seed for seed."""
    model, vocab = (default_model, 49152) if which == "default" else tiny_llama
    prompt = _repeating_prompt(random.Random(2), vocab, 24, 3)
    reqs = [{"prompt": prompt, "max_tokens": 3, "temperature": 1.0, "seed": s}
            for s in range(2000)]
    args = ["--mode", "batch", "--max-num-seqs", 256]
    plain = _engine(test_tool, model, tmp_path, reqs, *args)
    spec = _engine(test_tool, model, tmp_path, reqs, *args, "--speculative-config", NGRAM)
    assert spec["stats"]["spec_n_drafts"] > 0
    for pos in range(3):
        a = [o[pos] for o in plain["outputs"]]
        b = [o[pos] for o in spec["outputs"]]
        assert len(set(a)) > 1, "temperature 1 should vary the tokens"
        assert _pooled_chi_square(a, b) > 0.001, f"position {pos}"
    assert spec["outputs"] == plain["outputs"]
    assert spec["stats"]["n_free_blocks"] == spec["stats"]["n_blocks"]


def test_bad_speculative_configs_are_one_clear_error(dserve_bin, default_model, tmp_path):
    cases = [('{"method": "medusa", "num_speculative_tokens": 2}', 'unknown method "medusa"'),
             ('{"method": "ngram", "num_speculative_tokens": 40}', "outside [1, 16]"),
             ('{"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"}',
              'unknown key "draft_model"'),
             ('{"method": "deepseek_mtp", "num_speculative_tokens": 2}',
              "multi-token-prediction layer"),
             ("ngram", "JSON object")]
    for config, want in cases:
        r = run([dserve_bin, "serve", default_model, "--port", server_util.free_port(),
                 "--speculative-config", config], check=False, timeout=120)
        assert r.returncode != 0, config
        assert want in r.stderr, (config, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and "terminate" not in r.stderr


# Through `dserve serve`: one server with prompt-lookup drafts, one without.
COPY_PROMPTS = [
    "Repeat the following sentence exactly, twice: The quick brown fox jumps over the "
    "lazy dog near the quiet river bank.",
    "Rewrite this list in the same order, one item per line: apples, pears, plums, "
    "cherries, grapes, lemons, limes, oranges.",
    "def add(a, b):\n    return a + b\n\nRename the function above to plus and show "
    "the whole code again.",
]


@pytest.fixture(scope="module")
def servers(dserve_bin, default_model, tmp_path_factory):
    from test_structured_output import served_name
    common = ["--max-model-len", 2048, "--served-model-name", served_name(),
              "--max-num-seqs", 64, "--threads", 2, "--seed", 0]
    d = tmp_path_factory.mktemp("spec")
    with server_util.running(dserve_bin, default_model, *common, log_path=d / "plain.log") as a, \
            server_util.running(dserve_bin, default_model, *common, "--speculative-config",
                                NGRAM, "--log-stats-interval", 0.5,
                                log_path=d / "spec.log") as b:
        yield a, b


def _client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0,
                         timeout=300)


def _chat(server, stream, **kw):
    c = _client(server)
    model = c.models.list().data[0].id
    if not stream:
        r = c.chat.completions.create(model=model, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens
    text, finish, usage = "", None, None
    for chunk in c.chat.completions.create(model=model, stream=True,
                                           stream_options={"include_usage": True}, **kw):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
        usage = chunk.usage or usage
    return text, finish, usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_server_answers_equal_with_and_without(servers, stream):
    """Greedy and seeded temperature 0.8, with a stop string, through the openai SDK."""
    plain, spec = servers
    for i, prompt in enumerate(COPY_PROMPTS):
        for kw in ({"temperature": 0}, {"temperature": 0.8, "seed": 7 + i},
                   {"temperature": 0, "stop": ["lazy", "plums", "plus("]}):
            args = dict(messages=[{"role": "user", "content": prompt}], max_tokens=96, **kw)
            want = _chat(plain, stream, **args)
            got = _chat(spec, stream, **args)
            assert got == want, (prompt, kw)


def test_structured_output_under_speculation(servers):
    """The structured-output tests' ten schemas, seeded at temperature 1: the same JSON
    with and without drafts, and valid (jsonschema)."""
    from test_structured_output import MAX_TOKENS, MODELS, messages
    plain, spec = servers

    async def one(server, model, seed):
        c = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0,
                               timeout=600)
        name = (await c.models.list()).data[0].id
        r = await c.chat.completions.create(
            model=name, messages=messages(model), temperature=1, seed=seed,
            max_tokens=MAX_TOKENS,
            response_format={"type": "json_schema",
                             "json_schema": {"name": model.__name__, "strict": True,
                                             "schema": model.model_json_schema()}})
        await c.close()
        return r.choices[0]

    async def both():
        jobs = [one(s, m, 300 + k) for s in (plain, spec) for k, m in enumerate(MODELS)]
        return await asyncio.gather(*jobs)

    results = asyncio.run(both())
    want, got = results[:len(MODELS)], results[len(MODELS):]
    for model, w, g in zip(MODELS, want, got):
        assert g.message.content == w.message.content, model.__name__
        assert g.finish_reason == "stop", model.__name__
        jsonschema.validate(json.loads(g.message.content), model.model_json_schema())


def _counter(metrics, name, **labels):
    total = 0.0
    for s in metrics[name].samples:
        if s.name == name + "_total" and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def test_spec_decode_metrics_count_what_the_responses_show(servers):
    """Streamed chat completions with logprobs: each chunk carries one engine step's tokens,
    so a chunk of m tokens is m - 1 accepted drafts (and accepted drafts at positions
    1..m-1). /metrics' vllm:spec_decode_* counters must move by exactly that.
    (ignore_eos: a stop token's log-probability is not shown, so a step ending in one
    would hide a token.)"""
    _, spec = servers
    c = _client(spec)
    model = c.models.list().data[0].id
    before = spec.metrics()
    accepted, per_pos, steps = 0, [0] * 4, 0
    for prompt in COPY_PROMPTS:
        for chunk in c.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=64,
                temperature=0, logprobs=True, stream=True, extra_body={"ignore_eos": True}):
            for ch in chunk.choices:
                m = len(ch.logprobs.content or []) if ch.logprobs else 0
                if m == 0:
                    continue
                steps += 1
                accepted += m - 1
                for k in range(m - 1):
                    per_pos[k] += 1
    # The engine publishes a step's counters just after its outputs: wait for the
    # figures of the step that ended the last request.
    deadline = time.monotonic() + 10
    while True:
        after = spec.metrics()
        running = sum(x.value for x in after["vllm:num_requests_running"].samples)
        if running == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    def moved(name, **labels):
        return _counter(after, name, **labels) - _counter(before, name, **labels)

    assert accepted > 0
    assert moved("vllm:spec_decode_num_accepted_tokens") == accepted
    for k in range(4):
        assert moved("vllm:spec_decode_num_accepted_tokens_per_pos", position=str(k)) == per_pos[k]
    drafts = moved("vllm:spec_decode_num_drafts")
    assert per_pos[0] <= drafts <= steps - len(COPY_PROMPTS)  # no drafts before the first token
    assert accepted <= moved("vllm:spec_decode_num_draft_tokens") <= 4 * drafts
    usage = after["vllm:kv_cache_usage_perc"].samples
    assert all(s.value == 0 for s in usage)  # every block back in the pool
    # The periodic log line reports the acceptance, as vLLM's does.
    deadline = time.monotonic() + 5
    while "SpecDecoding metrics: Mean acceptance length:" not in spec.log():
        assert time.monotonic() < deadline, spec.log()[-3000:]
        time.sleep(0.1)
    assert "Avg generation throughput:" in spec.log()


def test_bench_serve_reports_the_acceptance(servers, dserve_bin, default_model, tmp_path):
    """`dserve bench serve` prints vLLM's Speculative Decoding section; its acceptance
    length is 1 + accepted drafts per draft over the run, as /metrics counted them."""
    from test_bench_serve import run_bench
    _, spec = servers
    data = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": p}]}
            for p in COPY_PROMPTS * 4]
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(data))
    before = spec.metrics()
    res, proc = run_bench(dserve_bin, spec.base_url, tmp_path, "--dataset-name", "sharegpt",
                          "--dataset-path", path, "--num-prompts", len(data),
                          "--max-concurrency", 4, "--ignore-eos", "--sharegpt-output-len", 48,
                          tokenizer=default_model)
    time.sleep(0.3)  # the counters follow the engine's last step
    after = spec.metrics()
    drafts = _counter(after, "vllm:spec_decode_num_drafts") - _counter(before, "vllm:spec_decode_num_drafts")
    accepted = (_counter(after, "vllm:spec_decode_num_accepted_tokens")
                - _counter(before, "vllm:spec_decode_num_accepted_tokens"))
    assert res["completed"] == len(data) and drafts > 0
    assert res["spec_decode_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert "Speculative Decoding" in proc.stdout
    assert f"{1 + accepted / drafts:.2f}" in proc.stdout
