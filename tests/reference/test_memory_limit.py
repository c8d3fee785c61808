"""`dserve serve` inside a real memory-limited cgroup, as in a container or pod.

The reference is the kernel: a child of this process's memory cgroup (v1 or v2) gets a
limit, the server is moved into it before it execs (`echo $$ > cgroup.procs`), and
the kernel's own counters say whether it ran there (memory.max_usage_in_bytes /
memory.peak) and whether anything was OOM-killed (memory.oom_control / memory.events).
With --gpu-memory-utilization 0.9 the server must size its KV cache from the limit, log
which limit it used, serve a burst of requests through the openai SDK and never be
killed; --kv-cache-memory beyond the limit must be a clear start-up error; with
neither flag the default KV cache must shrink to fit. Skipped where no memory cgroup
is writable.
"""
import asyncio
import os
import pathlib
import re
import subprocess
import time
import uuid

import openai
import pytest

import server_util

LIMIT = 768 << 20
SMALL_LIMIT = 512 << 20


def _mounts():
    """(root, mount point, fstype, super options) of each cgroup mount."""
    out = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        f, r = left.split(), right.split()
        if r[0] in ("cgroup", "cgroup2"):
            out.append((f[3], f[4], r[0], r[2].split(",")))
    return out


def _group_dir(group: str, fstype: str, need_option=None):
    for root, point, fs, opts in _mounts():
        if fs != fstype or (need_option and need_option not in opts):
            continue
        if root == "/" or group == root or group.startswith(root + "/"):
            return pathlib.Path(point + (group if root == "/" else group[len(root):]))
    return None


class Cgroup:
    """A child memory cgroup of this process's own, with a limit."""

    def __init__(self, path: pathlib.Path, version: int):
        self.path, self.version = path, version

    def set_limit(self, n: int):
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        (self.path / name).write_text(str(n))

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, value = line.split()
            if key == "oom_kill":
                return int(value)
        raise AssertionError(f"no oom_kill counter in {self.path / name}")

    def peak_usage(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return int((self.path / name).read_text())

    def wrapper(self) -> list[str]:
        """A command prefix that moves itself into the group, then execs the rest."""
        return ["sh", "-c", f'echo $$ > "{self.path}/cgroup.procs" && exec "$@"', "sh"]


def _make_child() -> Cgroup:
    """Creates a child of this process's memory cgroup; skips if none is writable."""
    groups = {}
    for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            groups[2] = path
        elif "memory" in controllers.split(","):
            groups[1] = path
    reasons = []
    name = f"dserve-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    for version in (2, 1):
        if version not in groups:
            reasons.append(f"no cgroup v{version} memory group in /proc/self/cgroup")
            continue
        parent = _group_dir(groups[version], "cgroup2" if version == 2 else "cgroup",
                            None if version == 2 else "memory")
        if parent is None or not parent.is_dir():
            reasons.append(f"v{version}: the group's directory is not mounted")
            continue
        if version == 2 and "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            reasons.append(f"v2: {parent} does not delegate the memory controller")
            continue
        try:
            (parent / name).mkdir()
        except OSError as e:
            reasons.append(f"v{version}: cannot create a child of {parent}: {e}")
            continue
        return Cgroup(parent / name, version)
    pytest.skip("no writable memory cgroup: " + "; ".join(reasons))


@pytest.fixture
def cgroup():
    cg = _make_child()
    try:
        yield cg
    finally:
        # The server has exited (server_util.stop, or a start-up error): the group is
        # empty and can go.
        for _ in range(50):
            try:
                cg.path.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert not cg.path.exists(), f"{cg.path} left behind"


def _kv_mib(log: str) -> float:
    m = re.search(r"KV cache: \d+ blocks of \d+ tokens = \d+ tokens, ([\d.]+) MiB", log)
    assert m, log[-2000:]
    return float(m.group(1))


async def _burst(server, n=16, max_tokens=48):
    """n concurrent completions (some with long prompts): each must give max_tokens."""
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0,
                                timeout=300)
    model = (await client.models.list()).data[0].id
    prompts = ["Tell me about the sea. " * (100 if i % 4 == 0 else 2) for i in range(n)]
    replies = await asyncio.gather(*[
        client.completions.create(model=model, prompt=p, max_tokens=max_tokens,
                                  extra_body={"ignore_eos": True}) for p in prompts])
    await client.close()
    for r in replies:
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == max_tokens


def test_serves_within_the_cgroup_limit(cgroup, dserve_bin, default_model, tmp_path):
    cgroup.set_limit(LIMIT)
    server = server_util.start(dserve_bin, default_model, "--gpu-memory-utilization", "0.9",
                               "--log-level", "info", log_path=tmp_path / "serve.log",
                               prefix=cgroup.wrapper())
    try:
        own = pathlib.Path(f"/proc/{server.proc.pid}/cgroup").read_text()
        assert cgroup.path.name in own, own
        log = server.log()
        file = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
        assert (f"memory limit 0.75 GiB (cgroup v{cgroup.version} {file} of {cgroup.path}) x 0.9"
                in log), log[-2000:]
        kv = _kv_mib(log)
        assert 0 < kv < 0.9 * LIMIT / (1 << 20)
        asyncio.run(_burst(server))
        assert server.proc.poll() is None, "the server died"
    finally:
        code = server_util.stop(server)
    assert code == 0, server.log()[-2000:]
    assert cgroup.oom_kills() == 0
    # The kernel charged the server's memory to this group, and held it under the limit.
    assert 64 << 20 < cgroup.peak_usage() <= LIMIT


def test_kv_cache_memory_beyond_the_limit_is_a_startup_error(cgroup, dserve_bin, default_model):
    cgroup.set_limit(SMALL_LIMIT)
    r = subprocess.run([*cgroup.wrapper(), str(dserve_bin), "serve", str(default_model),
                        "--host", "127.0.0.1", "--port", str(server_util.free_port()),
                        "--kv-cache-memory", str(1 << 30)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # an error, not a SIGKILL
    file = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
    assert "more than the memory limit 0.50 GiB" in r.stderr, r.stderr[-2000:]
    assert f"{file} of {cgroup.path}" in r.stderr
    assert "--kv-cache-memory" in r.stderr
    assert cgroup.oom_kills() == 0


def test_default_kv_cache_shrinks_to_fit_the_limit(cgroup, dserve_bin, default_model, tmp_path):
    cgroup.set_limit(LIMIT)
    with server_util.running(dserve_bin, default_model, "--log-level", "info",
                             log_path=tmp_path / "serve.log", prefix=cgroup.wrapper()) as server:
        log = server.log()
        assert "less what 0.9 x the limit lacks" in log, log[-2000:]
        assert _kv_mib(log) < 0.9 * LIMIT / (1 << 20)
        asyncio.run(_burst(server, n=4, max_tokens=16))
    assert cgroup.oom_kills() == 0
