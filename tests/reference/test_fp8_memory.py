"""Resident memory of FP8 weights, measured: about 1 byte per FP8 weight kept in memory
(the default) against about 2 more per weight when converted to BF16 at load
(--fp8-weights bf16).

Two tiny random DeepSeek-V3 checkpoints in DeepSeek's FP8 format (float8_e4m3fn
linear weights with 128 x 128 block scales), written here from the tensor names and
shapes transformers gives the architecture, differ only in their number of (dense)
layers, whose FP8 weights dominate. `dserve perplexity` runs on each, and the peak
resident set size of the process (the kernel's rusage of that child, mapped file pages
included) is measured; the growth from the small to the large checkpoint divided by the
growth in FP8 weights is the bytes each FP8 weight takes, free of the constant costs
(binary, embeddings, activations). dserve's start-up log gives the same split by
tensor.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import cache_dir, content_key

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

BLOCK = 128
SHAPE = dict(hidden=1024, ffn=2048, heads=8, q_lora=256, kv_lora=128, nope=64, rope=64, v=64)
LAYERS = (1, 5)
VOCAB = 256
FIXTURE_VERSION = 1


def _config(n_layers):
    s = SHAPE
    return transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=s["hidden"], intermediate_size=s["ffn"],
        moe_intermediate_size=256, num_hidden_layers=n_layers, first_k_dense_replace=n_layers,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        num_attention_heads=s["heads"], num_key_value_heads=s["heads"], q_lora_rank=s["q_lora"],
        kv_lora_rank=s["kv_lora"], qk_nope_head_dim=s["nope"], qk_rope_head_dim=s["rope"],
        v_head_dim=s["v"], max_position_embeddings=128, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _fp8_quantize(w):
    """w [n, k] -> (float8_e4m3fn weight, float32 scale_inv [ceil(n/128), ceil(k/128)]),
    scale_inv = block amax / 448 as DeepSeek's quantiser (blocks padded with zeros)."""
    n, k = w.shape
    rb, cb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.zeros(rb * BLOCK, cb * BLOCK)
    padded[:n, :k] = w
    blocks = padded.reshape(rb, BLOCK, cb, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).reshape(rb * BLOCK, cb * BLOCK)
    return q[:n, :k].contiguous(), scale


def _checkpoint(n_layers):
    d = cache_dir() / f"fp8-memory-{content_key(SHAPE, n_layers, VOCAB, FIXTURE_VERSION, transformers.__version__)}"
    if (d / "done.json").exists():
        return d, json.loads((d / "done.json").read_text())
    d.mkdir(parents=True, exist_ok=True)
    config = _config(n_layers)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in transformers.DeepseekV3ForCausalLM(config).state_dict().items()}
    g = torch.Generator().manual_seed(7)
    tensors, n_fp8 = {}, 0
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight"):
            q, s = _fp8_quantize(0.02 * torch.randn(shape, generator=g))
            tensors[name], tensors[name + "_scale_inv"] = q, s
            n_fp8 += q.numel()
        else:
            tensors[name] = 0.02 * torch.randn(shape, generator=g)
    safetensors_torch.save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    config_json = config.to_dict()
    config_json["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [BLOCK, BLOCK]}
    (d / "config.json").write_text(json.dumps(config_json, indent=2))
    info = {"n_fp8_weights": n_fp8}
    (d / "done.json").write_text(json.dumps(info))
    return d, info


# Runs a command and prints its exit code and peak RSS (KiB). A small launcher process
# of its own: a child's ru_maxrss also counts the memory of the process it was forked
# from at exec, which for pytest (torch loaded) would be larger than dserve itself.
LAUNCHER = ("import os, subprocess, sys\n"
            "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
            "_, status, usage = os.wait4(p.pid, 0)\n"
            "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n")


def _peak_rss(dserve_bin, model_dir, ids, mode):
    """Peak resident set size (bytes) of one `dserve perplexity` run, and its stderr."""
    r = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, str(dserve_bin), "perplexity", "--model",
                        str(model_dir), "--token-ids", str(ids), "--threads", "2", "--fp8-weights", mode,
                        "--log-level", "info"], capture_output=True, text=True, check=True)
    code, max_rss_kib = map(int, r.stdout.split())
    assert code == 0, r.stderr[-3000:]
    return max_rss_kib * 1024, r.stderr


def test_fp8_weight_bytes_are_measured(dserve_bin, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text(",".join(str(i % VOCAB) for i in range(32)))
    (small, small_info), (large, large_info) = (_checkpoint(n) for n in LAYERS)
    extra_weights = large_info["n_fp8_weights"] - small_info["n_fp8_weights"]
    assert extra_weights > 25_000_000
    per_weight, rss = {}, {}
    for mode in ("fp8", "bf16"):
        rss_small, _ = _peak_rss(dserve_bin, small, ids, mode)
        rss_large, stderr = _peak_rss(dserve_bin, large, ids, mode)
        rss[mode] = (rss_small, rss_large)
        per_weight[mode] = (rss_large - rss_small) / extra_weights
        m = re.search(r"FP8 weights \(--fp8-weights (\w+)\): (\d+) kept", stderr)
        assert m and m.group(1) == mode, stderr
    # Kept: the FP8 bytes themselves (mapped from the file), plus kv_b_proj converted
    # to BF16 (1.5% of these weights) and the block scales (4 bytes per 16384 weights).
    assert 0.9 < per_weight["fp8"] < 1.25, (per_weight, rss)
    # Converted: 2 bytes of BF16 per weight on top of the file's pages read once.
    assert per_weight["bf16"] - per_weight["fp8"] > 1.8, (per_weight, rss)
