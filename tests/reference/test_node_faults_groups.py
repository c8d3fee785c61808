"""Faults in groups whose ranks exchange data (gloo), across nodes that are network
namespaces on this machine (node_namespaces.py):

- Strangers on the rendezvous port: while rank 0 of a tensor-parallel group of three
  nodes (the default model, --tensor-parallel-size 3 --nnodes 3) waits for the others,
  plain TCP clients connect to its --master-port: one sends nothing, one sends junk, one
  sends a well-framed "set rank 1" of the store's requests without its hello. The group
  still forms and generates the same token ids as the three ranks started on one node
  by one command; the strangers are dropped.
- Expert parallelism (a tiny random DeepSeek-V3 with R1's tokenizer: every engine holds
  part of the experts), the headless node hung (SIGSTOP): the API server declares it
  lost within --engine-heartbeat-timeout, both streams end with an error, /health
  turns 503 and the API server exits non-zero within seconds (not after
  --distributed-timeout); let go, the headless node exits too; nothing is left running.
(Data parallelism without expert parallelism, its survivors and rejoin:
test_node_faults.py. A stranger on a gloo pair's own port: communicator_test.cc.)
"""
import concurrent.futures
import signal
import socket
import struct
import subprocess
import time

import pytest

import node_namespaces
import test_data_parallel as dp
import test_deepseek_reference as ds
from server_util import free_port


@pytest.fixture
def net():
    n = node_namespaces.NodeNetwork(2)
    yield n
    n.close()
    assert all(not node.pids() for node in n.nodes)


def closed_by_peer(sock, timeout):
    """True when the other end closes `sock` within `timeout` (what it sent is read away)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sock.recv(4096) == b"":
                return True
    except (socket.timeout, ConnectionResetError):
        return False
    return False


def test_strangers_on_the_rendezvous_port(dserve_bin, default_model, net, tmp_path):
    gen = ["generate", "--model", default_model, "--prompt", "The ocean is", "--max-tokens", 12,
           "--temperature", 0, "--ignore-eos", "--print-ids", "--threads", 1, "--tensor-parallel-size", 3,
           "--distributed-timeout", 60]
    one_node = subprocess.run([str(a) for a in [dserve_bin, *gen, "--master-port", free_port()]],
                              capture_output=True, text=True, timeout=300)
    assert one_node.returncode == 0, one_node.stderr[-3000:]

    port = free_port()
    nodes = ["--nnodes", 3, "--master-addr", net.address, "--master-port", port]
    logs = [open(tmp_path / f"rank{k}.log", "w") for k in range(3)]
    rank0 = subprocess.Popen([str(a) for a in [dserve_bin, *gen, *nodes, "--node-rank", 0]],
                             stdout=subprocess.PIPE, stderr=logs[0], text=True)
    procs = [rank0]
    strangers = []
    try:
        deadline = time.monotonic() + 60
        while not strangers:  # the first connection that gets through stays, silent
            assert rank0.poll() is None and time.monotonic() < deadline, (tmp_path / "rank0.log").read_text()
            try:
                strangers.append(socket.create_connection((net.address, port), timeout=1))
            except OSError:
                time.sleep(0.05)
        junk = socket.create_connection((net.address, port))
        junk.sendall(b"GET / HTTP/1.1\r\nHost: dserve\r\n\r\n")
        key, value = b"dserve/rank/1", b"model=someone else\nstranger pid 1"
        unannounced = socket.create_connection((net.address, port))
        unannounced.sendall(b"S" + struct.pack("<I", len(key)) + key + struct.pack("<I", len(value)) + value)
        strangers += [junk, unannounced]
        for k in (1, 2):
            procs.append(subprocess.Popen(net.nodes[k - 1].command([dserve_bin, *gen, *nodes, "--node-rank", k]),
                                          stdout=logs[k], stderr=subprocess.STDOUT))
        out, _ = rank0.communicate(timeout=240)
        assert rank0.returncode == 0, (tmp_path / "rank0.log").read_text()[-3000:]
        assert out.strip() == one_node.stdout.strip()
        for p in procs[1:]:
            assert p.wait(timeout=30) == 0
        for s in strangers:
            assert closed_by_peer(s, 15), "a stranger was not dropped"
    finally:
        for s in strangers:
            s.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()


def test_expert_parallel_group_stops_when_a_node_hangs(dserve_bin, net, tmp_path):
    import openai
    model_dir, _ = ds._r1_fixture()
    port, rpc = free_port(), dp.free_port_run(2)  # rpc + 1: the expert-parallel group
    flags = dp.source_flags(rpc, timeout=60)
    flags[flags.index("--data-parallel-address") + 1] = net.address
    flags += ["--enable-expert-parallel", "--engine-heartbeat-timeout", 1.5]
    h = dp.Proc([dserve_bin, "serve", model_dir, "--host", "127.0.0.1", "--port", port, *flags],
                tmp_path / "head.log")
    node = dp.Proc(net.nodes[0].command([dserve_bin, "serve", model_dir, *flags, "--headless",
                                         "--data-parallel-start-rank", 1]), tmp_path / "node1.log")
    try:
        dp.wait_healthy(h, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        started = [concurrent.futures.Future() for _ in range(2)]

        def stream(i):
            try:
                for _ in client.completions.create(model=model, prompt=dp.PROMPTS[i], max_tokens=230,
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True}):
                    if not started[i].done():
                        started[i].set_result(True)
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
            for f in started:
                f.result(timeout=60)
            watcher = pool.submit(watch_health)
            node.proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            outcomes = [f.result(timeout=60) for f in futures]
            # Every engine holds part of the experts: neither stream can go on.
            assert [o.split(":")[0] for o in outcomes] == ["error", "error"], outcomes
            assert any("was lost: stopped answering" in o for o in outcomes), outcomes
            assert h.wait(30) != 0
            took = time.monotonic() - t0
            watcher.result(timeout=5)
        assert took < 15, f"the API server took {took:.1f} s to stop (--distributed-timeout is 60)"
        assert 503 in health, health
        log = h.log()
        assert "lost engine(s) 1 on node" in log and "the engine failed" in log, log[-3000:]
        node.proc.send_signal(signal.SIGCONT)
        assert node.wait(15) != 0
    finally:
        node.reap()
        h.reap()
