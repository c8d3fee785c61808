"""`dserve serve` as a process: its flags, refusing what is not built, graceful
shutdown on SIGTERM, and a client that stops reading not stalling anyone else."""
import json
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

import server_util
from conftest import run

FLAGS = ["--host", "--port", "--api-key", "--served-model-name", "--max-model-len",
         "--max-num-seqs", "--max-num-batched-tokens", "--block-size",
         "--gpu-memory-utilization", "--kv-cache-memory", "--kv-cache-dtype", "--seed", "--dtype", "--quantization",
         "--enable-prefix-caching", "--no-enable-prefix-caching", "--chat-template",
         "--reasoning-parser", "--trust-remote-code", "--threads", "--log-level",
         "--shutdown-timeout", "--tensor-parallel-size", "--data-parallel-size",
         "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port",
         "--data-parallel-start-rank", "--headless", "--enable-expert-parallel",
         "--additional-config", "--max-waiting-requests", "--max-connections",
         "--http-io-threads", "--request-head-timeout", "--request-body-timeout",
         "--keep-alive-timeout", "--max-header-bytes", "--max-header-fields", "--ssl-certfile",
         "--ssl-keyfile"]


def test_help_lists_every_flag(dserve_bin):
    out = run([dserve_bin, "serve", "--help"]).stdout
    for flag in FLAGS:
        assert flag in out, flag
    assert "8000" in out and "256" in out and "2048" in out  # defaults shown


@pytest.mark.parametrize("args, words", [
    # The default model's 9 heads do not split over 2 ranks (tensor parallelism itself:
    # test_tensor_parallel.py).
    (["--tensor-parallel-size", "2", "--master-port", str(server_util.free_port())],
     "--tensor-parallel-size 2: does not divide the model's 9 attention heads"),
    (["--pipeline-parallel-size", "2"], "not built yet"),
    # Data parallelism itself: test_data_parallel.py.
    (["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--distributed-timeout",
      "1", "--data-parallel-rpc-port", str(server_util.free_port())], "rank(s) 1 never connected"),
    # Expert parallelism across the engines needs routed experts (test_expert_parallel.py).
    (["--enable-expert-parallel", "--data-parallel-size", "2", "--data-parallel-rpc-port",
      str(server_util.free_port_run(2))], "--enable-expert-parallel: LlamaForCausalLM has no routed experts"),
    (["--enable-expert-parallel", "--tensor-parallel-size", "3", "--master-port",
      str(server_util.free_port())], "--enable-expert-parallel: LlamaForCausalLM has no routed experts"),
    (["--quantization", "awq"], "not built yet"),
    (["--dtype", "bfloat16"], "float32"),
    (["--gpu-memory-utilization", "0.000001"], "--kv-cache-memory"),
    (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    (["--kv-cache-memory", "1000"], "--kv-cache-memory"),
    # More than this machine's memory (or its cgroup's limit) holds: refused at start-up.
    (["--kv-cache-memory", str(1 << 50)], "more than the memory limit"),
    (["--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype"),
    (["--reasoning-parser", "nope"], "reasoning-parser"),
    (["--chat-template", "/nonexistent/template.jinja"], "no such file"),
    (["--chat-template", "{% if %}"], "chat template"),
])
def test_refuses_with_one_clear_error(dserve_bin, default_model, args, words):
    r = run([dserve_bin, "serve", default_model, "--port", server_util.free_port(), *args],
            check=False, timeout=120)
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if "error" in l.lower()]
    assert lines and words in r.stderr, r.stderr


def test_port_in_use(dserve_bin, default_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run([dserve_bin, "serve", default_model, "--host", "127.0.0.1", "--port", port],
                check=False, timeout=120)
    assert r.returncode != 0 and "cannot listen" in r.stderr, r.stderr


def test_sigterm_lets_running_requests_finish(dserve_bin, default_model, tmp_path):
    s = server_util.start(dserve_bin, default_model, "--threads", 2, "--shutdown-timeout", 60,
                          log_path=tmp_path / "serve.log")
    try:
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        stream = client.completions.create(model=str(default_model), prompt="Tell me a story",
                                           max_tokens=48, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = next(chunks)
        s.proc.send_signal(signal.SIGTERM)
        rest = list(chunks)
        finish = [c.choices[0].finish_reason for c in [first, *rest] if c.choices]
        assert finish[-1] == "length"
        assert s.proc.wait(timeout=60) == 0
        assert "shut down" in s.log()
    finally:
        server_util.stop(s)


def test_slow_reader_does_not_stall_others(dserve_bin, default_model, tmp_path):
    with server_util.running(dserve_bin, default_model, "--threads", 2,
                             log_path=tmp_path / "serve.log") as s:
        # A client that asks for a long stream with big chunks and never reads it.
        body = json.dumps({"prompt": "Write a long essay", "max_tokens": 400, "stream": True,
                           "logprobs": 20, "extra": None}).replace(', "extra": null', "")
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                      + body).encode())
        try:
            client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0,
                                   timeout=120)
            results = []

            def other(i):
                r = client.completions.create(model=str(default_model), prompt=f"Hi {i}",
                                              max_tokens=8, extra_body={"ignore_eos": True})
                results.append(r.usage.completion_tokens)

            threads = [threading.Thread(target=other, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert results == [8, 8, 8, 8]
        finally:
            slow.close()


def test_api_key_from_the_environment(dserve_bin, default_model, tmp_path):
    with server_util.running(dserve_bin, default_model, "--threads", 2,
                             env={"DSERVE_API_KEY": "env-key"},
                             log_path=tmp_path / "serve.log") as s:
        for key, ok in (("wrong", False), ("env-key", True)):
            c = openai.OpenAI(base_url=s.base_url + "/v1", api_key=key, max_retries=0)
            if ok:
                assert c.models.list().data
            else:
                with pytest.raises(openai.AuthenticationError):
                    c.models.list()
        assert s.get("/health")[0] == 200  # not a /v1 route: open, as vLLM
