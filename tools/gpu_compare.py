#!/usr/bin/env python3
"""Per-position log-probs of checkpoints on `--device cuda` against `--device cpu`, with
`dserve perplexity --logprobs-out` (for tools/gpu_check.sh; not a test: it needs a GPU).

Every directory under the given paths that holds a config.json and safetensors (a
W8A8 or FP8 checkpoint, or its float original) is scored on a fixed 64-token prompt on
both devices. The CPU backend is the reference: both devices quantise W8A8 activations
by the same rule and keep FP8 weights as FP8, so only FP32 summation orders differ.
Prints one JSON line per model; exits 1 if any differs by more than --tolerance.

  python3 tools/gpu_compare.py build/dserve DIR...
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile


def model_dirs(paths):
    for p in map(pathlib.Path, paths):
        for config in sorted(p.rglob("config.json")):
            if any(config.parent.glob("*.safetensors")):
                yield config.parent


def logprobs(dserve, model, ids_file, device, out):
    r = subprocess.run([dserve, "perplexity", "--model", model, "--token-ids", ids_file,
                        "--logprobs-out", out, "--device", device],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{device}: exit {r.returncode}: {r.stderr[-2000:]}")
    rows = json.loads(pathlib.Path(out).read_text())["scored"]
    return [row["logprob"] for row in rows], [row["top_id"] for row in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dserve")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--tolerance", type=float, default=2e-3)
    ap.add_argument("--devices", nargs=2, default=["cpu", "cuda"], help="reference, checked")
    args = ap.parse_args()
    failed = False
    for d in model_dirs(args.paths):
        vocab = json.loads((d / "config.json").read_text())["vocab_size"]
        ids = [(i * 7919 + 13) % vocab for i in range(64)]
        with tempfile.TemporaryDirectory() as tmp:
            ids_file = pathlib.Path(tmp) / "ids.txt"
            ids_file.write_text(",".join(map(str, ids)))
            row = {"model": str(d)}
            try:
                ref, checked = args.devices
                cpu, cpu_top = logprobs(args.dserve, d, ids_file, ref, pathlib.Path(tmp) / "c.json")
                gpu, gpu_top = logprobs(args.dserve, d, ids_file, checked, pathlib.Path(tmp) / "g.json")
                row["max_abs_diff"] = max(abs(a - b) for a, b in zip(cpu, gpu))
                row["top1_agree"] = sum(a == b for a, b in zip(cpu_top, gpu_top)) / len(cpu_top)
                row["ok"] = row["max_abs_diff"] <= args.tolerance
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                row["error"] = str(e)
                row["ok"] = False
        failed |= not row["ok"]
        print(json.dumps(row), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
