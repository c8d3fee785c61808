"""tools/soak.py: its growth fit against numpy's least squares, its verdicts on made-up
samples, and a half-minute soak of `dserve serve` (every scenario answered as the OpenAI
API defines, nothing left over when idle). The hour-long run is in docs/benchmarks.md.
"""
import json
import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import soak  # noqa: E402
import soak_load  # noqa: E402


def test_slope_is_numpys_least_squares_per_hour():
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 3600, 40))
    y = 300 + 0.002 * t + rng.normal(0, 0.5, 40)
    want = np.polyfit(t, y, 1)[0] * 3600
    assert soak.slope_per_hour(list(zip(t.tolist(), y.tolist()))) == pytest.approx(want, rel=1e-9)
    assert soak.slope_per_hour([(0, 1.0)]) == 0.0


def _summary(rss_per_hour, errors=(), idle_blocks=0):
    args = types.SimpleNamespace(duration=3600, warmup=600, concurrency=1, max_rss_slope=4.0,
                                 max_thread_slope=1.0, max_fd_slope=4.0)
    server = types.SimpleNamespace(command=["dserve", "serve"], n_blocks=100)
    samples = [{"t_s": t, "rss_mib": 300 + rss_per_hour * t / 3600, "threads": 12, "fds": 20,
                "preemptions": 0} for t in range(0, 3601, 30)]
    idle = {"kv_blocks_in_use": idle_blocks, "kv_usage": idle_blocks / 100, "running": 0,
            "waiting": 0, "http_connections": 1, "preemptions": 0}
    tally = soak.Tally()
    tally.ok("chat_stream", "200")
    for kind in errors:
        tally.error("chat_stream", kind, "detail")
    return soak.summarize(args, server, samples, idle, tally, None, "now")


def test_verdicts_on_made_up_samples():
    flat = _summary(0.0)
    assert flat["passed"], flat["failures"]
    growing = _summary(10.0)
    assert not growing["passed"]
    assert growing["rss_slope_mib_per_h"] == pytest.approx(10.0)
    assert growing["rss_slope_72h_mib"] == pytest.approx(720.0)
    broken = _summary(0.0, errors=["timeout", "timeout", "status_500"])
    assert not broken["passed"] and broken["errors_by_kind"] == {"timeout": 2, "status_500": 1}
    leaky = _summary(0.0, idle_blocks=3)
    assert not leaky["passed"] and "kv_blocks_in_use is 3" in " ".join(leaky["failures"])


def test_half_minute_soak(dserve_bin, default_model, tmp_path):
    out = tmp_path / "soak.json"
    # Half a minute can only catch fast growth: the bounds are loose (the hour-long run's
    # are the defaults); leftovers when idle and every unexpected answer still fail it.
    r = subprocess.run([sys.executable, REPO / "tools" / "soak.py", "--dserve", dserve_bin,
                        "--model", default_model, "--duration", "30", "--sample-interval", "2",
                        "--warmup", "10", "--concurrency", str(len(soak_load.MIX)),
                        "--max-rss-slope", "1500", "--max-thread-slope", "500",
                        "--max-fd-slope", "2000",
                        "--serve-arg=--max-model-len", "--serve-arg=2048",
                        "--serve-arg=--kv-cache-memory", f"--serve-arg={64 << 20}",
                        "--json", out, "--log", tmp_path / "serve.log"],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    s = json.loads(out.read_text())
    assert s["passed"] and not s["errors_by_kind"]
    # Every scenario ran (worker i starts with scenario i) and was answered as expected.
    assert set(s["responses"]) == {f.__name__ for f, _ in soak_load.MIX}
    assert s["responses"]["bad_request"].keys() <= {"400", "404", "405"}
    assert s["responses"]["cancel_stream"].keys() == {"200 cancelled"}
    assert s["idle_after_load"]["kv_blocks_in_use"] == 0
    assert len(s["samples"]) >= 10
