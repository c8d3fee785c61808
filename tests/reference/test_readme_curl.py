"""The README's curl examples work as printed, against `dserve serve` on the default
model started as `make serve` starts it (port 8000, the same served name)."""
import json
import pathlib
import re
import subprocess

import pytest

import server_util
from conftest import REPO


def readme_curl_commands():
    text = (REPO / "README.md").read_text()
    section = text.split("## Serving: the OpenAI-compatible API", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [c for c in block.replace("\\\n", " ").splitlines() if c.strip().startswith("curl")]


def test_readme_curl_examples(dserve_bin, default_model, tmp_path):
    makefile = (REPO / "Makefile").read_text()
    name = re.search(r"^SERVED_NAME \?= (\S+)", makefile, re.M).group(1)
    port = int(re.search(r"^PORT \?= (\d+)", makefile, re.M).group(1))
    commands = readme_curl_commands()
    assert len(commands) >= 4
    with server_util.running(dserve_bin, default_model, "--served-model-name", name,
                             "--threads", 2, port=port, log_path=tmp_path / "serve.log") as s:
        for cmd in commands:
            r = subprocess.run(["bash", "-c", cmd + " --fail-with-body"], capture_output=True,
                               text=True, timeout=300)
            assert r.returncode == 0, (cmd, r.stdout, r.stderr)
            out = r.stdout
            if "/metrics" in cmd:
                assert "vllm:num_requests_running" in out
            elif '"stream": true' in cmd:
                events = [l[6:] for l in out.splitlines() if l.startswith("data: ")]
                assert events[-1] == "[DONE]"
                assert all("choices" in json.loads(e) for e in events[:-1])
            else:
                body = json.loads(out)
                assert "error" not in body, body
                if "/v1/models" in cmd:
                    assert body["data"][0]["id"] == name
                else:
                    assert body["choices"] and body["usage"]["completion_tokens"] >= 1
