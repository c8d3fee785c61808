"""`dserve serve --audit-log FILE --log-format json`: the audit line of each request
carries SHA-256 hashes (checked with hashlib against the bytes this test sent and
received), a key id that is not the key, the client, endpoint, model, token counts
(the response's usage), status and latency; every log line is a JSON object (parsed
with Python's json), and a request's log lines carry its id."""
import hashlib
import json
import urllib.request

import pytest

import server_util

API_KEY = "sk-audit-0123456789"


def post(server, path, body: bytes, request_id: str, key=API_KEY):
    req = urllib.request.Request(server.base_url + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {key}",
                                          "X-Request-Id": request_id})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.headers["X-Request-Id"] == request_id
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def run(dserve_bin, default_model, tmp_path_factory):
    """Serves, sends a few requests, stops the server; returns what was sent and
    received by request id, the audit lines and the log lines."""
    d = tmp_path_factory.mktemp("audit")
    audit, log = d / "audit.jsonl", d / "serve.log"
    sent = {}
    with server_util.running(dserve_bin, default_model, "--served-model-name", "smollm2",
                             "--api-key", API_KEY, "--audit-log", audit, "--log-format", "json",
                             "--log-level", "info", "--threads", 2, log_path=log) as s:
        bodies = {
            "completion": ("/v1/completions", {"model": "smollm2", "prompt": "The ocean is",
                                               "max_tokens": 6, "temperature": 0}),
            "stream": ("/v1/completions", {"model": "smollm2", "prompt": "Once upon a time",
                                           "max_tokens": 6, "stream": True,
                                           "stream_options": {"include_usage": True}}),
            "chat": ("/v1/chat/completions", {"model": "smollm2", "max_tokens": 5,
                                              "messages": [{"role": "user",
                                                            "content": "Hi \u00e9\u4e16"}]}),
            "responses": ("/v1/responses", {"model": "smollm2", "input": "Hi",
                                            "max_output_tokens": 5}),
            "responses-stream": ("/v1/responses", {"model": "smollm2", "input": "Hi",
                                                   "max_output_tokens": 4, "stream": True}),
            "bad": ("/v1/completions", {"model": "smollm2", "prompt": "x", "max_tokens": -1}),
        }
        for rid, (path, body) in bodies.items():
            raw = json.dumps(body).encode()
            status, got = post(s, path, raw, rid)
            sent[rid] = (path, raw, status, got)
        raw = b'{"prompt": "x"}'
        status, got = post(s, "/v1/completions", raw, "wrong-key", key="nope")
        sent["wrong-key"] = ("/v1/completions", raw, status, got)
        assert s.get("/health")[0] == 200  # probes are not audited
    # SIGTERM drained and exited cleanly (a signal landing on a thread that did not block
    # it, such as the audit writer, used to kill the process: lines could be lost).
    assert s.proc.returncode == 0, log.read_text()[-2000:]
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    return sent, lines, audit.read_text(), log.read_text()


def test_audit_hashes_match_the_bytes_sent_and_received(run):
    sent, lines, _, _ = run
    by_id = {x["request_id"]: x for x in lines}
    assert set(by_id) == set(sent), "one line per request (GET /health excluded)"
    for rid, (path, body, status, got) in sent.items():
        a = by_id[rid]
        # A refused key ends the request before its body is read: no hash of it.
        want = None if status == 401 else hashlib.sha256(body).hexdigest()
        assert a["request_sha256"] == want, rid
        assert a["response_sha256"] == hashlib.sha256(got).hexdigest(), rid
        assert a["status"] == status and a["endpoint"] == path and a["method"] == "POST"
        assert a["client"].startswith("127.0.0.1:") and a["latency_ms"] >= 0
        assert a["time"].endswith("Z")
    assert sent["completion"][2] == sent["stream"][2] == sent["chat"][2] == 200
    assert sent["responses"][2] == sent["responses-stream"][2] == 200
    assert sent["bad"][2] == 400 and sent["wrong-key"][2] == 401


def test_audit_token_counts_are_the_usage_returned(run):
    sent, lines, _, _ = run
    by_id = {x["request_id"]: x for x in lines}
    for rid in ("completion", "chat"):
        usage = json.loads(sent[rid][3])["usage"]
        assert by_id[rid]["prompt_tokens"] == usage["prompt_tokens"]
        assert by_id[rid]["completion_tokens"] == usage["completion_tokens"]
    events = [e[len("data: "):] for e in sent["stream"][3].decode().split("\n\n")
              if e.startswith("data: {")]
    usage = json.loads(events[-1])["usage"]
    assert by_id["stream"]["completion_tokens"] == usage["completion_tokens"] == 6
    # The Responses API names them input and output tokens, streamed in the last event.
    usage = json.loads(sent["responses"][3])["usage"]
    assert by_id["responses"]["prompt_tokens"] == usage["input_tokens"]
    assert by_id["responses"]["completion_tokens"] == usage["output_tokens"]
    events = [e.split("\ndata: ", 1)[1] for e in sent["responses-stream"][3].decode().split("\n\n")
              if e.startswith("event: ")]
    usage = json.loads(events[-1])["response"]["usage"]
    assert by_id["responses-stream"]["prompt_tokens"] == usage["input_tokens"]
    assert by_id["responses-stream"]["completion_tokens"] == usage["output_tokens"] == 4
    assert by_id["bad"]["prompt_tokens"] is None


def test_audit_never_holds_the_key(run):
    _, lines, text, _ = run
    assert API_KEY not in text
    by_id = {x["request_id"]: x for x in lines}
    key_id = by_id["completion"]["key_id"]
    assert key_id and key_id.startswith("sha256:")
    assert hashlib.sha256(API_KEY.encode()).hexdigest().startswith(key_id[len("sha256:"):])
    assert by_id["wrong-key"]["key_id"] is None
    assert all(by_id[r]["model"] == "smollm2" for r in ("completion", "stream", "chat"))


def test_every_log_line_is_json(run):
    sent, _, _, log = run
    records = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert records
    for r in records:
        assert {"timestamp", "level", "message"} <= set(r), r
        assert r["level"] in {"debug", "info", "warning", "error", "critical"}
    # Each request's access-log line carries its id.
    tagged = {r.get("request_id") for r in records if '"POST /v1/' in r["message"]}
    assert set(sent) <= tagged
