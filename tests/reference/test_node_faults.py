"""Faults across nodes, with the default model. Each headless node runs in a network
namespace of its own on this machine (node_namespaces.py: a veth pair to a bridge here,
10.77.X.0/24), the API server's node in this one, so the link between them can be cut;
a slow node is a cgroup with a CPU quota. For data parallelism without expert
parallelism (--data-parallel-size 2: the API server's engine 0, a headless node's
engine 1), with short deadlines (--engine-heartbeat-timeout, --engine-step-timeout):

- the headless node hangs (SIGSTOP), its link goes down, or it gets 0.1% of a CPU: the
  API server declares it lost within the deadline (a log line naming engine 1 and why;
  dserve:engine_alive, dserve:engines_alive and dserve:engine_losses_total in /metrics,
  read with prometheus_client's parser), requests it had not answered are served by
  engine 0 (HTTP 200 through the openai SDK, the same text as before the fault), the
  stream it had under way ends with an error event, nothing answers 4xx, /health stays
  200; the node, let go (SIGCONT, link up, quota lifted), exits by itself and nothing is
  left in its namespace;
- started again with the same command line, the node rejoins and takes requests
  (engine 1's request counter in /metrics moves again);
- a deadline out of range is refused with one clear error;
- with tensor-parallel engines (TP 3 each), a rank of the API server's own engine
  killed: that engine fails, its requests move to the node's engine (200, the same
  text); the node then killed too: /health turns 503 and the API server exits with an
  error, no rank left running.
Expert parallelism and the rendezvous of a gloo group across namespaces:
test_node_faults_groups.py.
"""
import concurrent.futures
import os
import signal
import subprocess
import time

import openai
import pytest

import node_namespaces
from server_util import free_port, free_port_run

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "A haiku about the sea:",
           "def fib(n):", "Hello, my name is", "Why is the sky blue?", "Water boils at"]
HEARTBEAT_S = 1.5


class Proc:
    def __init__(self, args, log_path):
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        self.proc = subprocess.Popen([str(a) for a in args], stdout=self.log_file, stderr=subprocess.STDOUT)

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
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()
        return done


class Cluster:
    """The API server's node here and one headless node in a namespace of `net`."""

    def __init__(self, dserve_bin, model, net, tmp_path, heartbeat_s=HEARTBEAT_S, step_s=30, tp=1):
        self.dserve_bin, self.model, self.net, self.tmp_path = dserve_bin, model, net, tmp_path
        self.port, self.rpc = free_port(), free_port()
        self.flags = ["--data-parallel-size", 2, "--data-parallel-size-local", 1,
                      "--data-parallel-rpc-port", self.rpc, "--threads", 1, "--max-model-len", 512,
                      "--kv-cache-memory", 32 << 20, "--distributed-timeout", 60,
                      "--engine-heartbeat-timeout", heartbeat_s, "--engine-step-timeout", step_s,
                      "--tensor-parallel-size", tp, "--master-port", free_port_run(2)]
        self.head = Proc([dserve_bin, "serve", model, "--host", "127.0.0.1", "--port", self.port, *self.flags],
                         tmp_path / "head.log")
        self.nodes = []
        self.node = self.start_node()
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="x", max_retries=0)
        self.wait_healthy()
        self.model_id = self.client.models.list().data[0].id

    def start_node(self):
        """The headless node's command line; the same every time it is started."""
        ns = self.net.nodes[0]
        p = Proc(ns.command([self.dserve_bin, "serve", self.model, *self.flags, "--headless",
                             "--data-parallel-start-rank", 1, "--data-parallel-address", self.net.address]),
                 self.tmp_path / f"node-{len(self.nodes)}.log")
        self.nodes.append(p)
        return p

    def get(self, path):
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def wait_healthy(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.head.proc.poll() is None, self.head.log()[-3000:]
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"not healthy within {timeout} s:\n{self.head.log()[-3000:]}")

    def metrics(self):
        from prometheus_client.parser import text_string_to_metric_families
        status, body = self.get("/metrics")
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out[(s.name, s.labels.get("engine"), s.labels.get("finished_reason"))] = s.value
        return out

    def served_by_engine1(self, m):
        return sum(v for (name, engine, _), v in m.items() if name == "vllm:request_success_total" and engine == "1")

    def complete(self, prompt):
        r = self.client.completions.create(model=self.model_id, prompt=prompt, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
        return r.choices[0].text, r.choices[0].finish_reason

    def complete_all(self):
        """Every prompt at once; each outcome is (text, finish_reason) or the error's status."""
        def one(p):
            try:
                return self.complete(p)
            except openai.APIStatusError as e:
                return ("status", e.status_code)
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            return list(pool.map(one, PROMPTS))

    def start_streams(self, pool):
        """One long stream per engine (the second goes to the engine the first did not),
        both under way when this returns: futures of "done" or "error: ..."."""
        futures = []
        for i in range(2):
            started = concurrent.futures.Future()
            futures.append(pool.submit(self.stream, PROMPTS[i], started))
            started.result(timeout=60)
        return futures

    def stream(self, prompt, started):
        try:
            for _ in self.client.completions.create(model=self.model_id, prompt=prompt, max_tokens=400,
                                                    temperature=0, stream=True,
                                                    extra_body={"ignore_eos": True}):
                if not started.done():
                    started.set_result(True)
            return "done"
        except openai.APIError as e:
            if not started.done():
                started.set_exception(e)
            return f"error: {e}"

    def close(self):
        procs = [self.head, *self.nodes]
        for p in procs:
            p.reap()


@pytest.fixture
def net():
    n = node_namespaces.NodeNetwork(1)
    yield n
    n.close()


@pytest.fixture
def cluster_factory(dserve_bin, default_model, net, tmp_path):
    made = []

    def make(**kw):
        made.append(Cluster(dserve_bin, default_model, net, tmp_path, **kw))
        return made[-1]
    yield make
    for c in made:
        c.close()
    assert all(not n.pids() for n in net.nodes), "a process was left running in a node"


def check_survived(c, fault, reference, t_fault, reason):
    """After `fault` hit engine 1 with one stream under way on each engine."""
    got = c.complete_all()
    elapsed = time.monotonic() - t_fault
    statuses = [g[1] for g in got if g[0] == "status"]
    assert not statuses, f"requests answered {statuses} after the {fault}:\n{c.head.log()[-3000:]}"
    assert got == reference, "requests moved to engine 0 answer as before the fault"
    assert elapsed < 20, f"served {elapsed:.1f} s after the {fault}"
    log = c.head.log()
    assert "lost engine(s) 1 on node" in log and reason in log, log[-3000:]
    # Some of the requests had gone to engine 1 after the fault, and moved.
    assert "had produced no output yet: placed again on the engines left" in log, log[-3000:]
    assert c.get("/health")[0] == 200
    m = c.metrics()
    assert m[("dserve:engines_alive", None, None)] == 1
    assert m[("dserve:engine_alive", "1", None)] == 0 and m[("dserve:engine_alive", "0", None)] == 1
    assert m[("dserve:engine_losses_total", "1", None)] == 1
    assert m[("dserve:engine_losses_total", "0", None)] == 0


def test_hung_node(cluster_factory):
    c = cluster_factory()
    reference = c.complete_all()
    assert all(r[1] == "length" for r in reference), reference
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        streams = c.start_streams(pool)
        c.node.proc.send_signal(signal.SIGSTOP)
        t_fault = time.monotonic()
        check_survived(c, "hang", reference, t_fault, "stopped answering")
        outcomes = sorted(f.result(timeout=60).split(":")[0] for f in streams)
    assert outcomes == ["done", "error"], outcomes
    # Let go, the node learns it was declared lost (or finds the API server silent) and exits.
    c.node.proc.send_signal(signal.SIGCONT)
    assert c.node.wait(15) != 0
    assert "declared this node lost" in c.node.log() or "stopped answering" in c.node.log(), c.node.log()[-2000:]


def test_link_down_then_the_node_rejoins(cluster_factory, net):
    c = cluster_factory()
    reference = c.complete_all()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        streams = c.start_streams(pool)
        net.nodes[0].link(up=False)
        t_fault = time.monotonic()
        check_survived(c, "link down", reference, t_fault, "stopped answering")
        outcomes = sorted(f.result(timeout=60).split(":")[0] for f in streams)
    assert outcomes == ["done", "error"], outcomes
    # Cut off, the node gives up on the API server by itself.
    assert c.node.wait(15) != 0
    assert "stopped answering" in c.node.log(), c.node.log()[-2000:]
    assert not net.nodes[0].pids()
    # Link up, the same command line again: it rejoins and takes requests.
    net.nodes[0].link(up=True)
    before = c.served_by_engine1(c.metrics())
    c.node = c.start_node()
    deadline = time.monotonic() + 60
    while "rejoined with rank(s) 1" not in c.head.log():
        assert time.monotonic() < deadline, c.head.log()[-3000:]
        assert c.node.proc.poll() is None, c.node.log()[-3000:]
        time.sleep(0.2)
    assert c.complete_all() == reference
    m = c.metrics()
    assert c.served_by_engine1(m) > before, "no request reached the rejoined engine"
    assert m[("dserve:engines_alive", None, None)] == 2 and m[("dserve:engine_alive", "1", None)] == 1
    c.head.proc.send_signal(signal.SIGTERM)
    assert c.head.wait(30) == 0
    assert c.node.wait(15) == 0


def test_slow_node(cluster_factory, net):
    c = cluster_factory(heartbeat_s=3, step_s=1.5)
    reference = c.complete_all()
    throttle = node_namespaces.CpuThrottle("slow-node")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            streams = c.start_streams(pool)
            throttle.add(c.node.proc.pid)
            throttle.limit(quota_us=1000, period_us=1_000_000)  # 0.1% of one CPU
            t_fault = time.monotonic()
            check_survived(c, "CPU throttle", reference, t_fault, "stopped stepping")
            outcomes = sorted(f.result(timeout=60).split(":")[0] for f in streams)
        assert outcomes == ["done", "error"], outcomes
        # Given its CPU back, the node reads that it was declared lost, and exits.
        throttle.lift()
        assert c.node.wait(30) != 0
        assert "declared this node lost" in c.node.log(), c.node.log()[-2000:]
    finally:
        throttle.close()


def children(pid):
    """The processes whose parent is `pid`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_no_engine_left(cluster_factory, net):
    c = cluster_factory(tp=3)
    reference = c.complete_all()
    workers = children(c.head.proc.pid)
    assert len(workers) == 2, "the API server's engine did not start its two other ranks"
    os.kill(workers[0], signal.SIGKILL)
    # Engine 0 fails on its next step; what it had not answered moves to engine 1.
    assert c.complete_all() == reference
    log = c.head.log()
    assert "engine step failed" in log and "placed again on the engines left" in log, log[-3000:]
    assert c.get("/health")[0] == 200
    m = c.metrics()
    assert m[("dserve:engine_alive", "0", None)] == 0 and m[("dserve:engines_alive", None, None)] == 1
    # The node's engine too: none is left.
    health = []
    c.node.proc.kill()
    deadline = time.monotonic() + 30
    while c.head.proc.poll() is None and time.monotonic() < deadline:
        try:
            health.append(c.get("/health")[0])
        except OSError:
            pass
        time.sleep(0.05)
    assert c.head.wait(5) != 0
    assert 503 in health, health
    assert "lost engine(s) 1 on node" in c.head.log()
    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    deadline = time.monotonic() + 10
    while (running(workers[1]) or net.nodes[0].pids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(workers[1]), "a rank of the API server's engine was left running"
    assert not net.nodes[0].pids(), "a rank of the node's engine was left running"


@pytest.mark.parametrize("flag,value", [("--engine-heartbeat-timeout", 0), ("--engine-step-timeout", "nan"),
                                        ("--engine-heartbeat-timeout", 1e9)])
def test_bad_deadline_is_refused(flag, value, dserve_bin, default_model):
    r = subprocess.run([str(a) for a in [dserve_bin, "serve", default_model, "--data-parallel-size", 2, flag, value]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"{flag} " in r.stderr and "must be between 0.1 and 86400 seconds" in r.stderr, r.stderr[-2000:]
