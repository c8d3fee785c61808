"""The HTTP front end against hostile, idle and departing clients.

Raw sockets play the attacker and the careless client; what counts as right comes from
outside dserve: HTTP/1.1's rules (RFC 9110/9112: 405 with Allow, 413, 431, 411,
pipelined responses in order, Retry-After on 503), the kernel's own accounting of the
server process (/proc: resident memory, CPU time), Prometheus' parser for the metrics,
the openai SDK over TLS with a certificate the openssl CLI makes. Each test takes
seconds.
"""
import concurrent.futures as cf
import json
import os
import pathlib
import resource
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

import server_util

MAX_BODY = 1 << 20
LONG = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
        "temperature": 0}


def raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, n))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < n:
        pytest.skip(f"open-file limit {hard} < {n}")


def rss_bytes(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def cpu_seconds(pid) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime: fields 14 and 15 of stat(5), counted after the ")" from field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def connect(server, timeout=10):
    return socket.create_connection(("127.0.0.1", server.port), timeout=timeout)


def read_response(f):
    """One HTTP/1.1 response from a buffered socket file: (status, headers, body)."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers = {}
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, v = line.decode().split(":", 1)
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int(f.readline().strip(), 16)
            chunk = f.read(size + 2)[:size]
            if size == 0:
                break
            body += chunk
    else:
        body = f.read(int(headers.get("content-length", "0")))
    return status, headers, body


def request(server, method, path, body=None, headers=None, timeout=30):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        c.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                     **(headers or {})})
        r = c.getresponse()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
    finally:
        c.close()


def assert_openai_error(status, body, want):
    assert status == want, (status, body)
    err = json.loads(body)["error"]
    assert isinstance(err["message"], str) and err["message"]


def sample(server, name, **labels):
    fams = server.metrics()
    total = 0.0
    for s in fams[name].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created"):
            total += s.value
    return total


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("hardening") / "server.log"
    raise_fd_limit(4096)
    with server_util.running(dserve_bin, default_model, "--max-body-bytes", MAX_BODY,
                             "--max-num-seqs", 4, "--keep-alive-timeout", 60,
                             "--request-head-timeout", 30, "--threads", 1,
                             log_path=log) as s:
        yield s


# 1. Slowloris: a thousand connections sending a header byte at a time hold no thread.
def test_slowloris_leaves_health_and_completions_served(server):
    raise_fd_limit(4096)
    conns = []
    try:
        for _ in range(1000):
            s = connect(server)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHo")
            conns.append(s)
        for s in conns:
            s.sendall(b"s")  # one more byte each, as a slowloris does
        times = []
        for _ in range(5):
            t = time.perf_counter()
            status, _, _ = request(server, "GET", "/health")
            times.append(time.perf_counter() - t)
            assert status == 200
        assert sorted(times)[2] < 0.1, times
        status, _, body = request(server, "POST", "/v1/completions",
                                  {"prompt": "Hello", "max_tokens": 4})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
        assert sample(server, "dserve:http_connections") >= 1000
    finally:
        for s in conns:
            s.close()


def test_request_head_deadline_closes_a_slow_client(dserve_bin, default_model, tmp_path):
    with server_util.running(dserve_bin, default_model, "--request-head-timeout", 1,
                             log_path=tmp_path / "s.log") as s:
        c = connect(s)
        c.sendall(b"GET /health HTTP/1.1\r\n")
        t = time.time()
        f = c.makefile("rb")
        status, headers, _ = read_response(f)  # 408, then the close
        assert status == 408 and headers.get("connection") == "close"
        assert time.time() - t < 5
        assert f.read() == b""


# 2. Shutdown completes whatever the clients do; a second SIGTERM ends at once.
def test_sigterm_with_slowloris_open_exits_in_time(dserve_bin, default_model, tmp_path):
    s = server_util.start(dserve_bin, default_model, "--shutdown-timeout", 2,
                          log_path=tmp_path / "s.log")
    slow = connect(s)
    slow.sendall(b"GET /health HTTP/1.1\r\nX")
    idle = connect(s)
    t = time.time()
    s.proc.send_signal(signal.SIGTERM)
    try:
        rc = s.proc.wait(timeout=2 + 5)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        slow.close()
        idle.close()
    assert rc == 0, s.log()[-2000:]
    assert time.time() - t < 7


def test_draining_health_is_503_and_second_sigterm_exits(dserve_bin, default_model, tmp_path):
    s = server_util.start(dserve_bin, default_model, "--shutdown-timeout", 60,
                          log_path=tmp_path / "s.log")
    try:
        c = connect(s, timeout=60)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(json.dumps({**LONG, "stream": True})),
                                                     json.dumps({**LONG, "stream": True}).encode()))
        assert c.recv(12).startswith(b"HTTP/1.1 200")
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        while True:  # the running stream keeps it draining
            status, _, _ = request(s, "GET", "/health", timeout=5)
            if status == 503 or time.time() > deadline:
                break
            time.sleep(0.1)
        assert status == 503
        assert s.proc.poll() is None
        t = time.time()
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(timeout=5)
        assert time.time() - t < 5
        c.close()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


# 3. Threads that cannot be made (RLIMIT_NPROC, a container's pids.max): one clear
# error and an exit, wherever in start-up it happens, never a hang.
def test_thread_limit_is_a_clear_start_up_error(dserve_bin, default_model):
    import shutil
    import tempfile
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("prlimit"):
        pytest.skip("needs root to run the server as another user (root ignores RLIMIT_NPROC)")
    with tempfile.TemporaryDirectory() as d:  # pytest's tmp_path is private to root
        model = pathlib.Path(d) / default_model.name
        shutil.copy(default_model, model)
        os.chmod(d, 0o755)
        model.chmod(0o644)
        check_thread_limits(dserve_bin, model)


def check_thread_limits(dserve_bin, model):
    if not os.access(dserve_bin, os.X_OK) or not all(
            os.stat(d).st_mode & 0o001 for d in pathlib.Path(dserve_bin).parents):
        pytest.skip("the dserve binary is not reachable by another user")
    for nproc in (1, 2, 3, 5, 8):  # failing at the engine, in serve, in the workers, in I/O
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "prlimit", f"--nproc={nproc}", str(dserve_bin), "serve", str(model),
                            "--port", str(server_util.free_port()), "--threads", "1",
                            "--host", "127.0.0.1"],
                           capture_output=True, text=True, timeout=120)
        errors = [line for line in r.stderr.splitlines() if line.startswith("dserve: error:")]
        assert r.returncode != 0 and len(errors) == 1, (nproc, r.stderr[-2000:])
        # Whichever thread could not be made (the engine's included) is named.
        assert "cannot create" in errors[0] and "RLIMIT_NPROC" in errors[0], errors


@pytest.mark.parametrize("value", ["9.3e9", "-1", "inf"])
def test_out_of_range_shutdown_timeout_is_refused(dserve_bin, default_model, value):
    r = subprocess.run([str(dserve_bin), "serve", str(default_model), "--shutdown-timeout", value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--shutdown-timeout" in r.stderr, r.stderr


# 4. Body limits for every framing, as bytes arrive.
def test_chunked_body_over_the_limit_is_413_with_memory_bounded(server):
    rss_before = rss_bytes(server.proc.pid)
    chunk = b"x" * (64 << 10)
    clients = []
    for _ in range(4):
        c = connect(server)
        c.sendall(b"POST /tokenize HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                  b"Content-Type: application/json\r\n\r\n")
        clients.append(c)
    statuses = []
    for c in clients:
        sent = 0
        try:
            while sent < (64 << 20):  # 64 MiB offered, 1 MiB allowed
                c.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        c.settimeout(10)
        statuses.append(read_response(c.makefile("rb"))[0])
        c.close()
    assert statuses == [413] * 4
    grown = rss_bytes(server.proc.pid) - rss_before
    assert grown < 4 * MAX_BODY + (32 << 20), grown


def test_content_length_over_the_limit_is_413_before_the_body(server):
    c = connect(server)
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
    status, headers, body = read_response(c.makefile("rb"))
    assert_openai_error(status, body, 413)
    c.close()


def test_body_without_length_is_411(server):
    # RFC 9112 6.3: a request with neither Content-Length nor chunked framing has no
    # body; one sent anyway cannot be delimited.
    c = connect(server)
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n\r\n"
              + b"{" * (256 << 10))
    status, _, body = read_response(c.makefile("rb"))
    assert_openai_error(status, body, 411)
    c.close()


# 5. Header count and size limits, before authentication or routing.
def test_a_million_headers_are_refused_early(server):
    rss_before = rss_bytes(server.proc.pid)
    c = connect(server)
    c.sendall(b"GET /v1/models HTTP/1.1\r\n")
    sent = 0
    try:
        for _ in range(1000):
            c.sendall(b"X-A: b\r\n" * 1000)  # a million fields, 8 MB
            sent += 1
    except (BrokenPipeError, ConnectionResetError):
        pass
    c.settimeout(10)
    status, _, body = read_response(c.makefile("rb"))
    assert_openai_error(status, body, 431)
    assert sent < 1000  # refused while they were still coming
    c.close()
    many = connect(server)
    many.sendall(b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101))
                 + b"\r\n")
    assert read_response(many.makefile("rb"))[0] == 431
    many.close()
    assert rss_bytes(server.proc.pid) - rss_before < (16 << 20)


# 6. Idle keep-alive connections wait in the kernel, not in a polling thread.
def test_idle_connections_cost_almost_no_cpu(server):
    raise_fd_limit(4096)
    conns = []
    try:
        for _ in range(1000):
            c = connect(server)
            c.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            conns.append(c)
        for c in conns:
            assert c.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)
        before = cpu_seconds(server.proc.pid)
        time.sleep(3)
        used = cpu_seconds(server.proc.pid) - before
        assert used < 0.05 * 3, used
        status, _, _ = request(server, "GET", "/health")  # still served
        assert status == 200
    finally:
        for c in conns:
            c.close()


# 7. A client that leaves has its request aborted within an engine step.
def wait_for(pred, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("stream", [False, True])
def test_abandoned_request_is_aborted(server, stream):
    aborted = sample(server, "vllm:request_success", finished_reason="abort")
    body = json.dumps({**LONG, "stream": stream}).encode()
    c = connect(server)
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert wait_for(lambda: sample(server, "vllm:num_requests_running") >= 1)
    time.sleep(0.3)
    c.close()
    assert wait_for(lambda: sample(server, "vllm:request_success",
                                   finished_reason="abort") == aborted + 1, timeout=5)
    tokens = sample(server, "vllm:generation_tokens")
    time.sleep(0.5)
    assert sample(server, "vllm:generation_tokens") == tokens  # nothing runs for nobody
    assert sample(server, "vllm:num_requests_running") == 0


def test_abandoned_queued_request_is_aborted_before_it_runs(dserve_bin, default_model, tmp_path):
    with server_util.running(dserve_bin, default_model, "--max-num-seqs", 1,
                             log_path=tmp_path / "s.log") as s:
        def post(body):
            c = connect(s)
            data = json.dumps(body).encode()
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
            return c
        running = post({**LONG, "stream": True})
        assert wait_for(lambda: sample(s, "vllm:num_requests_running") == 1)
        for stream in (False, True):
            queued = post({**LONG, "stream": stream})
            assert wait_for(lambda: sample(s, "vllm:num_requests_waiting") == 1)
            aborted = sample(s, "vllm:request_success", finished_reason="abort")
            queued.close()
            assert wait_for(lambda: sample(s, "vllm:request_success", finished_reason="abort")
                            == aborted + 1, timeout=5)
            # (the gauges move with the engine's next stats, just after the count)
            assert wait_for(lambda: sample(s, "vllm:num_requests_waiting") == 0, timeout=5)
            assert sample(s, "vllm:num_requests_running") == 1  # the other one runs on
        running.close()


# 8. Load shedding: beyond the waiting limit, 503 with Retry-After at once.
def test_overload_beyond_max_waiting_requests_is_503(dserve_bin, default_model, tmp_path):
    n_waiting, k = 2, 3
    with server_util.running(dserve_bin, default_model, "--max-num-seqs", 1,
                             "--max-waiting-requests", n_waiting, "--max-connections", 32,
                             log_path=tmp_path / "s.log") as s:
        body = json.dumps({**LONG, "stream": True}).encode()

        def send():
            c = connect(s, timeout=30)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            f = c.makefile("rb")
            line = f.readline()
            headers = {}
            while (h := f.readline()) not in (b"\r\n", b""):
                key, v = h.decode().split(":", 1)
                headers[key.strip().lower()] = v.strip()
            return c, int(line.split()[1]), headers

        with cf.ThreadPoolExecutor(1 + n_waiting + k) as pool:
            results = list(pool.map(lambda _: send(), range(1 + n_waiting + k)))
        refused = [h for _, st, h in results if st == 503]
        assert len(refused) == k and all(h.get("retry-after") for h in refused), results
        assert sorted(st for _, st, _ in results) == [200] * (1 + n_waiting) + [503] * k
        for path in ("/health", "/metrics"):  # answered ahead of the inference work
            t = time.perf_counter()
            assert request(s, "GET", path)[0] == 200
            assert time.perf_counter() - t < 0.5, path
        assert sample(s, "dserve:http_requests_rejected",
                      reason="max_waiting_requests") == k
        # Beyond --max-connections: 503 before reading anything.
        held = [connect(s) for _ in range(32 - len(results))]
        # The server notices the closes of the requests above (/health, /metrics) a
        # moment later, so the limit may bite a connection or two further on: the
        # first connection answered at all must be the 503; those it still accepted
        # (no answer: it waits for a request) are held too.
        st, h = None, {}
        for _ in range(4):
            extra = connect(s)
            extra.settimeout(1)
            try:
                st, h, _ = read_response(extra.makefile("rb"))
                break
            except TimeoutError:
                held.append(extra)
        assert st == 503 and h.get("retry-after")
        for c in held + [extra] + [r[0] for r in results]:
            c.close()

        def idle():
            try:
                return (sample(s, "vllm:num_requests_running") == 0
                        and sample(s, "vllm:num_requests_waiting") == 0)
            except (AssertionError, OSError):  # a 503 while the closes are noticed
                return False
        assert wait_for(idle, timeout=10)


# 9. Pipelining, half-close, 405.
def test_pipelined_requests_are_answered_in_order(server):
    c = connect(server)
    tok = json.dumps({"prompt": "Hello world"}).encode()
    c.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
              b"POST /tokenize HTTP/1.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s"
              b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (len(tok), tok))
    f = c.makefile("rb")
    first, second, third = read_response(f), read_response(f), read_response(f)
    assert first[0] == 200 and "version" in json.loads(first[2])
    assert second[0] == 200 and json.loads(second[2])["count"] >= 2
    assert third[0] == 200 and third[1].get("connection") == "close"
    assert f.read() == b""
    c.close()


def test_half_closed_client_gets_its_responses(server):
    c = connect(server)
    tok = json.dumps({"prompt": "Hello world"}).encode()
    c.sendall(b"POST /tokenize HTTP/1.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%sGET /version HTTP/1.1\r\n\r\n" % (len(tok), tok))
    c.shutdown(socket.SHUT_WR)
    f = c.makefile("rb")
    status, _, body = read_response(f)
    assert status == 200 and json.loads(body)["count"] >= 2
    status, _, body = read_response(f)
    assert status == 200 and "version" in json.loads(body)
    assert f.read() == b""  # then closed
    c.close()


@pytest.mark.parametrize("method, path, allow", [
    ("GET", "/v1/completions", "POST"), ("GET", "/v1/chat/completions", "POST"),
    ("POST", "/health", "GET"), ("DELETE", "/v1/models", "GET")])
def test_wrong_method_is_405_with_allow(server, method, path, allow):
    status, headers, body = request(server, method, path, body=b"{}" if method == "POST" else None)
    assert_openai_error(status, body, 405)
    assert headers["allow"] == allow


# 10. Exclusive bind.
def test_second_server_on_a_busy_port_is_refused(dserve_bin, default_model, server):
    r = subprocess.run([str(dserve_bin), "serve", str(default_model), "--host", "127.0.0.1",
                        "--port", str(server.port)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "cannot listen" in r.stderr and "in use" in r.stderr, r.stderr
    assert request(server, "GET", "/health")[0] == 200


# TLS: the openai SDK against a certificate made here by the openssl CLI.
def test_openai_sdk_over_tls(dserve_bin, default_model, tmp_path):
    import httpx
    import openai
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    port = server_util.free_port()
    log = open(tmp_path / "s.log", "w")
    proc = subprocess.Popen([str(dserve_bin), "serve", str(default_model), "--host", "127.0.0.1",
                             "--port", str(port), "--ssl-certfile", str(cert), "--ssl-keyfile",
                             str(key), "--served-model-name", "m"], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        deadline = time.time() + 120
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
                    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                        version = tls.version()
                break
            except (OSError, ssl.SSLError):
                assert proc.poll() is None and time.time() < deadline, open(tmp_path / "s.log").read()
                time.sleep(0.3)
        assert version in ("TLSv1.2", "TLSv1.3")
        client = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="x",
                               http_client=httpx.Client(verify=ctx))
        assert [m.id for m in client.models.list()] == ["m"]
        out = client.completions.create(model="m", prompt="Hello", max_tokens=4)
        assert out.usage.completion_tokens == 4
        chunks = list(client.completions.create(model="m", prompt="Hello", max_tokens=3,
                                                stream=True))
        assert sum(1 for c in chunks if c.choices and c.choices[0].text) >= 1
        # A client that offers at most TLS 1.1 is refused.
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
        try:
            old.minimum_version = ssl.TLSVersion.TLSv1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
        except (ValueError, ssl.SSLError):
            pytest.skip("this Python's OpenSSL cannot offer TLS 1.1")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with pytest.raises((ssl.SSLError, ConnectionResetError)):
                old.wrap_socket(raw, server_hostname="127.0.0.1")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_bad_tls_files_are_a_clear_start_up_error(dserve_bin, default_model, tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_text("not a certificate\n")
    r = subprocess.run([str(dserve_bin), "serve", str(default_model), "--port",
                        str(server_util.free_port()), "--ssl-certfile", str(cert),
                        "--ssl-keyfile", str(cert)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--ssl-certfile" in r.stderr, r.stderr
