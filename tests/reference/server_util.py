"""Starting and stopping `dserve serve` for tests (used by the server and bench tests)."""
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request

DEFAULT_MODEL = None  # set by the tests' fixtures to the default model's path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port p with p + 1 free too (data parallelism with expert parallelism listens on
    --data-parallel-rpc-port and the next port)."""
    for _ in range(100):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", p + 1))
                return p
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


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


def start(dserve_bin, model, *args, log_path, port=None, env=None, wait_s=300) -> Server:
    port = port or free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([str(dserve_bin), "serve", str(model), "--host", "127.0.0.1",
                             "--port", str(port), *map(str, args)],
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
