"""tools/locustfile.py, run headless by Locust (as the load tests of a deployment run
it) against `dserve serve` on the default model: no failed request, every streamed
request reports its time to first token, and the requests Locust counts as answered are
exactly those the server's /metrics counts as served (prometheus_client's parser).
Locust runs in its own process (gevent patches the standard library's sockets)."""
import json
import os
import pathlib
import subprocess
import sys

import server_util
from conftest import REPO

LOCUST = pathlib.Path(sys.executable).parent / "locust"
POSTS = ("/v1/chat/completions", "/v1/completions")


def test_locust_run_against_dserve(dserve_bin, default_model, tmp_path):
    assert LOCUST.exists(), f"{LOCUST} missing (requirements-test.txt)"
    with server_util.running(dserve_bin, default_model, "--served-model-name", "smol",
                             "--threads", 2, log_path=tmp_path / "serve.log") as server:
        # --json: the final statistics, after --stop-timeout let running requests finish
        # (the --csv files are written before that).
        r = subprocess.run(
            [LOCUST, "-f", REPO / "tools" / "locustfile.py", "--headless", "-u", "4", "-r", "4",
             "-t", "8s", "--stop-timeout", "120", "--host", server.base_url, "--json",
             "--loglevel", "WARNING"],
            env={**os.environ, "DSERVE_LOAD_MAX_TOKENS": "16"}, capture_output=True, text=True,
            timeout=300)
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        served = sum(s.value for s in server.metrics()["vllm:request_success"].samples
                     if s.name == "vllm:request_success_total")
    stats = {(e["method"], e["name"]): e for e in json.loads(r.stdout)}
    count = {key: e["num_requests"] for key, e in stats.items()}
    assert all(e["num_failures"] == 0 for e in stats.values()), stats
    posts = {key: n for key, n in count.items() if key[0] == "POST"}
    assert set(posts) <= {("POST", p) for p in POSTS} | {("POST", p + " (stream)") for p in POSTS}
    assert posts.get(("POST", "/v1/chat/completions (stream)"), 0) > 0, count
    assert sum(posts.values()) == served, (posts, served)
    for path in POSTS:  # one time to first token per streamed request (ignore_eos: text)
        streamed = posts.get(("POST", path + " (stream)"), 0)
        assert count.get(("METRIC", "TTFT " + path), 0) == streamed, count
    ttft = stats[("METRIC", "TTFT /v1/chat/completions")]
    assert 0 < ttft["total_response_time"] / ttft["num_requests"] < 60_000, ttft
