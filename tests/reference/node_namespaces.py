"""Machines for fault tests, made on this one: each "node" is a network namespace joined
to a bridge in this (the root) namespace by a veth pair, so its processes reach the
others only through that link, and the link can be taken down (`ip link set ... down`)
as a cable pulled out. Addresses are 10.77.X.1 here (on the bridge) and 10.77.X.k+1 on
node k, X chosen per network. A CpuThrottle puts processes in a cgroup with a CPU quota
(cgroup v1's cpu controller, or v2's cpu.max): a slow node.

Everything is named after this process's pid (dsf<pid>...), made under a lock file so
that parallel runs pick different subnets, and removed by close(); leftovers of a run
that was killed (its pid gone) are removed by the next one. Needs root and iproute2.
"""
import contextlib
import fcntl
import os
import pathlib
import re
import signal
import subprocess
import time

_LOCK = "/tmp/dserve-test-netns.lock"
_PREFIX = "dsf"


def _ip(*args, check=True):
    r = subprocess.run(["ip", *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(map(str, args))}: {r.stderr.strip()}")
    return r.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_all(pids):
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _netns_pids(name):
    return [int(p) for p in _ip("netns", "pids", name, check=False).split()]


def _remove_leftovers():
    """Namespaces and bridges of runs whose process is gone (killed before its cleanup)."""
    for line in _ip("netns", "list").splitlines():
        m = re.match(rf"({_PREFIX}(\d+)[a-z]n\d+)\b", line)
        if m and not _alive(int(m.group(2))):
            _kill_all(_netns_pids(m.group(1)))
            _ip("netns", "del", m.group(1), check=False)
    for m in re.finditer(rf"\d+: ({_PREFIX}(\d+)[a-z][bhi]\d*)[@:]", _ip("-o", "link", "show")):
        if not _alive(int(m.group(2))):
            _ip("link", "del", m.group(1), check=False)
    for root in (pathlib.Path("/sys/fs/cgroup/cpu"), pathlib.Path("/sys/fs/cgroup")):
        for d in root.glob(f"{_PREFIX}*-*") if root.is_dir() else []:
            m = re.match(rf"{_PREFIX}(\d+)-", d.name)
            if m and not _alive(int(m.group(1))):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (root / "cgroup.procs").write_text(pid)
                with contextlib.suppress(OSError):
                    d.rmdir()


class Node:
    """One namespace of a NodeNetwork."""

    def __init__(self, network, k):
        self.network, self.k = network, k
        self.name = f"{network.tag}n{k}"        # the namespace
        self.host_link = f"{network.tag}h{k}"   # its veth end on the bridge (here)
        self.address = f"{network.prefix}.{k + 1}"

    def command(self, args):
        """args run inside this node (`ip netns exec` execs them: same pid)."""
        return ["ip", "netns", "exec", self.name, *map(str, args)]

    def link(self, up: bool):
        _ip("link", "set", self.host_link, "up" if up else "down")

    def pids(self):
        return _netns_pids(self.name)


class NodeNetwork:
    """A bridge here (10.77.X.1/24) and `n` nodes on it."""

    def __init__(self, n: int):
        self.tag = f"{_PREFIX}{os.getpid()}{chr(ord('a') + NodeNetwork._count % 26)}"
        NodeNetwork._count += 1
        self.bridge = f"{self.tag}b"
        self.nodes = []
        with open(_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _remove_leftovers()
            used = set(re.findall(r"inet 10\.77\.(\d+)\.", _ip("-o", "-4", "addr", "show")))
            free = [x for x in range(1, 255) if str(x) not in used]
            if not free:
                raise RuntimeError("no free 10.77.X.0/24 subnet on this machine")
            self.prefix = f"10.77.{free[os.getpid() % len(free)]}"
            self.address = f"{self.prefix}.1"
            try:
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
                _ip("link", "set", self.bridge, "up")
                for k in range(1, n + 1):
                    self._add_node(k)
            except Exception:
                self.close()
                raise

    _count = 0

    def _add_node(self, k):
        node = Node(self, k)
        self.nodes.append(node)
        inner = f"{self.tag}i{k}"
        _ip("netns", "add", node.name)
        _ip("link", "add", node.host_link, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", node.name)
        _ip("link", "set", node.host_link, "master", self.bridge, "up")
        _ip("-n", node.name, "addr", "add", f"{node.address}/24", "dev", inner)
        _ip("-n", node.name, "link", "set", inner, "up")
        _ip("-n", node.name, "link", "set", "lo", "up")

    def close(self):
        """Kills whatever still runs inside the nodes and removes them and the bridge."""
        for node in self.nodes:
            _kill_all(node.pids())
        for node in self.nodes:
            _ip("link", "del", node.host_link, check=False)  # both ends of the pair
            _ip("netns", "del", node.name, check=False)
        _ip("link", "del", self.bridge, check=False)


class CpuThrottle:
    """A cgroup whose processes get `quota_us` of CPU time per `period_us`."""

    def __init__(self, name: str):
        v1 = pathlib.Path("/sys/fs/cgroup/cpu")
        if (v1 / "cpu.cfs_quota_us").exists():
            self.root, self.v2 = v1, False
        else:
            self.root, self.v2 = pathlib.Path("/sys/fs/cgroup"), True
            if "cpu" not in (self.root / "cgroup.controllers").read_text().split():
                raise RuntimeError("cgroup v2 without the cpu controller")
            (self.root / "cgroup.subtree_control").write_text("+cpu")
        self.path = self.root / f"{_PREFIX}{os.getpid()}-{name}"
        self.path.mkdir()

    def add(self, pid: int):
        (self.path / "cgroup.procs").write_text(str(pid))

    def limit(self, quota_us: int, period_us: int):
        if self.v2:
            (self.path / "cpu.max").write_text(f"{quota_us} {period_us}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))

    def lift(self):
        if self.v2:
            (self.path / "cpu.max").write_text("max")
        else:
            (self.path / "cpu.cfs_quota_us").write_text("-1")

    def close(self):
        """Lifts the limit, moves whatever is left back to the root and removes the cgroup."""
        with contextlib.suppress(OSError):
            self.lift()
        for _ in range(50):
            pids = (self.path / "cgroup.procs").read_text().split()
            for pid in pids:
                with contextlib.suppress(OSError):
                    (self.root / "cgroup.procs").write_text(pid)
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"could not remove cgroup {self.path}")
