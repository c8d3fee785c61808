#!/usr/bin/env python3
"""GPU benchmark of dserve's CUDA backend (for tools/gpu_check.sh; not a test): the
DeepSeek-V3-shaped model of tools/bench_deepseek.py (BF16, 12 layers, 64 experts), or
with --default-model the default model's GGUF, on dserve `--device cuda` and on
transformers on the same GPU, against the GPU's limits measured here with torch (a
device-to-device copy for memory bandwidth, a BF16 matmul for the tensor-core peak).

Rows: decode at batch 1 (128-token prompt, 64 tokens), decode at batch 32 (32 prompts
of 128, 64 tokens each), prompt 512. Writes JSON to --out and prints it.

  python3 tools/gpu_bench.py build/dserve --out bench.json [--default-model GGUF]
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_deepseek import build  # noqa: E402


def timed(fn, repeats=3):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def gpu_limits():
    n = 1 << 29  # floats: 2 GiB read and 2 GiB written per copy
    a = torch.empty(n, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    copy_s = timed(lambda: b.copy_(a))
    m = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm_s = timed(lambda: m @ m)
    return {"device": torch.cuda.get_device_name(0),
            "copy_GBps": 2 * a.numel() * 4 / copy_s / 1e9,
            "bf16_matmul_TFLOPs": 2 * 8192 ** 3 / mm_s / 1e12}


def dserve_generate(dserve, model, prompt_len, tokens):
    ids = ",".join(str(1000 + i) for i in range(prompt_len))
    r = subprocess.run([dserve, "generate", "--device", "cuda", "--model", model, "--prompt-ids", ids,
                        "--max-tokens", str(tokens), "--temperature", "0", "--ignore-eos",
                        "--print-ids"], capture_output=True, text=True, timeout=300)
    m = re.search(r"prompt: \d+ tokens in [\d.]+ s \(([\d.]+) tokens/s\); decode: \d+ tokens in "
                  r"[\d.]+ s \(([\d.]+) tokens/s, (\d+) MiB of weights/token, ([\d.]+) GB/s\)",
                  r.stderr)
    if not m:
        raise RuntimeError(r.stderr[-3000:])
    return {"prompt_tok_s": float(m[1]), "decode_tok_s": float(m[2]),
            "weights_MiB_per_token": int(m[3]), "decode_GBps": float(m[4])}


def dserve_batch(dserve, model, n, prompt_len, tokens, out_json):
    subprocess.run([dserve, "bench", "throughput", "--device", "cuda", "--model", model,
                    "--num-prompts", str(n), "--input-len", str(prompt_len), "--output-len",
                    str(tokens), "--max-num-seqs", str(n), "--output-json", out_json,
                    "--log-level", "error"], check=True, timeout=300, capture_output=True)
    return json.loads(pathlib.Path(out_json).read_text())


def transformers_rows(model_path):
    path = pathlib.Path(model_path)
    if path.suffix == ".gguf":  # dequantised by transformers (the gguf package)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, torch_dtype=torch.bfloat16)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
    model = model.cuda().eval()
    rows = {}
    with torch.no_grad():
        for batch in (1, 32):
            ids = torch.arange(1000, 1128, device="cuda").repeat(batch, 1)
            ids += torch.arange(batch, device="cuda")[:, None]  # distinct prompts
            s = timed(lambda: model.generate(ids, max_new_tokens=64, min_new_tokens=64,
                                             do_sample=False), repeats=1)
            rows[f"batch{batch}_tok_s"] = batch * 64 / s
        ids = torch.arange(1000, 1512, device="cuda")[None]
        rows["prompt512_tok_s"] = 512 / timed(lambda: model(ids))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dserve")
    ap.add_argument("--out", default="gpu_bench.json")
    ap.add_argument("--default-model", help="the default model's GGUF, instead of the MoE")
    args = ap.parse_args()
    cache = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
    if args.default_model:
        model = pathlib.Path(args.default_model)
    else:
        model = cache / "bench" / "deepseek-v3-shaped-1024x12-e64"
        build(model)
    result = {"model": str(model), "limits": gpu_limits()}
    one = dserve_generate(args.dserve, str(model), 128, 64)
    one["fraction_of_copy_bandwidth"] = one["decode_GBps"] / result["limits"]["copy_GBps"]
    result["dserve"] = {"batch1": one,
                        "prompt512": dserve_generate(args.dserve, str(model), 512, 1)}
    b32 = dserve_batch(args.dserve, str(model), 32, 128, 64, args.out + ".dserve32.json")
    result["dserve"]["batch32"] = b32
    try:
        result["transformers"] = transformers_rows(model)
    except Exception as e:  # the comparison is worth having, not worth losing the rest for
        result["transformers"] = {"error": repr(e)}
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
