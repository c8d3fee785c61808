#!/usr/bin/env python3
"""A soak test of `dserve serve`: mixed load on loopback for --duration seconds
(default one hour), watching the server for growth.

    tools/soak.py --dserve build/dserve --model model.gguf --duration 3600 --json soak.json
    tools/soak.py ... --serve-arg=--kv-cache-memory --serve-arg=268435456   # serve flags

It starts the server, runs --concurrency workers that each send the request mix of
tools/soak_load.py (streams, streams cancelled mid-way, structured output, tool calls,
long prompts, bad requests, slow readers and writers) one after another, and every
--sample-interval seconds samples the server's resident memory (VmRSS), threads and
open file descriptors (/proc/PID) and KV blocks in use (/metrics'
vllm:kv_cache_usage_perc x the blocks of the start-up log). Every response is counted
by scenario and status.

It fails (exit 1) when
  - any response is unexpected (wrong status, malformed body or stream, transport
    error, timeout) or the server exits;
  - after --warmup seconds, the least-squares slope of RSS exceeds --max-rss-slope
    (MiB per hour), of threads --max-thread-slope, of descriptors --max-fd-slope
    (per hour);
  - once the load stops and the server is idle, KV blocks, running or waiting
    requests or HTTP connections are left over.
A short run can only catch fast leaks: the slopes of a 60 s run are noisy, so give it
looser bounds. The summary (start/end RSS, slopes and RSS extrapolated to 72 h,
responses by status, errors by kind) is printed, and written as JSON with --json.
"""
import argparse
import asyncio
import collections
import datetime
import json
import os
import pathlib
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import aiohttp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import soak_load  # noqa: E402

MIB = 1 << 20


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dserve", default="build/dserve", help="the dserve binary")
    p.add_argument("--model", required=True, help="model served (a GGUF file or directory)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="an extra `dserve serve` argument (repeat for more)")
    p.add_argument("--duration", type=float, default=3600, help="seconds of load (3600)")
    p.add_argument("--sample-interval", type=float, default=30, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds before slopes are fitted (default: a sixth of --duration)")
    p.add_argument("--concurrency", type=int, default=8, help="workers sending requests (8)")
    p.add_argument("--max-rss-slope", type=float, default=4.0, help="MiB per hour (4)")
    p.add_argument("--max-thread-slope", type=float, default=1.0, help="threads per hour (1)")
    p.add_argument("--max-fd-slope", type=float, default=4.0, help="descriptors per hour (4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--log", default=None, help="the server's log file (default: a temp file)")
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`dserve serve` on loopback, started and stopped by the soak."""

    def __init__(self, args, log_path: pathlib.Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [args.dserve, "serve", args.model, "--host", "127.0.0.1", "--port",
                        str(self.port), "--log-level", "info", *args.serve_arg]
        self.log_path = log_path
        self.proc = subprocess.Popen(self.command, stdout=open(log_path, "w"),
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"dserve serve exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            self.proc.kill()
            sys.exit(f"dserve serve did not become healthy:\n{self.log()[-3000:]}")
        m = re.search(r"KV cache: (\d+) blocks", self.log())
        self.n_blocks = int(m.group(1)) if m else None
        with urllib.request.urlopen(self.base_url + "/v1/models", timeout=10) as r:
            self.model = json.loads(r.read())["data"][0]["id"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """The /metrics samples summed over engines, by metric name (labels dropped)."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        values = collections.defaultdict(float)
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.split("{")[0].split(" ")[0], line.rsplit(" ", 1)[1]
                values[name] += float(value)
        return values

    def sample(self, t0: float) -> dict:
        proc = pathlib.Path(f"/proc/{self.proc.pid}")
        status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines())
        m = self.metrics()
        usage = m["vllm:kv_cache_usage_perc"]
        return {
            "t_s": round(time.time() - t0, 1),
            "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
            "threads": int(status["Threads"]),
            "fds": len(os.listdir(proc / "fd")),
            "kv_usage": usage,
            "kv_blocks_in_use": round(usage * self.n_blocks) if self.n_blocks else None,
            "running": m["vllm:num_requests_running"],
            "waiting": m["vllm:num_requests_waiting"],
            "http_connections": m["dserve:http_connections"],
            "preemptions": m["vllm:num_preemptions_total"],
        }

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, value) points, in value per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in points) / var * 3600


class Tally:
    """Responses by scenario and label, errors by kind (with a few examples)."""

    def __init__(self):
        self.responses = collections.defaultdict(collections.Counter)
        self.errors = collections.Counter()
        self.examples = collections.defaultdict(list)

    def ok(self, scenario: str, label: str):
        self.responses[scenario][label] += 1

    def error(self, scenario: str, kind: str, detail: str):
        self.responses[scenario]["error"] += 1
        self.errors[kind] += 1
        if len(self.examples[kind]) < 3:
            self.examples[kind].append(f"{scenario}: {detail}")


async def worker(i: int, server: Server, args, deadline: float, tally: Tally):
    rng = random.Random(args.seed * 1000 + i)
    timeout = aiohttp.ClientTimeout(total=soak_load.TIMEOUT_S + 30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = soak_load.Client(session, server.base_url, server.model, rng)
        # Worker i starts with scenario i of the mix, so that with as many workers as
        # scenarios even a short run sends every kind; then the mix is drawn by weight.
        first = soak_load.MIX[i % len(soak_load.MIX)][0]
        while time.time() < deadline and server.proc.poll() is None:
            try:
                scenario, label = await soak_load.run_one(client, first)
                tally.ok(scenario, label)
            except soak_load.LoadError as e:
                tally.error(getattr(e, "scenario", "?"), e.kind, e.detail)
            first = None


async def sampler(server: Server, args, t0: float, deadline: float, samples: list):
    while server.proc.poll() is None:
        samples.append(await asyncio.to_thread(server.sample, t0))
        s = samples[-1]
        print(f"[{s['t_s']:7.0f} s] rss {s['rss_mib']:.1f} MiB, threads {s['threads']}, "
              f"fds {s['fds']}, kv blocks {s['kv_blocks_in_use']}, running {s['running']:.0f}",
              flush=True)
        if time.time() + args.sample_interval > deadline:
            return
        await asyncio.sleep(args.sample_interval)


async def wait_idle(server: Server, t0: float, timeout_s=60) -> dict:
    """The first sample with nothing running or waiting and no connection but the
    scrape's own (or the last tried)."""
    deadline = time.time() + timeout_s
    while True:
        s = await asyncio.to_thread(server.sample, t0)
        idle = s["running"] == 0 and s["waiting"] == 0 and s["http_connections"] <= 1
        if idle or time.time() > deadline:
            return s
        await asyncio.sleep(0.5)


def lscpu_model_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def summarize(args, server: Server, samples: list, idle: dict, tally: Tally, exit_code,
              t_start: str) -> dict:
    warmup = args.warmup if args.warmup is not None else args.duration / 6
    fitted = [s for s in samples if s["t_s"] >= warmup]
    slopes = {key: slope_per_hour([(s["t_s"], s[key]) for s in fitted])
              for key in ("rss_mib", "threads", "fds")}
    failures = []
    if exit_code is not None:
        failures.append(f"the server exited {exit_code} during the load")
    if tally.errors:
        failures.append(f"{sum(tally.errors.values())} unexpected responses")
    if len(fitted) < 3:
        failures.append(f"only {len(fitted)} samples after the {warmup:.0f} s warm-up: "
                        "lengthen --duration or shorten --sample-interval")
    for key, bound, unit in (("rss_mib", args.max_rss_slope, "MiB"),
                             ("threads", args.max_thread_slope, "threads"),
                             ("fds", args.max_fd_slope, "descriptors")):
        if slopes[key] > bound:
            failures.append(f"{key} grows {slopes[key]:.2f} {unit}/h, more than {bound}")
    if idle:
        for key in ("kv_blocks_in_use", "kv_usage", "running", "waiting"):
            if idle[key]:
                failures.append(f"idle after the load, {key} is {idle[key]}, not 0")
        if idle["http_connections"] > 1:  # the /metrics scrape's own connection is open
            failures.append(f"idle after the load, {idle['http_connections']:.0f} HTTP "
                            "connections are open besides the /metrics scrape")
    return {
        "date": t_start,
        "command": " ".join(map(str, server.command)),
        "soak_command": " ".join([sys.argv[0], *sys.argv[1:]]),
        "machine": lscpu_model_name(),
        "cpus": os.cpu_count(),
        "duration_s": args.duration,
        "warmup_s": warmup,
        "concurrency": args.concurrency,
        "kv_blocks": server.n_blocks,
        "rss_start_mib": samples[0]["rss_mib"] if samples else None,
        "rss_after_warmup_mib": fitted[0]["rss_mib"] if fitted else None,
        "rss_end_mib": samples[-1]["rss_mib"] if samples else None,
        "rss_max_mib": max((s["rss_mib"] for s in samples), default=None),
        "rss_slope_mib_per_h": slopes["rss_mib"],
        "rss_slope_72h_mib": slopes["rss_mib"] * 72,
        "thread_slope_per_h": slopes["threads"],
        "fd_slope_per_h": slopes["fds"],
        "idle_after_load": idle,
        "preemptions": (idle or (samples[-1] if samples else {})).get("preemptions"),
        "responses": {k: dict(v) for k, v in sorted(tally.responses.items())},
        "responses_by_status": dict(sum(tally.responses.values(), collections.Counter())),
        "errors_by_kind": dict(tally.errors),
        "error_examples": dict(tally.examples),
        "failures": failures,
        "passed": not failures,
        "samples": samples,
    }


def print_summary(s: dict):
    print(f"\nsoak {s['date']}: {s['duration_s']:.0f} s, {s['concurrency']} workers, "
          f"{s['machine']}")
    print(f"  server: {s['command']}")
    print(f"  RSS {s['rss_start_mib']:.1f} MiB at start, {s['rss_after_warmup_mib']} after the "
          f"{s['warmup_s']:.0f} s warm-up, {s['rss_end_mib']:.1f} at the end "
          f"(max {s['rss_max_mib']:.1f})")
    print(f"  RSS slope {s['rss_slope_mib_per_h']:+.3f} MiB/h -> {s['rss_slope_72h_mib']:+.1f} "
          f"MiB over 72 h; threads {s['thread_slope_per_h']:+.3f}/h, "
          f"descriptors {s['fd_slope_per_h']:+.3f}/h")
    print(f"  idle after the load: {s['idle_after_load']}")
    print(f"  preemptions: {s['preemptions']}")
    print(f"  responses by status: {s['responses_by_status']}")
    for scenario, labels in s["responses"].items():
        print(f"    {scenario}: {labels}")
    print(f"  errors by kind: {s['errors_by_kind'] or 'none'}")
    for kind, examples in s["error_examples"].items():
        for e in examples:
            print(f"    {kind}: {e}")
    print("PASSED" if s["passed"] else "FAILED: " + "; ".join(s["failures"]))


async def soak(args, server: Server) -> tuple[list, dict, Tally]:
    tally, samples = Tally(), []
    t0 = time.time()
    deadline = t0 + args.duration
    tasks = [asyncio.create_task(worker(i, server, args, deadline, tally))
             for i in range(args.concurrency)]
    await sampler(server, args, t0, deadline, samples)
    await asyncio.gather(*tasks)
    idle = await wait_idle(server, t0) if server.proc.poll() is None else {}
    return samples, idle, tally


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    log_path = pathlib.Path(args.log or f"/tmp/dserve-soak-{os.getpid()}.log")
    server = Server(args, log_path)
    try:
        samples, idle, tally = asyncio.run(soak(args, server))
    finally:
        exit_code = server.proc.poll()
        server.stop()
    summary = summarize(args, server, samples, idle, tally, exit_code, t_start)
    print_summary(summary)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
