#!/usr/bin/env python3
"""dserve and llama.cpp side by side on the same GGUF files and threads (make
bench-compare; a benchmark, not a test).

For each model (the default model, and the DeepSeek-V3-shaped MoE model as Q8_0 and
Q4_K_M, made by tools/make_moe_gguf.py with llama.cpp's own converter) and each thread
count (1 and all cores): prompt processing of 512 tokens, and decoding 128 tokens
after 0 and after 512 tokens of context, measured alternately with `dserve generate`
and `llama-bench` (median of REPEATS runs each). Then `dserve serve` against
`llama-server` at 1, 8 and 32 concurrent streams (128 in, 128 out), both loaded by
`dserve bench serve`. Every figure is also given as a fraction of this machine's
limits (build/bench/machine_limits): decode as the weight bytes it reads per second
against the DRAM read bandwidth, prompt processing as the MACs it does per second
against the int8 peak.

  .venv/bin/python tools/bench_compare.py [--dserve build/dserve] [--llama-bin DIR]
      [--llama-src DIR] [--repeats 3] [--threads 1 2] [--skip-serve] [--models ...]
"""
import argparse
import json
import os
import pathlib
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import gguf

CACHE = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
DEFAULT_MODEL = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT_IDS_512 = ",".join(str(1000 + i) for i in range(512))


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, check=True, **kw)


def machine_limits(build, threads, tries=3):
    """(DRAM GB/s, int8 GMAC/s, instruction) at `threads`: the best of `tries` runs, as
    anything else on a shared machine only lowers them (one disturbed run would skew
    every "% of limit" figure)."""
    best = None
    for _ in range(tries):
        out = run([str(build / "bench" / "machine_limits"), "--threads", str(threads)]).stdout
        f = dict(kv.split("=") for kv in out.split())
        got = (float(f["dram_read_GBps"]), float(f["int8_peak_GMACps"]), f["int8_insn"])
        best = got if best is None else (max(best[0], got[0]), max(best[1], got[1]), got[2])
    return best


def active_macs_per_token(path, prompt=False):
    """MACs of one token's matrix products: every 2-D weight once, and of each 3-D
    expert tensor the share the router picks (top-k of n experts). prompt=True leaves
    out the output projection (the vocabulary matrix, or the tied embedding): prompt
    processing computes logits for a prompt's last token only, and counting them for
    all 512 would credit dserve and llama.cpp alike with work neither does (for the
    DeepSeek-shaped model, half the count)."""
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    def field(name, default=None):
        f = r.fields.get(f"{arch}.{name}")
        return int(f.parts[-1][0]) if f is not None else default
    top_k, n_exp = field("expert_used_count", 0), field("expert_count", 0)
    untied = any(x.name == "output.weight" for x in r.tensors)
    output = "output.weight" if untied else "token_embd.weight"
    macs = 0
    for t in r.tensors:
        if t.name == "token_embd.weight" and untied:
            continue  # untied: the embedding is a row lookup, the output matrix is the product
        if prompt and t.name == output:
            continue
        if len(t.shape) == 2:
            macs += int(t.n_elements)
        elif len(t.shape) == 3 and n_exp:
            macs += int(t.n_elements) * top_k // n_exp
    return macs


def dserve_generate(dserve, model, threads, prompt_ids, extra=()):
    """(prompt tok/s, decode tok/s, weight bytes per decoded token) of 128 tokens."""
    r = run([str(dserve), "generate", "--model", str(model), "--prompt-ids", prompt_ids,
             "--max-tokens", "128", "--ignore-eos", "--temperature", "0", "--threads", str(threads),
             *map(str, extra)])
    m = re.search(r"prompt: \d+ tokens in [\d.]+ s \(([\d.]+) tokens/s\); decode: \d+ tokens in "
                  r"[\d.]+ s \(([\d.]+) tokens/s, (\d+) MiB of weights/token", r.stderr)
    if not m:
        raise SystemExit("dserve generate: unexpected output:\n" + r.stderr[-2000:])
    return float(m[1]), float(m[2]), int(m[3]) * 2**20


def llama_bench(bin_dir, model, threads, args):
    r = run([str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-r", "1",
             "-o", "json"] + args)
    return [(x["n_prompt"], x["n_gen"], x.get("n_depth", 0), x["avg_ts"]) for x in json.loads(r.stdout)]


def bench_model(name, model, dserve, bin_dir, threads, repeats, limits):
    prompt_macs = active_macs_per_token(model, prompt=True)
    rows = []
    samples = {k: ([], []) for k in ("pp512", "tg128@d0", "tg128@d512")}
    bytes_per_token = 0
    for _ in range(repeats):  # alternate the two engines so drift hits both alike
        pp, tg512, bytes_per_token = dserve_generate(dserve, model, threads, PROMPT_IDS_512)
        _, tg0, _ = dserve_generate(dserve, model, threads, "1000")
        samples["pp512"][0].append(pp)
        samples["tg128@d512"][0].append(tg512)
        samples["tg128@d0"][0].append(tg0)
        for n_p, n_g, depth, ts in llama_bench(bin_dir, model, threads, ["-p", "512", "-n", "0"]):
            samples["pp512"][1].append(ts)
        for n_p, n_g, depth, ts in llama_bench(bin_dir, model, threads,
                                               ["-p", "0", "-n", "128", "-d", "0,512"]):
            samples[f"tg128@d{depth}"][1].append(ts)
    gbps, gmacs, _ = limits[threads]
    for test, (ds, lc) in samples.items():
        d, l = statistics.median(ds), statistics.median(lc)
        if test == "pp512":
            frac = f"{d * prompt_macs / (gmacs * 1e9):.0%} of int8 peak" if gmacs else ""
        else:
            frac = f"{d * bytes_per_token / (gbps * 1e9):.0%} of DRAM"
        rows.append((name, threads, test, d, l, d / l, frac))
    return rows


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_ready(url, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.5)
    raise SystemExit(f"server at {url} not ready in {timeout} s")


def bench_serve(dserve, port, concurrency, model):
    n = max(8, 2 * concurrency)
    r = run([str(dserve), "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
             "--model", "m", "--tokenizer", str(model), "--dataset-name", "random",
             "--random-input-len", "128", "--random-output-len", "128", "--ignore-eos",
             "--num-prompts", str(n), "--max-concurrency", str(concurrency),
             "--request-rate", "inf", "--disable-tqdm", "--save-result", "--result-dir", "/tmp",
             "--result-filename", f"bench_compare_{port}.json"])
    with open(f"/tmp/bench_compare_{port}.json") as f:
        j = json.load(f)
    if j.get("failed", 0):
        raise SystemExit(f"bench serve: {j['failed']} failed requests\n{r.stdout[-2000:]}")
    return j["output_throughput"], j.get("median_ttft_ms", 0.0)


def serve_compare(dserve, bin_dir, model, threads, levels):
    rows = []
    servers = {
        "dserve": lambda p: [str(dserve), "serve", str(model), "--port", str(p), "--host",
                             "127.0.0.1", "--served-model-name", "m", "--threads", str(threads),
                             "--max-num-seqs", "32"],
        "llama.cpp": lambda p: [str(bin_dir / "llama-server"), "-m", str(model), "--port", str(p),
                                "--host", "127.0.0.1", "-t", str(threads), "-np", "32", "-c",
                                str(32 * 320), "--no-webui", "-a", "m"],
    }
    results = {}
    for name, cmd in servers.items():
        port = free_port()
        proc = subprocess.Popen(cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health", proc)
            for c in levels:
                results[(name, c)] = bench_serve(dserve, port, c, model)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    for c in levels:
        d, l = results[("dserve", c)], results[("llama.cpp", c)]
        rows.append((c, d[0], l[0], d[0] / l[0], d[1], l[1]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dserve", default="build/dserve")
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--llama-src", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count()])
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--models", nargs="+", default=["default", "moe-q8_0", "moe-q4_k_m"])
    args = ap.parse_args()
    dserve = pathlib.Path(args.dserve).resolve()
    build = dserve.parent
    bin_dir = pathlib.Path(args.llama_bin)
    threads = sorted(set(args.threads))

    paths = {"default": DEFAULT_MODEL}
    if any(m.startswith("moe") for m in args.models):
        out = run([sys.executable, str(pathlib.Path(__file__).parent / "make_moe_gguf.py"),
                   args.llama_src, str(bin_dir)]).stdout.split()
        paths["moe-q8_0"], paths["moe-q4_k_m"] = pathlib.Path(out[0]), pathlib.Path(out[1])

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    limits = {t: machine_limits(build, t) for t in threads}
    isa = run([str(dserve), "generate", "--model", str(DEFAULT_MODEL), "--prompt-ids", "1000",
               "--max-tokens", "1", "--log-level", "info"]).stderr
    isa = (re.search(r"cpu-(\w+)", isa) or re.search(r"isa[ =:]+(\w+)", isa) or [None, "?"])[1]
    print(f"cpu: {cpu}, {os.cpu_count()} cores; dserve backend: cpu-{isa}")
    for t in threads:
        gbps, gmacs, insn = limits[t]
        print(f"machine limits, {t} thread(s): DRAM read {gbps:.1f} GB/s, int8 peak {gmacs:.0f} GMAC/s ({insn})")
    print()
    print("| model | threads | test | dserve tok/s | llama.cpp tok/s | ratio | dserve vs limit |")
    print("|---|---|---|---|---|---|---|")
    for m in args.models:
        for t in threads:
            for row in bench_model(m, paths[m], dserve, bin_dir, t, args.repeats, limits):
                print("| {} | {} | {} | {:.1f} | {:.1f} | {:.2f}x | {} |".format(*row), flush=True)
    if not args.skip_serve:
        print()
        print(f"serving, default model, {threads[-1]} threads, 128 in / 128 out, output tok/s "
              "(dserve bench serve as the client):")
        print("| concurrent | dserve serve | llama-server | ratio | dserve TTFT ms | llama TTFT ms |")
        print("|---|---|---|---|---|---|")
        for row in serve_compare(dserve, bin_dir, DEFAULT_MODEL, threads[-1], [1, 8, 32]):
            print("| {} | {:.1f} | {:.1f} | {:.2f}x | {:.0f} | {:.0f} |".format(*row), flush=True)


if __name__ == "__main__":
    main()
