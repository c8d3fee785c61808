"""`dserve bench serve` against `dserve serve` on the default model: what the benchmark
counts equals what the server's /metrics counted (prometheus_client's parser), the
Poisson request rate holds, and --max-concurrency bounds what the server sees."""
import math
import threading
import time

import pytest

import server_util
from test_bench_serve import run_bench


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("bench-serve") / "serve.log"
    with server_util.running(dserve_bin, default_model, "--threads", 2, "--max-num-seqs", 32,
                             "--served-model-name", "smollm2", log_path=log) as s:
        yield s


def _total(families, name, **labels):
    return sum(s.value for s in families[name].samples
               if all(s.labels.get(k) == v for k, v in labels.items()))


def test_counts_and_request_rate_match_the_server(server, dserve_bin, default_model, tmp_path):
    n, rate = 100, 5.0
    before = server.metrics()
    res, _ = run_bench(dserve_bin, server.base_url, tmp_path, "--model", "smollm2",
                       "--num-prompts", n, "--request-rate", rate, "--random-input-len", 16,
                       "--random-output-len", 4, "--ignore-eos", "--seed", 5,
                       tokenizer=default_model)
    time.sleep(0.3)  # the server's gauges follow its last engine step
    after = server.metrics()

    def delta(name, **labels):
        return _total(after, name, **labels) - _total(before, name, **labels)

    assert res["completed"] == n and res["failed"] == 0
    assert delta("vllm:request_success", finished_reason="length") == n
    assert delta("vllm:prompt_tokens") == res["total_input_tokens"]
    assert delta("vllm:generation_tokens") == res["total_output_tokens"] == 4 * n
    # Poisson arrivals: 99 exponential gaps of mean 1/rate sum to 99/rate +- 3 sigma.
    gaps = n - 1
    spread = 3 * math.sqrt(gaps) / rate
    # The duration adds the last request's latency (a short one here): 1 s of slack.
    assert abs(res["duration"] - gaps / rate) < spread + 1.0, res["duration"]


def test_max_concurrency_bounds_what_the_server_sees(server, dserve_bin, default_model, tmp_path):
    seen, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            m = server.metrics()
            seen.append(_total(m, "vllm:num_requests_running") +
                        _total(m, "vllm:num_requests_waiting"))
            time.sleep(0.01)

    t = threading.Thread(target=poll)
    t.start()
    try:
        res, _ = run_bench(dserve_bin, server.base_url, tmp_path, "--model", "smollm2",
                           "--num-prompts", 24, "--max-concurrency", 4,
                           "--random-input-len", 32, "--random-output-len", 24, "--ignore-eos",
                           tokenizer=default_model)
    finally:
        stop.set()
        t.join()
    assert res["completed"] == 24
    assert max(seen) <= 4, max(seen)
    assert max(seen) == 4  # the bound was reached, so the check means something
