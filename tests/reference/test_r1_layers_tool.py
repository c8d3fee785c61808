"""tools/make_r1_layers.py, the generator of DeepSeek-R1 checkpoints at R1's real widths
for benchmarks, run at a reduced width (`--self-test`): the same code paths (R1's config
with the depth and widths replaced, FP8 with 128 x 128 block scales in sharded
safetensors with an index, R1's tokenizer), checked against transformers.

transformers reads the checkpoint's config and the weights as the test dequantises them
(fp8 value * scale_inv of its block, computed here, not by the tool or dserve; kv_b_proj
rounded to BF16, as dserve holds it once split for MLA); dserve loads the tool's files as
they are. Per-position log-probabilities within 1e-3, expanded and absorbed MLA; the
Q8_0 GGUF within Q8_0's rounding.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import content_key, cache_dir
from test_deepseek_reference import (_dserve_generate, _dserve_logprobs, _fp8_dequantize, _load,
                                     _reference, _worst)

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "make_r1_layers.py"
PROMPT = [0, 3, 17, 128, 1000, 4242, 31337, 77, 100000, 129279, 5, 6, 7, 8, 9, 10]


def _checkpoint():
    """The tool's reduced-width output and transformers' reference, cached by the tool's
    content."""
    d = cache_dir() / f"r1-layers-self-test-{content_key(TOOL.read_bytes(), torch.__version__)}"
    ref_path = d / "reference.json"
    if not ref_path.exists():
        subprocess.run([sys.executable, str(TOOL), "--self-test", str(d)], check=True)
        model = d / "r1-narrow-2l-fp8"
        index = json.loads((model / "model.safetensors.index.json").read_text())
        weights = {}
        for shard in sorted(set(index["weight_map"].values())):
            weights.update(safetensors_torch.load_file(model / shard))
        plain = {}
        for name, t in weights.items():
            if name.endswith("_scale_inv"):
                continue
            if t.dtype == torch.float8_e4m3fn:
                deq = _fp8_dequantize(t, weights[name + "_scale_inv"])
                plain[name] = deq.to(torch.bfloat16).float() if "kv_b_proj" in name else deq
            else:
                plain[name] = t.float()
        ref_dir = d / "dequantised"
        ref_dir.mkdir(exist_ok=True)
        config = json.loads((model / "config.json").read_text())
        del config["quantization_config"]
        (ref_dir / "config.json").write_text(json.dumps(config))
        safetensors_torch.save_file(plain, ref_dir / "model.safetensors", metadata={"format": "pt"})
        ref = {"n_fp8": sum(1 for n in weights if n.endswith("_scale_inv")),
               "n_shards": len(set(index["weight_map"].values())),
               "logprobs": _reference(_load(ref_dir), PROMPT)["logprobs"]}
        ref_path.write_text(json.dumps(ref))
    return d / "r1-narrow-2l-fp8", json.loads(ref_path.read_text())


def test_config_is_r1_but_depth_and_widths():
    sys.path.insert(0, str(TOOL.parent))
    import make_r1_layers as tool
    c = tool.config_for(4)
    # Every key of R1's config.json kept; only these differ.
    changed = {k for k in tool.R1_CONFIG if c[k] != tool.R1_CONFIG[k]}
    assert changed == {"num_hidden_layers", "first_k_dense_replace", "num_nextn_predict_layers"}
    assert (c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]) == (7168, 256, 2048)
    # The sizes the tool's documentation states: 2 layers about 15.8 GB, each further
    # MoE layer about 11.5 GB (FP8 bytes plus BF16 embeddings, head and router).
    def size(layers):
        total = 0
        for _, shape, kind in tool.all_shapes(tool.config_for(layers)):
            n = 1
            for s in shape:
                n *= s
            total += n * (1 if kind == "fp8" else 2)
        return total / 1e9
    assert 15.3 < size(2) < 16.3 and 11.0 < size(3) - size(2) < 12.0


def test_self_test_checkpoint_against_transformers(dserve_bin, tmp_path):
    model, ref = _checkpoint()
    assert ref["n_fp8"] > 50 and ref["n_shards"] > 1
    for batch in (512, 1):  # expanded and absorbed MLA
        got = _dserve_logprobs(dserve_bin, model, PROMPT, tmp_path, batch=batch)
        assert _worst(got, ref["logprobs"]) < 1e-3, batch


def test_self_test_gguf_against_transformers(dserve_bin, tmp_path):
    """The Q8_0 GGUF (metadata from llama.cpp's converter, tensors under its names): the
    gguf package reads what the converter would write (kv_b split into attn_k_b /
    attn_v_b, 3-D expert stacks), and dserve's log-probabilities on it stay within
    Q8_0's rounding of transformers' (measured: worst 0.011, mean 0.003)."""
    gguf = pytest.importorskip("gguf")
    model, ref = _checkpoint()
    path = model.parent / "r1-narrow-2l.Q8_0.gguf"
    r = gguf.GGUFReader(path)
    names = {t.name: t for t in r.tensors}
    assert names["blk.1.ffn_gate_exps.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert list(names["blk.1.ffn_gate_exps.weight"].shape) == [256, 128, 16]  # ne: h, moe, E
    assert list(names["blk.0.attn_k_b.weight"].shape) == [32, 64, 4]  # ne: nope, r, H
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "deepseek2"
    assert int(r.fields["deepseek2.expert_count"].parts[-1][0]) == 16
    got = _dserve_logprobs(dserve_bin, path, PROMPT, tmp_path, batch=1)
    mean = sum(abs(a - b) for a, b in zip(got, ref["logprobs"])) / len(got)
    print(f"Q8_0 GGUF: worst {_worst(got, ref['logprobs']):.4f}, mean {mean:.4f}")
    assert _worst(got, ref["logprobs"]) < 0.05 and mean < 0.02


def test_routed_experts_without_packed_copies_give_the_same_bits(dserve_bin, tmp_path,
                                                                monkeypatch):
    """Routed experts read in place (what a model too big to hold twice gets) give the
    log-probabilities of packed copies bit for bit, prompt (batched) and token by token;
    the start-up log says which."""
    model, ref = _checkpoint()
    path = model.parent / "r1-narrow-2l.Q8_0.gguf"
    got = {}
    for choice in ("always", "never"):
        monkeypatch.setenv("DSERVE_PACKED_EXPERTS", choice)
        for batch in (512, 1):
            got[choice, batch] = _dserve_logprobs(dserve_bin, path, PROMPT, tmp_path, batch=batch,
                                                  extra=["--log-level", "info"])
    assert got["always", 512] == got["never", 512]
    assert got["always", 1] == got["never", 1]
    _, stderr = _dserve_generate(dserve_bin, path, PROMPT, log_level="info")
    assert "routed experts: packed copies made at load (DSERVE_PACKED_EXPERTS=never" not in stderr
    assert "routed experts: read in place, no packed copies (DSERVE_PACKED_EXPERTS=never" in stderr
    assert "released:" not in stderr


def test_packed_experts_release_their_mapped_rows(dserve_bin, monkeypatch):
    """With packed copies the experts' mapped rows are released: the whole pages inside
    each expert's bytes, as the gguf package sizes the 3-D expert stacks."""
    gguf = pytest.importorskip("gguf")
    model, _ = _checkpoint()
    path = model.parent / "r1-narrow-2l.Q8_0.gguf"
    experts = [t for t in gguf.GGUFReader(path).tensors if "_exps." in t.name]
    expert_bytes = sum(int(t.n_bytes) for t in experts)
    page = os.sysconf("SC_PAGE_SIZE")
    # Each expert's slice keeps the partial pages at its two ends.
    per_expert = [int(t.n_bytes) // int(t.shape[-1]) for t in experts]
    floor = sum((b // page - 1) * page * int(t.shape[-1]) for b, t in zip(per_expert, experts))
    monkeypatch.setenv("DSERVE_PACKED_EXPERTS", "always")
    _, stderr = _dserve_generate(dserve_bin, path, PROMPT, log_level="info")
    m = re.search(r"rows they replace, released: ([0-9.]+) MiB", stderr)
    assert m, stderr
    released = float(m.group(1)) * 2**20
    rounding = 0.06 * 2**20  # the log prints MiB to one decimal
    assert floor - rounding <= released <= expert_bytes + rounding, (floor, released, expert_bytes)
