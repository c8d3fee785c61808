"""Expert parallelism across data-parallel engines (`--data-parallel-size 2
--enable-expert-parallel`), "nodes" as processes on this machine over localhost: the
source document's two command lines (DeepSeek-R1, DP = 2, EP) on a tiny random
DeepSeek-V3 with R1's real tokenizer, F32, TP = 1, no --quantization; and a tiny
DeepSeek-V2 (softmax routing, two shared experts) with both engines in one process.

- Either start order, served through the openai SDK: requests land on both engines;
  greedy outputs equal a single-process server's (no DP, no EP) and transformers'
  greedy continuation, log-probabilities within 1e-3 of the single-process server's.
- Each engine holds only its experts: the load log line's counts, checked against the
  checkpoint's config.json (every routed expert held by exactly one engine).
- One engine idle while the other decodes a long request: the long request completes,
  and a request sent later (to the idle engine, the least loaded) is served meanwhile.
- A headless node started without --enable-expert-parallel: named, with the flag.
- The headless node killed mid-stream: the streams end with an error, /health turns
  503 and the API server exits with a message; the API server killed: the headless node
  exits within seconds. No process left behind.
- Engines that are themselves tensor-parallel (the source's DP 2 x TP 8 at DP 2 x TP 2,
  four processes on two nodes): the experts dealt over all four ranks, outputs equal the
  single-process server's, an idle engine does not stall the other, either node killed
  ends the other with no rank left running.
"""
import concurrent.futures
import json
import re
import shutil
import signal
import time

import pytest

import test_data_parallel as dp
import test_deepseek_reference as ds

EP = ["--enable-expert-parallel"]


@pytest.fixture(scope="module")
def r1():
    return ds._r1_fixture()


def _v2_fixture():
    """A tiny random DeepSeek-V2 (softmax routing, greedy top-4 of 16 experts, two shared
    experts, the first layer dense) with R1's tokenizer, so that the openai SDK's text
    completions carry its outputs; transformers' greedy continuation of R1's chat prompt
    is the reference."""
    transformers = ds.transformers
    tok_dir = ds._r1_tokenizer_dir()
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    case = dict(name="v2-r1-tokenizer", arch="v2", seed=22, hidden=64, layers=3, heads=2, ffn=128,
                moe_ffn=32, q_lora=None, kv_lora=32, nope=16, rope_dim=16, v=16, shared=2,
                rope=None, extra=dict(topk_method="greedy", routed_scaling_factor=1.0))

    def build(tmp):
        vocab, ds.VOCAB = ds.VOCAB, len(tok)
        try:
            model = ds._build_model(case)
        finally:
            ds.VOCAB = vocab
        model.save_pretrained(tmp)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tok_dir / f, tmp / f)
        ids = tok.apply_chat_template(ds.CHAT, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        ref = {"prompt": ids, "native": ds._reference(ds._load(tmp), ids)}
        ref["native"]["greedy_text"] = tok.decode(ref["native"]["greedy"], skip_special_tokens=True)
        (tmp / "reference.json").write_text(json.dumps(ref))
    return ds._cached("tiny-deepseek-v2-r1-tokenizer", ds._key(case, len(tok)), build)


@pytest.fixture(scope="module")
def v2():
    return _v2_fixture()


def held_experts(log, model_dir, size=2):
    """{rank: (first, last)} from the ranks' load lines; each of the `size` ranks must hold
    exactly its share of every MoE layer's routed experts as the checkpoint's config.json
    counts them."""
    config = json.loads((model_dir / "config.json").read_text())
    n_experts = config["n_routed_experts"]
    n_moe = config["num_hidden_layers"] - config["first_k_dense_replace"]
    got = {}
    for m in re.finditer(r"expert parallel rank (\d+)/(\d+) \(over data-parallel engines\): routed experts "
                         r"(\d+)-(\d+) of (\d+); holds (\d+) expert weight sets of (\d+)", log):
        rank, _, first, last, total, held, of = map(int, m.groups())
        assert (int(m.group(2)), total, of) == (size, n_experts, n_moe * n_experts), m.group(0)
        assert held == n_moe * (last - first + 1) == n_moe * n_experts // size, m.group(0)
        assert rank not in got, f"rank {rank} loaded twice"
        got[rank] = (first, last)
    assert sorted(got) == list(range(size)), log[-3000:]
    covered = sorted(e for first, last in got.values() for e in range(first, last + 1))
    assert covered == list(range(n_experts))
    return got


def serve_single(dserve_bin, model_dir, tmp_path, fn):
    """fn(port) on one process without data or expert parallelism: the reference."""
    port = dp.free_port()
    p = dp.Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port,
                 *dp.source_flags(dp.free_port(), dp=1)], tmp_path / "single.log")
    try:
        dp.wait_healthy(p, port)
        return fn(port)
    finally:
        p.proc.send_signal(signal.SIGTERM)
        p.wait(30)
        p.reap()


def complete_ids(port, prompt, max_tokens):
    """Greedy continuation of a prompt of token ids, as transformers' reference ran it
    (no end of sequence)."""
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    r = client.completions.create(model=client.models.list().data[0].id, prompt=prompt,
                                  max_tokens=max_tokens, temperature=0, logprobs=1,
                                  extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert r.usage.completion_tokens == max_tokens
    return {"text": c.text, "logprobs": c.logprobs.token_logprobs}


def assert_same(got, want, what):
    for g, w in zip(got, want):
        assert g["text"] == w["text"], what
        worst = max(abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"]))
        assert worst < 1e-3, f"{what}: log-probabilities differ by {worst:.2e}"


def assert_serves_like_one_process(port, want_texts, want_ids, ref, what):
    """The prompts' outputs, and the greedy reference prompt's ids and log-probabilities,
    equal the single-process server's; requests landed on both engines. Returns the
    finished requests per engine."""
    got = dp.complete_all(port, dp.PROMPTS)
    assert_same(got, want_texts, what)
    ids = complete_ids(port, ref["prompt"], ds.GEN_LEN)
    assert ids["text"] == want_ids["text"] == ref["native"]["greedy_text"]
    worst = max(abs(a - b) for a, b in zip(ids["logprobs"], want_ids["logprobs"]))
    assert worst < 1e-3, f"log-probabilities differ by {worst:.2e}"
    ok = dp.per_engine(dp.metrics(port), "vllm:request_success", finished_reason="length")
    assert ok.get("0", 0) > 0 and ok.get("1", 0) > 0, f"requests per engine: {ok}"
    return ok


@pytest.fixture(scope="module")
def r1_single(dserve_bin, r1, tmp_path_factory):
    model_dir, ref = r1
    return serve_single(dserve_bin, model_dir, tmp_path_factory.mktemp("r1_single"),
                        lambda port: (dp.complete_all(port, dp.PROMPTS),
                                      complete_ids(port, ref["prompt"], ds.GEN_LEN)))


@pytest.mark.parametrize("order", ["head-first", "headless-first"])
def test_source_command_lines_with_expert_parallel(order, dserve_bin, r1, r1_single, tmp_path):
    model_dir, ref = r1
    want_texts, want_ids = r1_single
    port, rpc = dp.free_port(), dp.free_port_run(2)  # rpc + 1: the expert-parallel group
    start_head = lambda: dp.head(dserve_bin, model_dir, port, rpc, tmp_path)  # noqa: E731
    start_node = lambda: dp.headless(dserve_bin, model_dir, rpc, tmp_path)  # noqa: E731
    # The source command lines carry --enable-expert-parallel: add it to both.
    dp_flags = dp.source_flags
    dp.source_flags = lambda *a, **k: dp_flags(*a, **k) + EP
    try:
        procs = [start_head(), start_node()] if order == "head-first" else [start_node(), start_head()]
    finally:
        dp.source_flags = dp_flags
    h, node = (procs[0], procs[1]) if order == "head-first" else (procs[1], procs[0])
    try:
        dp.wait_healthy(h, port)
        assert_serves_like_one_process(port, want_texts, want_ids, ref, order)
        held_experts(h.log() + node.log(), model_dir)
        h.proc.send_signal(signal.SIGTERM)
        assert h.wait(30) == 0, h.log()[-2000:]
        assert node.wait(15) == 0, node.log()[-2000:]
    finally:
        assert all(p.reap() for p in procs), "a process was left running"


def teacher_forced(port, ids):
    """Each position's log-probability of the next of `ids` (vLLM's prompt_logprobs)."""
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    r = client.completions.create(model=client.models.list().data[0].id, prompt=ids, max_tokens=1,
                                  temperature=0, extra_body={"prompt_logprobs": 0})
    pl = r.choices[0].prompt_logprobs
    return [pl[k][str(ids[k])]["logprob"] for k in range(1, len(ids))]


# bfloat16 rows (each rounded going out and coming back) against the float32 engine, on
# the same tokens (measured: worst 0.0010 on the tiny V2).
BF16_WIRE_TOLERANCE = 0.01


@pytest.mark.parametrize("wire", ["float32", "bfloat16"])
def test_v2_both_engines_in_one_process(wire, dserve_bin, v2, tmp_path):
    """DeepSeek-V2 (softmax routing, greedy top-k, two shared experts): both engines and
    their expert-parallel ranks in one process; against transformers and one engine. With
    --expert-dispatch-dtype bfloat16 the rows travel at 2 bytes an element (the log's
    traffic counts: dispatch 4 + 2 hidden bytes a row, combine 2 hidden) and the
    log-probabilities of the reference tokens stay within bfloat16's rounding."""
    model_dir, ref = v2
    prompt = ref["prompt"]
    forced = prompt + ref["native"]["greedy"]
    single = serve_single(dserve_bin, model_dir, tmp_path,
                          lambda port: (complete_ids(port, prompt, ds.GEN_LEN), teacher_forced(port, forced)))
    assert single[0]["text"] == ref["native"]["greedy_text"]
    port = dp.free_port()
    flags = dp.source_flags(dp.free_port_run(2))  # rpc + 1: the expert-parallel group
    i = flags.index("--data-parallel-size-local")
    del flags[i:i + 2]  # default: every engine here
    p = dp.Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags, *EP,
                 "--expert-dispatch-dtype", wire, "--log-level", "info"], tmp_path / "one-node.log")
    try:
        dp.wait_healthy(p, port)
        held_experts(p.log(), model_dir)
        if wire == "float32":
            # Two requests at once, so that both engines step with tokens of their own.
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                outs = list(pool.map(lambda _: complete_ids(port, prompt, ds.GEN_LEN), range(2)))
            for got in outs:
                assert got["text"] == ref["native"]["greedy_text"]
                worst = max(abs(a - b) for a, b in zip(got["logprobs"], single[0]["logprobs"]))
                assert worst < 1e-3, f"log-probabilities differ by {worst:.2e}"
            ok = dp.per_engine(dp.metrics(port), "vllm:request_success", finished_reason="length")
            assert ok.get("0", 0) == 1 and ok.get("1", 0) == 1, ok
        else:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                outs = list(pool.map(lambda _: teacher_forced(port, forced), range(2)))
            for got in outs:
                worst = max(abs(a - b) for a, b in zip(got, single[1]))
                print(f"bfloat16 rows: worst log-probability difference {worst:.4f}")
                assert 0 < worst < BF16_WIRE_TOLERANCE, worst
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, p.log()[-2000:]
        log = p.log()
    finally:
        assert p.reap()
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    elem = 2 if wire == "bfloat16" else 4
    assert f"rows exchanged as {wire}" in log
    stats = re.findall(r"expert parallel: (\d+) exchanges, (\d+) rows sent and (\d+) received from other "
                       r"ranks \((\d+) / (\d+) bytes\)", log)
    assert len(stats) == 2, log[-3000:]
    for _, sent, received, bytes_sent, _ in stats:
        sent, received = int(sent), int(received)
        assert sent > 0 and int(bytes_sent) == sent * (4 + elem * hidden) + received * elem * hidden


def test_idle_engine_does_not_stall_the_other(dserve_bin, r1, tmp_path):
    import openai
    model_dir, _ = r1
    port, rpc = dp.free_port(), dp.free_port_run(2)  # rpc + 1: the expert-parallel group
    flags = dp.source_flags(rpc)
    i = flags.index("--data-parallel-size-local")
    del flags[i:i + 2]
    p = dp.Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags, *EP],
                tmp_path / "one-node.log")
    try:
        dp.wait_healthy(p, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        first_chunk = concurrent.futures.Future()

        def long_stream():
            n = 0
            for chunk in client.completions.create(model=model, prompt=dp.PROMPTS[0], max_tokens=200,
                                                   temperature=0, stream=True,
                                                   extra_body={"ignore_eos": True}):
                n += 1
                if n == 1:
                    first_chunk.set_result(time.monotonic())
                if chunk.choices and chunk.choices[0].finish_reason:
                    return chunk.choices[0].finish_reason
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long = pool.submit(long_stream)
            first_chunk.result(timeout=60)
            # Engine 0 decodes the long request; engine 1 has nothing (its dummy
            # forwards keep engine 0 going). A request now goes to engine 1.
            short = client.completions.create(model=model, prompt=dp.PROMPTS[1], max_tokens=8,
                                              temperature=0)
            assert short.choices[0].finish_reason == "length"
            assert not long.done(), "the long request ended before the short one was served"
            assert long.result(timeout=120) == "length"
        ok = dp.per_engine(dp.metrics(port), "vllm:request_success", finished_reason="length")
        assert ok == {"0": 1, "1": 1}, ok
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, p.log()[-2000:]
    finally:
        assert p.reap()


def test_killed_headless_node_stops_the_group(dserve_bin, r1, tmp_path):
    import openai
    model_dir, _ = r1
    port, rpc = dp.free_port(), dp.free_port_run(2)  # rpc + 1: the expert-parallel group
    dp_flags = dp.source_flags
    dp.source_flags = lambda *a, **k: dp_flags(*a, **k) + EP
    try:
        h = dp.head(dserve_bin, model_dir, port, rpc, tmp_path)
        node = dp.headless(dserve_bin, model_dir, rpc, tmp_path)
    finally:
        dp.source_flags = dp_flags
    try:
        dp.wait_healthy(h, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        started = concurrent.futures.Future()
        n_started = [0]

        def stream(i):
            try:
                for n, _ in enumerate(client.completions.create(
                        model=model, prompt=dp.PROMPTS[i], max_tokens=230, temperature=0, stream=True,
                        extra_body={"ignore_eos": True})):
                    if n == 0:
                        n_started[0] += 1
                        if n_started[0] == 2:
                            started.set_result(True)
                return "done"
            except openai.APIError as e:
                return f"error: {e}"
        health = []

        def watch_health():  # until the API server exits
            while h.proc.poll() is None:
                try:
                    health.append(dp.get(port, "/health", timeout=1)[0])
                except OSError:
                    pass
                time.sleep(0.05)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(stream, i) for i in range(2)]
            started.result(timeout=60)
            watcher = pool.submit(watch_health)
            node.proc.kill()  # the headless node dies mid-stream
            t0 = time.monotonic()
            outcomes = [f.result(timeout=30) for f in futures]
            assert time.monotonic() - t0 < 15
            # Both streams end with an error: the API server's engine cannot step without
            # the dead node's experts.
            assert [o.split(":")[0] for o in outcomes] == ["error", "error"], outcomes
            assert h.wait(15) != 0
            watcher.result(timeout=5)
        assert 503 in health, health
        assert "the engine failed" in h.log()
    finally:
        node.reap()
        h.reap()

    # The API server's node killed: the headless node exits within seconds.
    port, rpc = dp.free_port(), dp.free_port_run(2)  # rpc + 1: the expert-parallel group
    dp.source_flags = lambda *a, **k: dp_flags(*a, **k) + EP
    try:
        h = dp.head(dserve_bin, model_dir, port, rpc, tmp_path)
        node = dp.headless(dserve_bin, model_dir, rpc, tmp_path, name="node1-again")
    finally:
        dp.source_flags = dp_flags
    try:
        dp.wait_healthy(h, port)
        h.proc.kill()
        t0 = time.monotonic()
        assert node.wait(15) != 0
        assert time.monotonic() - t0 < 10
    finally:
        assert node.reap()
        h.reap()


def test_node_without_expert_parallel_is_named(dserve_bin, r1, tmp_path):
    """The API server's node with --enable-expert-parallel, the headless node without:
    the group's rendezvous names the engine that never joined and the flag; both exit."""
    model_dir, _ = r1
    port, rpc = dp.free_port(), dp.free_port_run(2)  # rpc + 1: the expert-parallel group
    dp_flags = dp.source_flags
    dp.source_flags = lambda *a, **k: dp_flags(*a, **k) + EP
    try:
        h = dp.head(dserve_bin, model_dir, port, rpc, tmp_path, timeout=4)
    finally:
        dp.source_flags = dp_flags
    node = dp.headless(dserve_bin, model_dir, rpc, tmp_path, timeout=4)
    try:
        dp.expect_failure(h, "rank(s) 1 of 2 did not join the rendezvous")
        assert "every node needs --enable-expert-parallel" in h.log()
        dp.expect_failure(node, "no answer from the API server")
    finally:
        h.reap()
        node.reap()


def test_tensor_parallel_engines(dserve_bin, r1, r1_single, tmp_path):
    """The source document's full command lines (DP 2 x TP 8 with --enable-expert-parallel)
    at DP 2 x TP 2: two nodes, four processes. The 16 routed experts are dealt over all
    four ranks (4 each, every one held once); outputs equal the single-process server's;
    one engine decoding while the other has nothing is not stalled; the headless node
    killed mid-stream ends the API server, the API server's node killed ends the headless
    one, and no rank of either node is left."""
    import openai
    model_dir, ref = r1
    want_texts, want_ids = r1_single
    def start(name):
        # The expert-parallel groups meet at rpc + 1 and + 2; engine d's tensor-parallel
        # group at master + d.
        port, rpc, master = dp.free_port(), dp.free_port_run(3), dp.free_port_run(2)
        flags = dp.source_flags(rpc)
        i = flags.index("--tensor-parallel-size")
        del flags[i:i + 2]
        flags += ["--tensor-parallel-size", 2, "--master-port", master, *EP]
        h = dp.Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags],
                    tmp_path / f"head{name}.log")
        node = dp.Proc([dserve_bin, "serve", model_dir, *flags, "--headless", "--data-parallel-start-rank", 1],
                       tmp_path / f"node1{name}.log")
        return port, master, h, node

    port, master, h, node = start("")
    procs = [h, node]
    try:
        dp.wait_healthy(h, port)
        assert len(dp.processes_with(f"--master-port {master}")) == 4
        held_experts(h.log() + node.log(), model_dir, size=4)

        ok = assert_serves_like_one_process(port, want_texts, want_ids, ref,
                                            "DP 2 x TP 2 with expert parallelism")

        # One engine decodes a long request while the other has nothing (its ranks run
        # idle forwards); a request sent meanwhile goes to the idle one and is served.
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        first_chunk = concurrent.futures.Future()

        def long_stream():
            try:
                for n, chunk in enumerate(client.completions.create(
                        model=model, prompt=dp.PROMPTS[0], max_tokens=230, temperature=0, stream=True,
                        extra_body={"ignore_eos": True})):
                    if n == 0:
                        first_chunk.set_result(True)
                    if chunk.choices and chunk.choices[0].finish_reason:
                        return chunk.choices[0].finish_reason
                return "no finish reason"
            except openai.APIError as e:
                return f"error: {e}"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long = pool.submit(long_stream)
            first_chunk.result(timeout=60)
            short = client.completions.create(model=model, prompt=dp.PROMPTS[1], max_tokens=8, temperature=0)
            assert short.choices[0].finish_reason == "length"
            assert not long.done(), "the long request ended before the short one was served"
            families = dp.metrics(port)
            after = dp.per_engine(families, "vllm:request_success", finished_reason="length")
            served = [e for e in after if after[e] != ok.get(e, 0)]
            running = dp.per_engine(families, "vllm:num_requests_running")
            assert len(served) == 1 and running.get(served[0]) == 0, (after, ok, running)
            assert sum(running.values()) == 1, running  # the long one, on the other engine

            # The headless node dies mid-stream: the API server cannot step without its
            # experts, so the stream ends with an error and the API server exits.
            node.proc.kill()
            assert long.result(timeout=30).startswith("error"), long.result()
        assert h.wait(20) != 0
        assert "the engine failed" in h.log()
        deadline = time.monotonic() + 10
        while dp.processes_with(f"--master-port {master}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dp.processes_with(f"--master-port {master}") == [], "a tensor-parallel rank was left running"
    finally:
        for p in procs:
            p.reap()

    # The API server's node killed: the headless node's engine fails its next lockstep
    # round and the node exits within seconds, its second rank with it.
    port, master, h, node = start("-again")
    try:
        dp.wait_healthy(h, port)
        h.proc.kill()
        t0 = time.monotonic()
        assert node.wait(15) != 0
        assert time.monotonic() - t0 < 10
        deadline = time.monotonic() + 10
        while dp.processes_with(f"--master-port {master}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dp.processes_with(f"--master-port {master}") == [], "a tensor-parallel rank was left running"
    finally:
        assert node.reap()
        h.reap()


def test_v2_speculative_drafts_in_lockstep(dserve_bin, v2, tmp_path):
    """Both engines of an expert-parallel group in one process with prompt-lookup
    drafts: a prompt that repeats a passage (drafts, some accepted) beside one that does
    not, at once, so that a step verifies drafts on one engine and none on the other;
    the outputs equal one engine's without speculation."""
    model_dir, ref = v2
    passage = ref["prompt"][:12]
    prompts = [passage * 4, ref["prompt"]]
    single = serve_single(dserve_bin, model_dir, tmp_path,
                          lambda port: [complete_ids(port, q, ds.GEN_LEN) for q in prompts])
    port = dp.free_port()
    flags = dp.source_flags(dp.free_port_run(2))
    i = flags.index("--data-parallel-size-local")
    del flags[i:i + 2]
    ngram = ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, '
             '"prompt_lookup_max": 3}')
    p = dp.Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags,
                 *EP, "--speculative-config", ngram], tmp_path / "spec.log")
    try:
        dp.wait_healthy(p, port)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(lambda q: complete_ids(port, q, ds.GEN_LEN), prompts))
        assert_same(outs, single, "speculative decoding in lockstep")
        drafts = dp.per_engine(dp.metrics(port), "vllm:spec_decode_num_draft_tokens")
        assert sum(drafts.values()) > 0, drafts
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, p.log()[-2000:]
    finally:
        assert p.reap()
