"""Data parallelism across "nodes" (processes on this machine over localhost, ZeroMQ):
the source document's two command lines (DeepSeek-R1 on two machines, DP = 2) on a tiny
random DeepSeek-V3 with R1's real tokenizer and chat template, F32, TP = 1, without
--quantization and --enable-expert-parallel.

- Either start order: both nodes come up and serve through the openai SDK; requests
  land on both engines (per-engine counters in /metrics, read with prometheus_client's
  parser, adding up to the usage the responses report); greedy outputs equal a
  single-process server's, log-probabilities within 1e-3.
- Faults: the headless node killed mid-stream (its streams end with an error, new
  requests go to the survivor, /health stays 200); the API server's node killed (the
  headless node exits within seconds); a rank that never arrives (named after
  --distributed-timeout); no process left behind.
- Bad input: flags that disagree between nodes, overlapping ranks, --headless without
  --data-parallel-address, invalid --additional-config: one clear error each. (Expert parallelism across the engines:
  test_expert_parallel.py.)
- Engines that are themselves tensor-parallel: the source command lines at DP 2 x TP 2
  (four processes: each node's engine starts its second rank) serve like one process,
  and every process ends at shutdown.

The source's --gpu-memory-utilization 0.9 would give the KV cache 90% of this shared
machine's memory on the CPU backend: the tests give it a fixed --kv-cache-memory
instead; --max-model-len is the tiny model's 256 instead of 8192.
"""
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import time
import urllib.request

import pytest

import test_deepseek_reference as ds
from server_util import free_port, free_port_run

ADDITIONAL = '{"ascend_scheduler_config":{"enabled":false},"torchair_graph_config":{"enabled":true}}'
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,",
           "DeepSeek-R1 is", "A haiku about the sea:", "def fib(n):", "Hello", "Why is the sky"]


@pytest.fixture(scope="module")
def model_dir():
    d, _ = ds._r1_fixture()
    return d


def source_flags(rpc_port, dp=2, block_size=128, timeout=60):
    """The source command line, as far as it applies on this machine."""
    return ["--trust-remote-code", "--kv-cache-memory", 64 << 20, "--no-enable-prefix-caching",
            "--max-model-len", 256, "--max-num-batched-tokens", 8192, "--max-num-seqs", 256,
            "--data-parallel-size", dp, "--data-parallel-size-local", 1,
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", rpc_port,
            "--tensor-parallel-size", 1, "--block-size", block_size, "--seed", 1024,
            "--additional-config", ADDITIONAL, "--threads", 1, "--distributed-timeout", timeout]


class Proc:
    def __init__(self, args, log_path):
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        self.proc = subprocess.Popen([str(a) for a in args], stdout=self.log_file,
                                     stderr=subprocess.STDOUT)

    def log(self):
        return open(self.log_path, errors="replace").read()

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"did not exit within {timeout} s:\n{self.log()[-3000:]}")

    def reap(self):
        """Kills it if it still runs; True when it had already exited."""
        done = self.proc.poll() is not None
        if not done:
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()
        return done


def head(dserve_bin, model_dir, port, rpc_port, tmp_path, **flags):
    return Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port,
                 *source_flags(rpc_port, **flags)], tmp_path / "head.log")


def headless(dserve_bin, model_dir, rpc_port, tmp_path, start_rank=1, name="node1", **flags):
    return Proc([dserve_bin, "serve", model_dir, *source_flags(rpc_port, **flags), "--headless",
                 "--data-parallel-start-rank", start_rank], tmp_path / f"{name}.log")


def get(port, path, timeout=5):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_healthy(proc, port, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, f"exited {proc.proc.returncode}:\n{proc.log()[-3000:]}"
        try:
            if get(port, "/health", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"not healthy within {timeout} s:\n{proc.log()[-3000:]}")


def metrics(port):
    from prometheus_client.parser import text_string_to_metric_families
    status, body = get(port, "/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def per_engine(families, name, **labels):
    out = {}
    for s in families[name].samples:
        if s.name.endswith("_created") or not all(s.labels.get(k) == v for k, v in labels.items()):
            continue
        out[s.labels["engine"]] = out.get(s.labels["engine"], 0) + s.value
    return out


def complete_all(port, prompts):
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)

    def one(p):
        r = client.completions.create(model=client.models.list().data[0].id, prompt=p,
                                      max_tokens=12, temperature=0, logprobs=1)
        c = r.choices[0]
        return {"text": c.text, "logprobs": c.logprobs.token_logprobs,
                "tokens": r.usage.completion_tokens}
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


CONSTRAINED = [
    {"guided_choice": ["alpha", "beta", "gamma ray"]},
    {"guided_regex": r"[a-z]{1,8}( [a-z]{1,8}){0,3}"},
    {"guided_json": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99}, "w": {"enum": ["x", "y"]}},
        "required": ["n", "w"]}},
    {"response_format": {"type": "json_object"}},
]


def constrained_all(port):
    """Structured-output requests (the spec crosses to the engines as text, each engine
    compiles it): every output must satisfy its constraint."""
    import jsonschema
    import openai
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    model = client.models.list().data[0].id
    jobs = [(p, c) for p in PROMPTS[:4] for c in CONSTRAINED]

    def one(job):
        p, c = job
        r = client.completions.create(model=model, prompt=p, max_tokens=40, temperature=0,
                                      extra_body=c)
        text, reason = r.choices[0].text, r.choices[0].finish_reason
        if "guided_choice" in c:
            assert text in c["guided_choice"], text
        elif "guided_regex" in c:
            assert re.fullmatch(c["guided_regex"], text), text
        elif reason == "stop":
            value = json.loads(text)
            if "guided_json" in c:
                jsonschema.validate(value, c["guided_json"])
            assert isinstance(value, dict)
        return text
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(one, jobs))


@pytest.fixture(scope="module")
def single_constrained(dserve_bin, model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single_constrained")
    port = free_port()
    p = Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port,
              *source_flags(free_port(), dp=1)], tmp / "single.log")
    try:
        wait_healthy(p, port)
        return constrained_all(port)
    finally:
        p.proc.send_signal(signal.SIGTERM)
        p.wait(30)
        p.reap()


@pytest.fixture(scope="module")
def single(dserve_bin, model_dir, tmp_path_factory):
    """The same model on one process (DP = 1): the reference outputs."""
    tmp = tmp_path_factory.mktemp("single")
    port = free_port()
    flags = source_flags(free_port(), dp=1)
    p = Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags],
             tmp / "single.log")
    try:
        wait_healthy(p, port)
        return complete_all(port, PROMPTS)
    finally:
        p.proc.send_signal(signal.SIGTERM)
        p.wait(30)
        p.reap()


@pytest.mark.parametrize("order", ["head-first", "headless-first"])
def test_two_nodes_serve_like_one(order, dserve_bin, model_dir, single, tmp_path):
    port, rpc = free_port(), free_port()
    procs = []
    try:
        if order == "head-first":
            procs.append(head(dserve_bin, model_dir, port, rpc, tmp_path))
            time.sleep(0.5)
            procs.append(headless(dserve_bin, model_dir, rpc, tmp_path))
        else:
            procs.append(headless(dserve_bin, model_dir, rpc, tmp_path))
            time.sleep(0.5)
            procs.append(head(dserve_bin, model_dir, port, rpc, tmp_path))
        h = procs[0] if order == "head-first" else procs[1]
        node = procs[1] if order == "head-first" else procs[0]
        wait_healthy(h, port)
        before = metrics(port)
        got = complete_all(port, PROMPTS)
        after = metrics(port)
        for want, g, p in zip(single, got, PROMPTS):
            assert g["text"] == want["text"], p
            worst = max(abs(a - b) for a, b in zip(g["logprobs"], want["logprobs"]))
            assert worst < 1e-3, f"{p!r}: log-probabilities differ by {worst:.2e}"
        ok = {e: after_n - per_engine(before, "vllm:request_success", finished_reason="length").get(e, 0)
              for e, after_n in per_engine(after, "vllm:request_success",
                                           finished_reason="length").items()}
        assert set(ok) == {"0", "1"}
        assert ok["0"] > 0 and ok["1"] > 0, f"requests per engine: {ok}"
        assert sum(ok.values()) == len(PROMPTS)
        gen = per_engine(after, "vllm:generation_tokens")
        gen0 = per_engine(before, "vllm:generation_tokens")
        assert sum(gen[e] - gen0.get(e, 0) for e in gen) == sum(g["tokens"] for g in got)
        assert per_engine(after, "vllm:e2e_request_latency_seconds")  # both engines' histograms
        log = h.log() + node.log()
        assert "\"ascend_scheduler_config\" ignored" in log
        assert "\"torchair_graph_config\" ignored" in log
        # A normal shutdown of the API server's node ends the headless node too, with 0.
        h.proc.send_signal(signal.SIGTERM)
        assert h.wait(30) == 0, h.log()[-2000:]
        assert node.wait(15) == 0, node.log()[-2000:]
    finally:
        assert all(p.reap() for p in procs), "a process was left running"


def test_two_engines_in_one_process(dserve_bin, model_dir, single, single_constrained, tmp_path):
    """--data-parallel-size 2 on one node: two engines behind one API server."""
    port = free_port()
    flags = source_flags(free_port())
    i = flags.index("--data-parallel-size-local")
    del flags[i:i + 2]  # default: all engines here
    p = Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags],
             tmp_path / "one-node.log")
    try:
        wait_healthy(p, port)
        got = complete_all(port, PROMPTS)
        assert [g["text"] for g in got] == [w["text"] for w in single]
        ok = per_engine(metrics(port), "vllm:request_success", finished_reason="length")
        assert ok["0"] > 0 and ok["1"] > 0 and ok["0"] + ok["1"] == len(PROMPTS), ok
        before = per_engine(metrics(port), "vllm:request_success")
        assert constrained_all(port) == single_constrained
        after = per_engine(metrics(port), "vllm:request_success")
        assert all(after[e] > before.get(e, 0) for e in ("0", "1")), (before, after)
        p.proc.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        assert p.reap()


def processes_with(text):
    """Pids of running processes whose command line contains `text`."""
    import pathlib
    pids = []
    for d in pathlib.Path("/proc").iterdir():
        try:
            if d.name.isdigit() and text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


def test_engines_of_two_tensor_parallel_ranks(dserve_bin, model_dir, single, tmp_path):
    """The source command lines at --data-parallel-size 2 --tensor-parallel-size 2: each
    node's engine is a tensor-parallel group of its own (the node starts its second rank,
    at --master-port + the engine's data-parallel rank)."""
    port, rpc, master = free_port(), free_port(), free_port_run(2)  # engine d's group: master + d
    tp = ["--tensor-parallel-size", 2, "--master-port", master]
    flags = source_flags(rpc)
    i = flags.index("--tensor-parallel-size")
    del flags[i:i + 2]
    h = Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags, *tp],
             tmp_path / "head.log")
    node = Proc([dserve_bin, "serve", model_dir, *flags, *tp, "--headless", "--data-parallel-start-rank", 1],
                tmp_path / "node1.log")
    procs = [h, node]
    try:
        wait_healthy(h, port)
        assert len(processes_with(f"--master-port {master}")) == 4
        got = complete_all(port, PROMPTS)
        for want, g, p in zip(single, got, PROMPTS):
            assert g["text"] == want["text"], p
            worst = max(abs(a - b) for a, b in zip(g["logprobs"], want["logprobs"]))
            assert worst < 1e-3, f"{p!r}: log-probabilities differ by {worst:.2e}"
        ok = per_engine(metrics(port), "vllm:request_success", finished_reason="length")
        assert ok.get("0", 0) > 0 and ok.get("1", 0) > 0, ok
        for p in procs:
            log = p.log()
            assert "tensor parallel rank 0/2" in log and "tensor parallel rank 1/2" in log, log[-2000:]
        h.proc.send_signal(signal.SIGTERM)
        assert h.wait(30) == 0, h.log()[-2000:]
        assert node.wait(15) == 0, node.log()[-2000:]
        deadline = time.monotonic() + 10
        while processes_with(f"--master-port {master}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with(f"--master-port {master}") == [], "a tensor-parallel rank was left running"
    finally:
        assert all(p.reap() for p in procs), "a process was left running"


def test_killed_headless_node_and_then_the_head(dserve_bin, model_dir, tmp_path):
    import openai
    port, rpc = free_port(), free_port()
    h = head(dserve_bin, model_dir, port, rpc, tmp_path)
    node = headless(dserve_bin, model_dir, rpc, tmp_path)
    try:
        wait_healthy(h, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        started = concurrent.futures.Future()
        n_started = [0]

        def stream(i):
            chunks = 0
            try:
                for _ in client.completions.create(model=model, prompt=PROMPTS[i], max_tokens=230,
                                                   temperature=0, stream=True,
                                                   extra_body={"ignore_eos": True}):
                    chunks += 1
                    if chunks == 1:
                        n_started[0] += 1
                        if n_started[0] == 2:
                            started.set_result(True)
                return "done"
            except openai.APIError as e:
                return f"error: {e}"
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(stream, i) for i in range(2)]
            started.result(timeout=60)
            node.proc.kill()  # the headless node dies mid-stream
            t0 = time.monotonic()
            outcomes = [f.result(timeout=30) for f in futures]
        assert time.monotonic() - t0 < 15
        assert sorted(o.split(":")[0] for o in outcomes) == ["done", "error"], outcomes
        assert "stopped answering" in h.log()
        # The API server's node goes on with its own engine.
        assert get(port, "/health")[0] == 200
        for p in PROMPTS[:3]:
            r = client.completions.create(model=model, prompt=p, max_tokens=4, temperature=0)
            assert r.choices[0].finish_reason == "length"
        assert per_engine(metrics(port), "vllm:request_success", finished_reason="error")["1"] >= 1
        # Now a fresh headless node, and the API server's node is killed: it exits soon.
    finally:
        node.reap()
        h.reap()

    port, rpc = free_port(), free_port()
    h = head(dserve_bin, model_dir, port, rpc, tmp_path)
    node = headless(dserve_bin, model_dir, rpc, tmp_path, name="node1-again")
    try:
        wait_healthy(h, port)
        h.proc.kill()
        t0 = time.monotonic()
        assert node.wait(15) != 0
        assert time.monotonic() - t0 < 10
        assert "stopped answering" in node.log()
    finally:
        assert node.reap()
        h.reap()


def expect_failure(proc, pattern, timeout=60):
    rc = proc.wait(timeout)
    assert rc != 0
    assert pattern in proc.log(), proc.log()[-3000:]
    assert proc.reap()


def test_missing_rank_is_named(dserve_bin, model_dir, tmp_path):
    """DP = 3 with ranks 0 and 2 only: rank 1 never arrives (a gap in the numbering)."""
    port, rpc = free_port(), free_port()
    h = head(dserve_bin, model_dir, port, rpc, tmp_path, dp=3, timeout=8)
    node = headless(dserve_bin, model_dir, rpc, tmp_path, dp=3, timeout=8, start_rank=2)
    try:
        expect_failure(h, "rank(s) 1 never connected")
        # The node that did come is told, and exits with the same error.
        expect_failure(node, "the API server stopped with an error", timeout=15)
        assert "rank(s) 1 never connected" in node.log()
    finally:
        h.reap()
        node.reap()


def test_headless_node_without_an_api_server(dserve_bin, model_dir, tmp_path):
    node = headless(dserve_bin, model_dir, free_port(), tmp_path, timeout=2)
    try:
        expect_failure(node, "no answer from the API server at tcp://127.0.0.1:")
    finally:
        node.reap()


@pytest.mark.parametrize("what,flags,start_rank,message", [
    ("block size", {"block_size": 16}, 1, "--block-size 128 vs 16"),
    ("model", {}, 1, "--model "),
    ("data-parallel size", {"dp": 3}, 1, "--data-parallel-size 2 vs 3"),
    ("overlap", {}, 0, "data-parallel rank 0 overlaps the API server's node's ranks"),
])
def test_nodes_that_disagree_are_refused(what, flags, start_rank, message, dserve_bin, model_dir,
                                         tmp_path):
    port, rpc = free_port(), free_port()
    node_model = model_dir
    if what == "model":  # the same files under another name: another model as far as flags go
        node_model = tmp_path / "another-model"
        node_model.symlink_to(model_dir)
    h = head(dserve_bin, model_dir, port, rpc, tmp_path)
    node = headless(dserve_bin, node_model, rpc, tmp_path, start_rank=start_rank, **flags)
    try:
        expect_failure(node, message)
        expect_failure(h, message)
        assert "refused node " in h.log()  # names the node
    finally:
        h.reap()
        node.reap()


@pytest.mark.parametrize("args,message", [
    (["--headless", "--data-parallel-size", 2], "--headless needs --data-parallel-address"),
    (["--data-parallel-size", 2, "--tensor-parallel-size", 2, "--nnodes", 2],
     "a data-parallel engine's tensor-parallel ranks run on its own node"),
    (["--additional-config", "{not json"], "--additional-config: not a JSON object"),
    (["--data-parallel-size", 2, "--data-parallel-start-rank", 1],
     "--data-parallel-start-rank 1 without --headless"),
    (["--data-parallel-size", 2, "--headless", "--data-parallel-address", "127.0.0.1",
      "--data-parallel-start-rank", 2], "go past --data-parallel-size 2"),
])
def test_bad_flags(args, message, dserve_bin, model_dir):
    r = subprocess.run([str(a) for a in [dserve_bin, "serve", model_dir, *args]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert message in r.stderr + r.stdout, r.stderr[-2000:]
