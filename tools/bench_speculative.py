#!/usr/bin/env python3
"""Speculative decoding benchmark (not a test).

1. Prompt lookup (ngram) on the default model, one stream: `dserve serve` with and
   without --speculative-config side by side, each request sent to both in turn
   (alternating, several rounds), greedy, streamed; decode tokens/s (tokens after the
   first over the time after the first) per prompt kind: answers that copy from their
   prompt (rewrites, code edits) and plain chat; the acceptance length from the spec
   server's /metrics over each kind.
2. MTP on a random DeepSeek-V3-shaped model with an MTP layer (tools/bench_deepseek.py's
   shape, 12 layers, plus layer 12 as the MTP module; BF16, cached in
   $DSERVE_CACHE/bench): build/bench/spec_verify_bench, what a verify step of 1 + N
   tokens costs against a 1-token step at 1, 8 and 32 sequences, 1 and 2 threads,
   beside the weight bytes' prediction.

  .venv/bin/python tools/bench_speculative.py [--rounds 3] [--skip-ngram] [--skip-mtp]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "reference"))
sys.path.insert(0, str(REPO / "tools"))

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}
PARAGRAPH = ("The committee met on Tuesday to review the annual budget. After a long "
             "discussion about rising costs, the members agreed to reduce travel expenses by "
             "ten percent and to postpone the purchase of new equipment until next spring.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(values)\n\n\ndef variance(values):\n    m = mean(values)\n"
        "    return sum((v - m) ** 2 for v in values) / len(values)\n")
KINDS = {
    "copy": [f"Rewrite this paragraph with the word 'Tuesday' changed to 'Friday', and "
             f"nothing else changed:\n\n{PARAGRAPH}",
             f"Rename the function mean to average everywhere in this code and show the "
             f"whole code:\n\n{CODE}",
             f"Repeat this text exactly:\n\n{PARAGRAPH}"],
    "chat": ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
             "Explain how a refrigerator works to a ten-year-old.",
             "Give me five ideas for a weekend trip in the mountains."],
}


def cache_dir():
    return pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))


def decode_rate(client, model, prompt, max_tokens):
    """(tokens, decode tokens/s) of one streamed greedy request."""
    times = []
    for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
        if chunk.usage:
            n = chunk.usage.completion_tokens
    return n, (n - 1) / (times[-1] - times[0])


def counter(server, name):
    return sum(s.value for s in server.metrics()[name].samples if s.name.endswith("_total"))


def bench_ngram(args):
    import openai
    import server_util
    model = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    common = ["--threads", 2, "--max-model-len", 2048, "--disable-log-stats"]
    logs = pathlib.Path("/tmp")
    with server_util.running(REPO / "build" / "dserve", model, *common,
                             log_path=logs / "bench-plain.log") as plain, \
            server_util.running(REPO / "build" / "dserve", model, *common, "--speculative-config",
                                json.dumps(NGRAM), log_path=logs / "bench-spec.log") as spec:
        clients = {s: openai.OpenAI(base_url=s.base_url + "/v1", api_key="x") for s in (plain, spec)}
        name = clients[plain].models.list().data[0].id
        print(f"ngram {json.dumps(NGRAM)}, default model, one stream, {args.rounds} rounds")
        print(f"{'kind':<6} {'plain tok/s':<12} {'ngram tok/s':<12} {'speedup':<8} acceptance length")
        for kind, prompts in KINDS.items():
            rates = {plain: [], spec: []}
            d0 = counter(spec, "vllm:spec_decode_num_drafts")
            a0 = counter(spec, "vllm:spec_decode_num_accepted_tokens")
            for _ in range(args.rounds):
                for p in prompts:
                    for s in (plain, spec):
                        rates[s].append(decode_rate(clients[s], name, p, args.max_tokens))
            drafts = counter(spec, "vllm:spec_decode_num_drafts") - d0
            accepted = counter(spec, "vllm:spec_decode_num_accepted_tokens") - a0
            # Tokens over time, summed over the requests (each request's own rate).
            tp = sum(n for n, _ in rates[plain]) / sum(n / r for n, r in rates[plain])
            ts = sum(n for n, _ in rates[spec]) / sum(n / r for n, r in rates[spec])
            length = 1 + accepted / drafts if drafts else float("nan")
            print(f"{kind:<6} {tp:<12.1f} {ts:<12.1f} {ts / tp:<8.3f} {length:.2f} "
                  f"({int(drafts)} drafts)")


def build_mtp_model():
    import torch
    from safetensors.torch import save_file
    import bench_deepseek as bd
    d = cache_dir() / "bench" / "deepseek-v3-shaped-1024x12-e64-mtp"
    if (d / "model.safetensors").exists():
        return d
    c = dict(bd.CONFIG)
    n = c["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)
    tensors = {}
    shapes = dict(bd.shapes(dict(c, num_hidden_layers=n + 1)))
    h = c["hidden_size"]
    shapes.update({f"model.layers.{n}.enorm.weight": (h,), f"model.layers.{n}.hnorm.weight": (h,),
                   f"model.layers.{n}.eh_proj.weight": (h, 2 * h),
                   f"model.layers.{n}.shared_head.norm.weight": (h,),
                   f"model.layers.{n}.shared_head.head.weight": (c["vocab_size"], h)})
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape).to(torch.bfloat16)
        elif name.endswith("e_score_correction_bias") or name.endswith("mlp.gate.weight"):
            tensors[name] = torch.randn(shape, generator=g) * 0.02
        else:
            tensors[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    c["num_nextn_predict_layers"] = 1
    (d / "config.json").write_text(json.dumps(c, indent=2))
    return d


def bench_mtp(args):
    """The verify step on bench-compare's Q8_0 DeepSeek-V3-shaped GGUF (int8 kernels, as
    a quantised R1 runs), and on the BF16 model with an MTP layer (its pass's cost)."""
    q8 = cache_dir() / "bench" / "deepseek-v3-shaped-1024x8-e64-m512.Q8_0.gguf"
    models = ([q8] if q8.exists() else []) + [build_mtp_model()]
    for d in models:
        print(f"model: {d.name}")
        for t in (1, 2):
            r = subprocess.run([REPO / "build" / "bench" / "spec_verify_bench", "--model", d,
                                "--threads", str(t), "--depth", "512", "--reps", str(args.reps)],
                               capture_output=True, text=True, check=True)
            print(r.stdout, end="")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--skip-ngram", action="store_true")
    ap.add_argument("--skip-mtp", action="store_true")
    args = ap.parse_args()
    if not args.skip_ngram:
        bench_ngram(args)
    if not args.skip_mtp:
        bench_mtp(args)


if __name__ == "__main__":
    main()
