"""256 concurrent requests against a KV cache that holds a few of them.

`dserve serve` with 64 blocks of 16 tokens (room for four sequences of the 256-token
context) gets 256 requests at once through the openai SDK's AsyncOpenAI: completions,
streamed completions and chat completions, each asking for exactly MAX_TOKENS tokens
(vLLM's ignore_eos). The scheduler must preempt (vllm:num_preemptions rises) and
recompute, and every request must come back as the OpenAI API defines it: 200, finish
reason "length", MAX_TOKENS completion tokens. Greedy requests must give the text they
give alone, and afterwards every KV block is free and nothing runs or waits (/metrics).
"""
import asyncio

import openai

import server_util

N_REQUESTS = 256
MAX_TOKENS = 32
N_BLOCKS = 64
# SmolLM2-135M's float16 KV bytes per token: 30 layers x 3 KV heads x 64 x 2 (K and V)
# x 2 bytes; the start-up log's block count checks it.
BYTES_PER_TOKEN = 30 * 3 * 64 * 2 * 2


def metric(server, family, **labels) -> float:
    """A sample of a /metrics family (counters' families are named without _total)."""
    for sample in server.metrics()[family].samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    raise AssertionError(f"{family} {labels} not in /metrics")


async def one_request(client, model, i):
    """Request i (kinds in turn): (kind, finish reason, completion tokens, text)."""
    prompt = f"Request {i}: write about robot number {i} and its garden."
    common = dict(model=model, max_tokens=MAX_TOKENS, temperature=0 if i % 2 == 0 else 0.8,
                  seed=i, extra_body={"ignore_eos": True})
    kind = ("completion", "stream", "chat")[i % 3]
    if kind == "completion":
        r = await client.completions.create(prompt=prompt, **common)
        return kind, r.choices[0].finish_reason, r.usage.completion_tokens, r.choices[0].text
    if kind == "stream":
        stream = await client.completions.create(prompt=prompt, stream=True,
                                                 stream_options={"include_usage": True}, **common)
        text, finish, tokens = "", None, None
        async for chunk in stream:
            for c in chunk.choices:
                text += c.text
                finish = c.finish_reason or finish
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return kind, finish, tokens, text
    r = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}],
                                             **common)
    return kind, r.choices[0].finish_reason, r.usage.completion_tokens, r.choices[0].message.content


async def run_all(server):
    """The burst, the /metrics checks after it, then the greedy requests again alone."""
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0,
                                timeout=300)
    model = (await client.models.list()).data[0].id
    results = await asyncio.gather(*[one_request(client, model, i) for i in range(N_REQUESTS)])
    for i, (kind, finish, tokens, _) in enumerate(results):
        assert (finish, tokens) == ("length", MAX_TOKENS), f"request {i} ({kind})"
    assert metric(server, "vllm:num_preemptions") > 0, "nothing was preempted"
    assert metric(server, "vllm:request_success", finished_reason="length") == N_REQUESTS
    # Everything finished: every block is back, nothing runs or waits.
    assert metric(server, "vllm:kv_cache_usage_perc") == 0
    assert metric(server, "vllm:num_requests_running") == 0
    assert metric(server, "vllm:num_requests_waiting") == 0
    # Greedy requests give, after preemptions, the text they give alone.
    for i in (0, 4, 8, 12):
        kind, _, _, text = await one_request(client, model, i)
        assert text == results[i][3], f"request {i} ({kind}) differs from its run alone"
    await client.close()


def test_256_concurrent_requests_preempt_and_all_finish(dserve_bin, default_model, tmp_path):
    with server_util.running(dserve_bin, default_model, "--max-model-len", 256,
                             "--kv-cache-memory", N_BLOCKS * 16 * BYTES_PER_TOKEN,
                             "--log-level", "info", log_path=tmp_path / "serve.log") as server:
        assert f"KV cache: {N_BLOCKS} blocks of 16 tokens" in server.log()
        asyncio.run(run_all(server))
