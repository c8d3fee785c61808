#!/usr/bin/env python3
"""DeepSeek-R1 at its real widths, side by side: dserve, llama.cpp and (when a build of
it is given) ik_llama.cpp on the same GGUF file and threads (a benchmark, not a test).

The model is tools/make_r1_layers.py's reduced-depth R1 (hidden 7168, 128 heads, MLA
512 + 64, 256 experts of 2048, top-8; 1 dense + N-1 MoE layers) as Q8_0. For each
thread count, one configuration at a time, the engines alternating:
  - decode at depth D (tokens/s over --decode tokens after a D-token prompt): dserve's
    serving engine (`bench throughput`, its paged F16 and FP8 latent caches; the
    decode phase it reports, once every sequence has its first token),
    llama-bench `-p 0 -n T -d D`, ik_llama.cpp's llama-bench `-gp D,T`;
  - prompt processing of P tokens: dserve `bench throughput --warmup` (one prompt, one
    output token, after another prompt of P tokens as llama-bench's warm-up run),
    llama-bench `-p P -n 0`;
  - C concurrent decodes (128-token prompts, --decode tokens each): dserve as above
    with C copies of one prompt (--identical-requests: as llama-batched-bench, every
    sequence's tokens go to the same experts) and, beside them, C distinct prompts;
    against llama-batched-bench `-npp 128 -ntg T -npl C` (its S_TG, generation
    tokens/s).
  - --repeats N (decode rows): the engines alternate N times and the row reports each
    engine's median, every run kept in the JSON (this 2-core host's speed swings by
    tens of percent over minutes; a median of alternations is steadier than one run);
  - long contexts (--long-depths, the first thread count only): dserve's decode at
    each depth with F16 and FP8 latents, its prefill of the depth's prompt timed as
    well (the whole context served through the engine, end to end); llama.cpp and
    ik_llama.cpp (--long-anchors) at the long depths up to --long-anchors-up-to (their
    prefill of tens of thousands of tokens takes tens of minutes here), last.
ik_llama.cpp runs with its recommended DeepSeek flags: -mla 3 -fa 1 -fmoe 1 -rtr 1.
Prints a markdown table (engine figures and dserve's ratio to each) and writes JSON.

  .venv/bin/python tools/bench_r1.py --gguf R1.Q8_0.gguf --llama-bin DIR [--ik-bin DIR]
      [--threads 1 2] [--depths 0 4096] [--prompts 512 4096] [--concurrency 8 32]
      [--decode 64 --repeats 3]
      [--long-depths 16384 32768 --long-anchors-up-to 16384]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

IK_FLAGS = ["-mla", "3", "-fa", "1", "-fmoe", "1", "-rtr", "1"]


def run(cmd, cwd=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace",
                       cwd=cwd)
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return r


def warm(path):
    """Reads the model file into the page cache: an engine that loads a repacked copy
    (ik_llama.cpp's -rtr) may have pushed part of it out, and every engine's run must
    start with it in memory, not on disk."""
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def dserve_throughput(a, threads, n, input_len, output_len, kv_dtype, identical=False,
                      warmup=False):
    """`dserve bench throughput`'s JSON for n prompts of input_len random tokens and
    output_len tokens each, through the serving engine (paged cache of kv_dtype);
    identical: n copies of one prompt and sampling seed (--identical-requests); warmup:
    other prompts of the same shape run first (--warmup)."""
    out = f"/tmp/bench_r1_throughput_{n}_{input_len}_{output_len}.json"
    warm(a.gguf)
    run([a.dserve, "bench", "throughput", "--model", a.gguf, "--threads", threads,
         "--num-prompts", n, "--input-len", input_len, "--output-len", output_len,
         "--max-num-seqs", n, "--kv-cache-dtype", kv_dtype, "--no-enable-prefix-caching",
         "--max-model-len", input_len + output_len, "--kv-cache-memory", 1 << 30,
         "--output-json", out] + (["--identical-requests"] if identical else [])
        + (["--warmup"] if warmup else []))
    with open(out) as f:
        return json.load(f)


def dserve_decode(a, threads, n, depth, kv_dtype, full=False, identical=False):
    """Decode tokens/s of n sequences at `depth`: the engine's decode phase (once every
    sequence has its first token) of --decode + 1 tokens each (full: the whole JSON)."""
    j = dserve_throughput(a, threads, n, max(depth, 1), a.decode + 1, kv_dtype, identical)
    return j if full else j["decode_tokens_per_second"]


def dserve_prompt(a, threads, n_prompt):
    """Prompt tokens/s: one prompt and one output token, after a warm-up prompt of the
    same length (llama-bench's prompt runs are preceded by one too)."""
    return n_prompt / dserve_throughput(a, threads, 1, n_prompt, 1, "float16",
                                        warmup=True)["elapsed_time"]


def llama_bench(bin_dir, model, threads, args):
    warm(model)
    r = run([f"{bin_dir}/llama-bench", "-m", model, "-t", threads, "-r", 1, "-o", "json"] + args,
            cwd=tempfile.gettempdir())
    rows = json.loads(r.stdout)
    return rows[-1]["avg_ts"]


def batched_bench(bin_dir, model, threads, n, n_decode, extra=()):
    warm(model)
    r = run([f"{bin_dir}/llama-batched-bench", "-m", model, "-t", threads, "-c",
             n * (128 + n_decode) + 64, "-npp", 128, "-ntg", n_decode, "-npl", n, *extra],
            cwd=tempfile.gettempdir())  # its llama.log lands in the working directory
    # The table's last row: |PP|TG|B|N_KV|T_PP s|S_PP t/s|T_TG s|S_TG t/s|T s|S t/s|
    rows = [line for line in (r.stdout + r.stderr).splitlines()
            if re.match(r"\|\s*\d+\s*\|", line)]
    if not rows:
        raise SystemExit("llama-batched-bench: no table:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    return float(rows[-1].split("|")[8])


def alternate(engines, repeats):
    """Runs each engine's measurement in turn, `repeats` rounds: each engine's median
    as its figure, and every run under "<engine>_runs"."""
    runs = {k: [] for k in engines}
    for _ in range(repeats):
        for k, measure in engines.items():
            runs[k].append(measure())
    f = {k: statistics.median(v) for k, v in runs.items()}
    if repeats > 1:
        f.update({k + "_runs": v for k, v in runs.items()})
    return f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dserve", default="build/dserve")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--ik-bin")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--depths", type=int, nargs="*", default=[0, 4096])
    ap.add_argument("--prompts", type=int, nargs="*", default=[512, 4096])
    ap.add_argument("--concurrency", type=int, nargs="*", default=[8, 32])
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1,
                    help="decode rows: alternate the engines this many times, report medians")
    ap.add_argument("--long-depths", type=int, nargs="*", default=[])
    ap.add_argument("--long-anchors-up-to", type=int, default=0)
    ap.add_argument("--long-latents", nargs="+", default=["float16", "fp8"],
                    choices=["float16", "fp8"])
    ap.add_argument("--long-anchors", nargs="*", default=["ik_llama.cpp"],
                    choices=["ik_llama.cpp", "llama.cpp"])
    ap.add_argument("--json", default="/tmp/bench_r1.json")
    a = ap.parse_args()
    # The llama.cpp tools run in a temporary directory (their logs land there).
    a.gguf, a.llama_bin = os.path.abspath(a.gguf), os.path.abspath(a.llama_bin)
    a.ik_bin = os.path.abspath(a.ik_bin) if a.ik_bin else None
    rows = []

    def report(threads, test, figures):
        rows.append({"threads": threads, "test": test, **figures})
        print(json.dumps(rows[-1]), flush=True)
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)

    def standard(t):
        for d in a.depths:
            engines = {
                "dserve": lambda: dserve_decode(a, t, 1, d, "float16"),
                "dserve_fp8": lambda: dserve_decode(a, t, 1, d, "fp8"),
                "llama.cpp": lambda: llama_bench(a.llama_bin, a.gguf, t,
                                                 ["-p", 0, "-n", a.decode, "-d", d])}
            if a.ik_bin:
                engines["ik_llama.cpp"] = lambda: llama_bench(
                    a.ik_bin, a.gguf, t, ["-p", 0, "-n", 0, "-gp", f"{d},{a.decode}"] + IK_FLAGS)
            report(t, f"decode @ depth {d}", alternate(engines, a.repeats))
        for p in a.prompts:
            f = {}
            f["dserve"] = dserve_prompt(a, t, p)
            f["llama.cpp"] = llama_bench(a.llama_bin, a.gguf, t, ["-p", p, "-n", 0])
            if a.ik_bin:
                f["ik_llama.cpp"] = llama_bench(a.ik_bin, a.gguf, t, ["-p", p, "-n", 0] + IK_FLAGS)
            report(t, f"prompt {p}", f)
        for c in a.concurrency:
            # llama-batched-bench decodes c copies of one prompt, whose tokens then go
            # to the same experts: dserve likewise (--identical-requests) for the
            # ratios, and with c distinct prompts (c times the experts) beside them.
            f = {"dserve": dserve_decode(a, t, c, 128, "float16", identical=True),
                 "dserve_distinct": dserve_decode(a, t, c, 128, "float16"),
                 "llama.cpp": batched_bench(a.llama_bin, a.gguf, t, c, a.decode)}
            if a.ik_bin:
                f["ik_llama.cpp"] = batched_bench(a.ik_bin, a.gguf, t, c, a.decode,
                                                  ["-mla", 3, "-fa", "on", "-rtr"])
            report(t, f"{c} concurrent decodes", f)

    def long_contexts(t):
        for d in a.long_depths:
            f = {}
            for dtype, key in (("float16", "dserve"), ("fp8", "dserve_fp8")):
                if dtype not in a.long_latents:
                    continue
                j = dserve_decode(a, t, 1, d, dtype, full=True)
                f[key] = j["decode_tokens_per_second"]
                # The run's time less its decode phase: the prefill of the d-token prompt.
                f[key + "_prefill_s"] = j["elapsed_time"] - j["decode_seconds"]
            report(t, f"decode @ depth {d}", f)

    def long_anchors(t):
        for d in a.long_depths:
            if d > a.long_anchors_up_to:
                continue
            f = {}
            # ik_llama.cpp, the faster anchor, first: llama.cpp's prefill takes longest.
            if a.ik_bin and "ik_llama.cpp" in a.long_anchors:
                f["ik_llama.cpp"] = llama_bench(a.ik_bin, a.gguf, t,
                                                ["-p", 0, "-n", 0, "-gp", f"{d},{a.decode}"] + IK_FLAGS)
                print(json.dumps(f), flush=True)
            if "llama.cpp" in a.long_anchors:
                f["llama.cpp"] = llama_bench(a.llama_bin, a.gguf, t,
                                             ["-p", 0, "-n", a.decode, "-d", d])
            report(t, f"anchors: decode @ depth {d}", f)

    # The figures that matter most first, so that a cut-short run still has them.
    standard(a.threads[0])
    long_contexts(a.threads[0])
    for t in a.threads[1:]:
        standard(t)
    long_anchors(a.threads[0])
    print("\n| threads | test | dserve | dserve fp8 latents | dserve distinct prompts "
          "| llama.cpp | ik_llama.cpp | dserve / llama.cpp | dserve / ik_llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def cell(k):
            return f"{r[k]:.2f}" if k in r else "-"
        def ratio(k):
            return f"{r['dserve'] / r[k]:.2f}x" if "dserve" in r and r.get(k) else "-"
        print(f"| {r['threads']} | {r['test']} | {cell('dserve')} | {cell('dserve_fp8')} "
              f"| {cell('dserve_distinct')} | {cell('llama.cpp')} | {cell('ik_llama.cpp')} | {ratio('llama.cpp')} "
              f"| {ratio('ik_llama.cpp')} |")


if __name__ == "__main__":
    sys.exit(main())
