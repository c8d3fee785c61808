"""The deployment files: every Kubernetes object in deploy/kubernetes validates against
the Kubernetes API's own schemas (kubernetes-validate, strict: unknown fields fail);
the Dockerfile passes hadolint; the HPA's custom metric is the one the Prometheus
adapter rule makes of a gauge dserve really exports; and the Deployment's container
arguments start a dserve whose /health answers on the probed port."""
import json
import shutil
import subprocess

import pytest
import yaml

import server_util
from conftest import REPO

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S_DIR = REPO / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes these files target


def documents():
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind):
    return [d for _, d in documents() if d["kind"] == kind]


@pytest.mark.parametrize("name,doc", documents(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_manifest_is_valid_kubernetes(name, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_expected_objects_exist():
    kinds = sorted(d["kind"] for _, d in documents())
    assert kinds == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "Service"]


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(REPO / ".venv" / "bin" / "hadolint")
    r = subprocess.run([hadolint, "--config", str(REPO / ".hadolint.yaml"),
                        str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def deployed(dserve_bin, default_model, tmp_path_factory):
    """dserve started with the Deployment's container arguments (model path, port and
    audit file mapped to this machine)."""
    (container,) = by_kind("Deployment")[0]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "serve"
    d = tmp_path_factory.mktemp("deploy")
    port = server_util.free_port()
    mapped = []
    for a in args[2:]:
        if a == "0.0.0.0":
            a = "127.0.0.1"
        elif a == str(container["ports"][0]["containerPort"]):
            a = str(port)
        elif a.startswith("/var/log/dserve/"):
            a = str(d / "audit.jsonl")
        mapped.append(a)
    # server_util adds --host/--port itself; pass the rest as the container does.
    rest, skip = [], False
    for a in mapped:
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        rest.append(a)
    with server_util.running(dserve_bin, default_model, *rest, "--threads", 2, port=port,
                             log_path=d / "serve.log") as s:
        yield s, container


def test_probes_and_metric_match_the_server(deployed):
    server, container = deployed
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert server.get(container[probe]["httpGet"]["path"])[0] == 200
    # The HPA scales on the adapter's name for a gauge dserve exports.
    (hpa,) = by_kind("HorizontalPodAutoscaler")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    (adapter,) = by_kind("ConfigMap")
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == metric
    series = rule["seriesQuery"].split("{")[0].strip("'\"")
    families = server.metrics()
    assert series in families and families[series].type == "gauge"
    # --log-format json as the Deployment asks: the log is JSON lines.
    for line in server.log().splitlines():
        json.loads(line)
