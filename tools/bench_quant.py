#!/usr/bin/env python3
"""Weight formats side by side (not a test): one model as BF16, W8A8, Q8_0 and Q4_1,
and the DeepSeek-V3-shaped benchmark model with its FP8 weights kept and converted.

For each format: prompt processing of 512 tokens and decoding 128 tokens at batch 1
(`dserve generate`), decoding at batch 32 (`dserve bench throughput`, 32 prompts of 16
tokens, 128 out each: output tokens/s, the prompts' share is ~1/9 of the tokens), the
bytes of weights held per weight, and each figure against the machine's limits
(`build/bench/machine_limits`): batch-1 decode as weight bytes per second over the DRAM
read bandwidth, the batched figures as multiply-accumulates per second over the peak
of the arithmetic the format's kernels run on (int8 dot products for W8A8 and the
GGUF types, f32 FMA for BF16 and FP8, which the kernels widen to f32).

Files, made once into $DSERVE_CACHE/bench/quant/: SmolLM2-135M-Instruct (the default
model) dequantised to BF16 by transformers; quantised from that to W8A8 by
llmcompressor (SmoothQuant, then int8 per-channel weights with dynamic per-token int8
activations, lm_head in float, as tests/reference/test_w8a8_reference.py does) and to
Q8_0 by llama.cpp's llama-quantize; Q4_1 is the default model's GGUF itself.
The DeepSeek model is make bench-compare's (tools/make_moe_gguf.py: BF16, random, with
DeepSeek-V3's tokenizer), converted to FP8 E4M3 with 128 x 128 block scales as DeepSeek
ships V3/R1, beside its Q8_0 GGUF when make bench-compare has made it.

  .venv/bin/python tools/bench_quant.py [--dserve build/dserve] [--threads 2]
      --llama-bin $DSERVE_CACHE/llamacpp/0.3.36/build/bin
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_compare  # noqa: E402
import bench_deepseek  # noqa: E402
import make_moe_gguf  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
CACHE = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
DEFAULT_MODEL = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = REPO / "tests" / "reference" / "data" / "lighthouse_keepers.txt"
PROMPT_512 = ",".join(str(1000 + (i * 37) % 20000) for i in range(512))


def run(cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=True)


def smoothquant_w8a8_recipe():
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier
    return [SmoothQuantModifier(smoothing_strength=0.8),
            QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])]


def make_smollm2(out, llama_bin):
    """bf16/, w8a8/ and q8_0.gguf under out (once)."""
    import transformers
    if (out / "done").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    kw = dict(gguf_file=DEFAULT_MODEL.name)
    tok = transformers.AutoTokenizer.from_pretrained(DEFAULT_MODEL.parent, **kw)
    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL.parent, **kw)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(out / "bf16")
    tok.save_pretrained(out / "bf16")

    from datasets import Dataset
    from llmcompressor import oneshot
    ids = tok(TEXT.read_text())["input_ids"]
    rows = [ids[i:i + 128] for i in range(0, len(ids) - 127, 128)]
    data = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * 128] * len(rows)})
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "bf16", dtype=torch.bfloat16)
    oneshot(model=model, dataset=data, processor=tok, num_calibration_samples=len(rows),
            max_seq_length=128, recipe=smoothquant_w8a8_recipe())
    model.save_pretrained(out / "w8a8", save_compressed=True)
    tok.save_pretrained(out / "w8a8")

    # llama.cpp's converter does not know the tokenizer transformers writes back from
    # the GGUF; its quantiser takes the GGUF itself (every weight of the Q4_1 file is
    # exact in BF16, and Q8_0 of those values is what the converter would write).
    run([llama_bin / "llama-quantize", "--allow-requantize", DEFAULT_MODEL, out / "q8_0.gguf",
         "Q8_0"])
    (out / "done").write_text("")


def to_fp8(w):
    """E4M3 weights and per-128x128-block scales (weight_scale_inv: value = q * s)."""
    n, k = w.shape
    bn, bk = (n + 127) // 128, (k + 127) // 128
    padded = torch.zeros(bn * 128, bk * 128)
    padded[:n, :k] = w.float()
    blocks = padded.view(bn, 128, bk, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return q.view(bn * 128, bk * 128)[:n, :k].contiguous(), scale


def make_deepseek_fp8(bf16_dir, out):
    from safetensors.torch import load_file, save_file
    if (out / "done").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tensors = {}
    for name, t in load_file(bf16_dir / "model.safetensors").items():
        # As DeepSeek ships it: the linear layers in FP8; embeddings, lm_head, norms
        # and the routers not.
        if t.dim() == 2 and name.endswith("proj.weight"):
            q, s = to_fp8(t)
            tensors[name] = q
            tensors[name[:-len("weight")] + "weight_scale_inv"] = s
        else:
            tensors[name] = t
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((bf16_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bf16_dir / f, out / f)
    (out / "done").write_text("")


def limits(build, threads):
    out = run([build / "bench" / "machine_limits", "--threads", threads]).stdout
    return dict(kv.split("=") for kv in out.split())


def smollm2_macs(prompt=False):
    """Multiply-accumulates per token of SmolLM2's matrix products (the GGUF's shapes);
    prompt=True: without the output projection (a prompt's last token only)."""
    return bench_compare.active_macs_per_token(DEFAULT_MODEL, prompt)


def deepseek_macs(prompt=False):
    """The same for the DeepSeek-shaped model: every matrix but the embedding, routed
    experts at the router's top-k of n; prompt=True: without lm_head."""
    c = make_moe_gguf.CONFIG
    macs = 0
    for name, shape in bench_deepseek.shapes(c):
        if len(shape) != 2 or "embed_tokens" in name or name.endswith("mlp.gate.weight"):
            continue
        if prompt and name == "lm_head.weight":
            continue
        n = shape[0] * shape[1]
        macs += n * c["num_experts_per_tok"] // c["n_routed_experts"] if ".experts." in name else n
    return macs


def batch32(dserve, model, threads, extra):
    r = run([dserve, "bench", "throughput", "--model", model, "--threads", threads,
             "--num-prompts", 32, "--input-len", 16, "--output-len", 128, "--max-num-seqs", 32]
            + extra)
    return float(re.search(r"([\d.]+) output tokens/s", r.stdout)[1])


# Bytes per weight of the matrix weights as the engine holds them (data and scales;
# k = 576 for SmolLM2's per-channel W8A8 scales, 128 x 128 blocks for FP8).
BYTES_PER_WEIGHT = {"BF16": 2.0, "W8A8": 1 + 4 / 576, "Q8_0": 34 / 32, "Q4_1": 20 / 32,
                    "FP8 kept": 1 + 4 / 128**2, "FP8 -> BF16": 2.0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dserve", default="build/dserve")
    ap.add_argument("--llama-bin", type=pathlib.Path, required=True,
                    help="llama.cpp's build/bin (make bench-compare builds it)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--models", nargs="+", default=["smollm2", "deepseek"])
    ap.add_argument("--prepare-only", action="store_true", help="make the files, measure nothing")
    args = ap.parse_args()
    # (model name, format, path, extra flags, (prompt, decode) MACs per token, its peak)
    variants = []
    if "smollm2" in args.models:
        d = CACHE / "bench" / "quant" / "smollm2"
        make_smollm2(d, args.llama_bin)
        macs = (smollm2_macs(prompt=True), smollm2_macs())
        for fmt, path, peak in (("BF16", d / "bf16", "f32"), ("W8A8", d / "w8a8", "int8"),
                                ("Q8_0", d / "q8_0.gguf", "int8"),
                                ("Q4_1", DEFAULT_MODEL, "int8")):
            variants.append(("SmolLM2-135M", fmt, path, [], macs, peak))
    if "deepseek" in args.models:
        name = "deepseek-v3-shaped-1024x8-e64-m512"
        bf16 = CACHE / "bench" / f"{name}-hf"
        make_moe_gguf.write_checkpoint(bf16)
        fp8 = CACHE / "bench" / "quant" / f"{name}-fp8"
        make_deepseek_fp8(bf16, fp8)
        macs = (deepseek_macs(prompt=True), deepseek_macs())
        for fmt, flag in (("FP8 kept", "fp8"), ("FP8 -> BF16", "bf16")):
            variants.append(("DeepSeek-V3-shaped", fmt, fp8, ["--fp8-weights", flag], macs, "f32"))
        q8 = CACHE / "bench" / f"{name}.Q8_0.gguf"
        if q8.exists():
            variants.append(("DeepSeek-V3-shaped", "Q8_0", q8, [], macs, "int8"))
    if args.prepare_only:
        return
    build = pathlib.Path(args.dserve).parent
    lim = limits(build, args.threads)
    dram, i8, f32 = (float(lim[k]) for k in ("dram_read_GBps", "int8_peak_GMACps",
                                              "f32_peak_GMACps"))
    print(f"machine limits, {args.threads} thread(s): DRAM read {dram} GB/s, int8 peak {i8} "
          f"GMAC/s ({lim['int8_insn']}), f32 peak {f32} GMAC/s ({lim['f32_insn']})")
    print("| model | weights | bytes/weight | pp512 tok/s | decode b1 tok/s | decode b32 tok/s "
          "| pp512 vs peak | b1 vs DRAM | b32 vs peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, fmt, path, extra, macs, peak in variants:
        peak = {"int8": i8, "f32": f32}[peak]
        pp, _, _ = bench_compare.dserve_generate(args.dserve, path, args.threads, PROMPT_512, extra)
        _, tg, bytes_per_token = bench_compare.dserve_generate(args.dserve, path, args.threads, "1000",
                                                               extra)
        b32 = batch32(args.dserve, path, args.threads, extra)
        frac = lambda tps, m: f"{tps * m / (peak * 1e9):.0%}"  # noqa: E731
        print(f"| {name} | {fmt} | {BYTES_PER_WEIGHT[fmt]:.2f} | {pp:.1f} | {tg:.1f} | {b32:.1f} "
              f"| {frac(pp, macs[0])} | {tg * bytes_per_token / (dram * 1e9):.0%} | {frac(b32, macs[1])} |",
              flush=True)


if __name__ == "__main__":
    main()
