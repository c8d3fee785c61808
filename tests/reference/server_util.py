"""Starting and stopping `dserve serve` for tests (used by the server and bench tests)."""
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request

DEFAULT_MODEL = None  # set by the tests' fixtures to the default model's path


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself (bind to port 0, a client's source port)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


# Every port this process has handed out: a later run never overlaps an earlier one, so
# the HTTP, rpc and master ports a test takes one after another stay apart even before
# any of them is bound.
_handed_out: set[int] = set()


def free_port_run(n: int = 1) -> int:
    """A port p with p .. p + n - 1 all free now (data parallelism listens on
    --data-parallel-rpc-port, expert parallelism on the next one or two; engine d's
    tensor-parallel group on --master-port + d).

    The ports lie outside the kernel's ephemeral range. A port the test only learned is
    free (bound and closed) is the kernel's to give away again until dserve binds it: to
    a gloo pair's listening socket (bound to port 0), or as a client's source port. The
    test then polls /health on it, or a rank retries its rendezvous there, and the
    connection lands on that stranger: libgloo's TCP pair takes the first connection
    that reaches its listening socket as its peer, so the real peer is refused and the
    group fails to start."""
    low, high = _ephemeral_range()
    # Below the range when there is room (the usual 32768-60999 leaves 16384-32767),
    # else above it; [lo, hi) holds every port of the run.
    lo, hi = max(1024, low - 16384), low
    if hi - lo < n + 64:
        lo, hi = high + 1, 65536
    if hi - lo < n + 64:
        raise RuntimeError(f"no room outside the ephemeral port range {low}-{high} for {n} ports")
    for _ in range(1000):
        p = random.randrange(lo, hi - n + 1)
        ports = range(p, p + n)
        if any(q in _handed_out for q in ports):
            continue
        try:
            for q in ports:
                # No SO_REUSEADDR: a port still in TIME_WAIT is skipped too.
                with socket.socket() as s:
                    s.bind(("0.0.0.0", q))
        except OSError:
            continue
        _handed_out.update(ports)
        return p
    raise RuntimeError(f"no {n} consecutive free ports in {lo}-{hi - 1}")


def free_port() -> int:
    return free_port_run(1)


class Server:
    def __init__(self, proc, port, log_path):
        self.proc, self.port, self.log_path = proc, port, log_path
        self.base_url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def get(self, path: str, timeout=30) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def metrics(self):
        from prometheus_client.parser import text_string_to_metric_families
        status, body = self.get("/metrics")
        assert status == 200
        return {f.name: f for f in text_string_to_metric_families(body.decode())}


def start(dserve_bin, model, *args, log_path, port=None, env=None, wait_s=300,
          prefix=()) -> Server:
    """Starts `dserve serve` (after the `prefix` command, if any: a wrapper that execs
    it) and waits for /health."""
    port = port or free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([*map(str, prefix), str(dserve_bin), "serve", str(model),
                             "--host", "127.0.0.1", "--port", str(port), *map(str, args)],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    server = Server(proc, port, log_path)
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dserve serve exited {proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if server.get("/health", timeout=2)[0] == 200:
                return server
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"dserve serve did not become healthy:\n{server.log()[-4000:]}")


def stop(server: Server, timeout=60) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


@contextlib.contextmanager
def running(dserve_bin, model, *args, log_path, **kw):
    server = start(dserve_bin, model, *args, log_path=log_path, **kw)
    try:
        yield server
    finally:
        stop(server)


def post_json(server, path, body, timeout=120):
    """POSTs body as JSON to server's path: (HTTP status, decoded JSON reply), error
    statuses included (requests the SDKs would refuse to send, or raise on)."""
    req = urllib.request.Request(server.base_url + path, data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
