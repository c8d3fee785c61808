#!/usr/bin/env python3
"""Decode benchmark (not a test) of dserve on a random DeepSeek-V3-shaped model.

Writes, once, a BF16 checkpoint with DeepSeek-V3's architecture at a small scale
(hidden 1024, 12 layers with the first dense, MLA with q_lora 512 / kv_lora 256,
64 routed experts top-6 + 2 shared, noaux_tc routing; about 2 GB) into
$DSERVE_CACHE/bench/, then runs `dserve generate` on a 128-token prompt for 64 tokens
with the given thread counts and reports prompt and decode tokens/s, the bytes of
weights one decode step reads (attention, dense and shared MLPs, routers, the 6 routed
experts actually chosen per MoE layer, lm_head) and the memory bandwidth that implies.

  .venv/bin/python tools/bench_deepseek.py [build/dserve] [--threads 1 2]
"""
import argparse
import json
import os
import pathlib
import re
import subprocess

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
    "moe_intermediate_size": 384, "num_hidden_layers": 12, "num_attention_heads": 16,
    "num_key_value_heads": 16, "q_lora_rank": 512, "kv_lora_rank": 256,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2,
    "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 0,
    "eos_token_id": 1, "num_nextn_predict_layers": 0, "torch_dtype": "bfloat16",
}


def shapes(c):
    h, H = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    r, rope, v = c["kv_lora_rank"], c["qk_rope_head_dim"], c["v_head_dim"]
    moe, E = c["moe_intermediate_size"], c["n_routed_experts"]
    yield "model.embed_tokens.weight", (c["vocab_size"], h)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (c["vocab_size"], h)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "self_attn.q_a_proj.weight", (c["q_lora_rank"], h)
        yield p + "self_attn.q_a_layernorm.weight", (c["q_lora_rank"],)
        yield p + "self_attn.q_b_proj.weight", (H * qk, c["q_lora_rank"])
        yield p + "self_attn.kv_a_proj_with_mqa.weight", (r + rope, h)
        yield p + "self_attn.kv_a_layernorm.weight", (r,)
        yield p + "self_attn.kv_b_proj.weight", (H * (c["qk_nope_head_dim"] + v), r)
        yield p + "self_attn.o_proj.weight", (h, H * v)
        if layer < c["first_k_dense_replace"]:
            i = c["intermediate_size"]
            yield p + "mlp.gate_proj.weight", (i, h)
            yield p + "mlp.up_proj.weight", (i, h)
            yield p + "mlp.down_proj.weight", (h, i)
            continue
        yield p + "mlp.gate.weight", (E, h)
        yield p + "mlp.gate.e_score_correction_bias", (E,)
        for e in range(E):
            yield p + f"mlp.experts.{e}.gate_proj.weight", (moe, h)
            yield p + f"mlp.experts.{e}.up_proj.weight", (moe, h)
            yield p + f"mlp.experts.{e}.down_proj.weight", (h, moe)
        s = moe * c["n_shared_experts"]
        yield p + "mlp.shared_experts.gate_proj.weight", (s, h)
        yield p + "mlp.shared_experts.up_proj.weight", (s, h)
        yield p + "mlp.shared_experts.down_proj.weight", (h, s)


def build(d):
    if (d / "model.safetensors").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in shapes(CONFIG):
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        elif name.endswith("e_score_correction_bias") or name.endswith("mlp.gate.weight"):
            t = torch.randn(shape, generator=g) * 0.02  # router: F32, as DeepSeek ships it
            tensors[name] = t
            continue
        else:
            t = torch.randn(shape, generator=g) * 0.02
        tensors[name] = t.to(torch.bfloat16)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(CONFIG, indent=2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dserve", nargs="?", default="build/dserve")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    cache = pathlib.Path(os.environ.get("DSERVE_CACHE", pathlib.Path.home() / ".cache" / "dserve"))
    d = cache / "bench" / "deepseek-v3-shaped-1024x12-e64"
    build(d)
    size = (d / "model.safetensors").stat().st_size
    print(f"model: {d} ({size / 1e9:.2f} GB BF16)")
    prompt = ",".join(str(1000 + i) for i in range(128))
    print(f"{'threads':<8} {'prompt tok/s':<14} {'decode tok/s':<14} {'MiB/token':<10} "
          f"{'GB/s':<8} KV B/token")
    for t in args.threads:
        r = subprocess.run([args.dserve, "generate", "--model", str(d), "--prompt-ids", prompt,
                            "--max-tokens", str(args.tokens), "--temperature", "0", "--ignore-eos",
                            "--print-ids", "--threads", str(t)], capture_output=True, text=True,
                           check=True)
        m = re.search(r"prompt: \d+ tokens in [\d.]+ s \(([\d.]+) tokens/s\); decode: \d+ "
                      r"tokens in [\d.]+ s \(([\d.]+) tokens/s, (\d+) MiB of weights/token, "
                      r"([\d.]+) GB/s\); KV cache (\d+) bytes/token", r.stderr)
        if not m:
            raise SystemExit(r.stderr)
        print(f"{t:<8} {m[1]:<14} {m[2]:<14} {m[3]:<10} {m[4]:<8} {m[5]}")


if __name__ == "__main__":
    main()
