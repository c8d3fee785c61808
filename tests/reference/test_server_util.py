"""server_util.free_port_run, against the kernel: the ports it hands out lie outside the
range the kernel gives away by itself (/proc/sys/net/ipv4/ip_local_port_range), every
one binds, and no two runs overlap. (A port inside that range flaked the multi-process
tests: a gloo rank's listening socket took the port the test was polling.)"""
import socket

import server_util


def kernel_range():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    return low, high


def test_runs_are_free_disjoint_and_outside_the_ephemeral_range():
    low, high = kernel_range()
    taken = set()
    for n in (1, 2, 3, 1, 2, 3) * 10:
        p = server_util.free_port_run(n)
        ports = set(range(p, p + n))
        assert all(q < low or q > high for q in ports), (p, n, low, high)
        assert not ports & taken, f"{sorted(ports)} overlaps an earlier run"
        taken |= ports
        for q in ports:
            with socket.socket() as s:
                s.bind(("0.0.0.0", q))


def test_kernel_chosen_ports_never_collide_with_ours():
    """What the kernel picks for a socket bound to port 0 (as gloo's pairs bind) is in
    its range, so never a port a test took."""
    low, high = kernel_range()
    ours = {server_util.free_port() for _ in range(50)}
    socks = []
    try:
        for reuse in (0, 1) * 50:
            s = socket.socket()
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            assert low <= port <= high and port not in ours
    finally:
        for s in socks:
            s.close()
