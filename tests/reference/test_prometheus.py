"""A real Prometheus (Debian's package) scraping `dserve serve`: the scrape configuration
in deploy/prometheus loads in it (promtool), the series that the HPA's adapter rule and
the Grafana dashboard use arrive with their types and vLLM's labels, the adapter rule's
query (deploy/kubernetes/prometheus-adapter.yaml, its templates filled in as the
adapter fills them) returns the waiting count while requests wait, and every query of
deploy/grafana/dserve.json is accepted by Prometheus and returns data."""
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

import server_util
from conftest import REPO

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus (make test installs it)")
MODEL = "smol"
POD_LABELS = {"namespace": "default", "pod": "dserve-0"}  # as Kubernetes' pod relabelling gives


def query(base, promql):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.loads(r.read())


def adapter_query():
    """The adapter's metricsQuery for one pod, templates filled as the adapter does."""
    text = (REPO / "deploy" / "kubernetes" / "prometheus-adapter.yaml").read_text()
    rule = yaml.safe_load(yaml.safe_load(text)["data"]["config.yaml"])["rules"][0]
    series = re.match(r"'?([\w:]+)\{", rule["seriesQuery"]).group(1)
    matchers = ",".join(f'{k}="{v}"' for k, v in POD_LABELS.items())
    return (rule["metricsQuery"].replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod"))


@pytest.fixture
def scraped(dserve_bin, default_model, tmp_path, request):
    """dserve (one sequence at a time, so requests wait; extra flags from the test's
    `serve_args` mark) and a Prometheus scraping it every second with the deploy
    configuration's job."""
    marker = request.node.get_closest_marker("serve_args")
    extra = marker.args if marker else ()
    assert subprocess.run([PROMTOOL, "check", "config", REPO / "deploy" / "prometheus" / "prometheus.yml"],
                          capture_output=True).returncode == 0
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    with server_util.running(dserve_bin, default_model, "--served-model-name", MODEL,
                             "--max-num-seqs", 1, *(extra or ("--threads", 2)),
                             log_path=tmp_path / "serve.log") as server:
        config["global"]["scrape_interval"] = "1s"
        job = config["scrape_configs"][0]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"], "labels": POD_LABELS}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = server_util.free_port()
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prom.log", "w"))
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + 60
            while not query_ok(base, "up") and time.time() < deadline:
                time.sleep(0.5)
            yield server, base
        finally:
            prom.terminate()
            prom.wait(timeout=30)


def query_ok(base, promql):
    try:
        return bool(query(base, promql))
    except OSError:
        return False


def wait_for(base, promql, ok, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        result = query(base, promql)
        if ok(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{promql} never satisfied: {result}")


def send_long_requests(server, n):
    def one():
        body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 160,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(server.base_url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_prometheus_scrapes_dserve_for_the_adapter_and_the_dashboard(scraped):
    server, base = scraped
    threads = send_long_requests(server, 5)
    # With one sequence at a time, four of five wait: the adapter's query sees them.
    waiting = wait_for(base, adapter_query(), lambda r: r and float(r[0]["value"][1]) >= 1)
    assert waiting[0]["metric"] == {"pod": "dserve-0"}, waiting
    for t in threads:
        t.join()
    wait_for(base, f'sum(vllm:request_success_total{{model_name="{MODEL}"}})',
             lambda r: r and float(r[0]["value"][1]) == 5)

    metadata = get(base, "/api/v1/metadata")["data"]
    types = {name: entries[0]["type"] for name, entries in metadata.items()}
    assert types["vllm:num_requests_waiting"] == "gauge"
    assert types["vllm:num_requests_running"] == "gauge"
    # Prometheus 2.42 keeps a counter's metadata under its sample name.
    assert types.get("vllm:request_success_total", types.get("vllm:request_success")) == "counter", types
    assert types["vllm:time_to_first_token_seconds"] == "histogram"
    series = query(base, "vllm:num_requests_waiting")
    assert series and all(s["metric"]["model_name"] == MODEL and "engine" in s["metric"]
                          and s["metric"]["pod"] == "dserve-0" for s in series), series

    dashboard = json.loads((REPO / "deploy" / "grafana" / "dserve.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        result = query(base, expr.replace("$model_name", MODEL))
        assert result, f"no data for the dashboard's {expr}"


@pytest.mark.serve_args("--data-parallel-size", 2)
def test_each_data_parallel_engine_is_its_own_series(scraped):
    server, base = scraped
    for t in send_long_requests(server, 4):
        t.join()
    engines = wait_for(base, f'sum by (engine) (vllm:request_success_total{{model_name="{MODEL}"}})',
                       lambda r: len(r) == 2 and sum(float(e["value"][1]) for e in r) == 4)
    assert {e["metric"]["engine"] for e in engines} == {"0", "1"}, engines
    running = query(base, "vllm:num_requests_running")
    assert {s["metric"]["engine"] for s in running} == {"0", "1"}, running
