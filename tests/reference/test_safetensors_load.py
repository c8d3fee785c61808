"""dserve's safetensors / Hugging Face directory loader against torch: files written
with the safetensors package in F32, F16 and BF16, single and sharded with an index,
read back through ModelFiles (tests/unit/loader/tensor_dump.cc) and compared exactly.
"""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import run


@pytest.fixture(scope="module")
def tensor_dump(test_tool):
    return test_tool("tensor_dump")


def make_tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(10, 16, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g).half(),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(16, generator=g).bfloat16(),
        "model.layers.0.mlp.up_proj.weight": torch.randn(2, 3, 8, generator=g).bfloat16(),
        "model.norm.weight": torch.tensor([0.0, -0.0, 1e-40, 65504.0, float("inf")]),
        "lm_head.weight": torch.randn(10, 16, generator=g).half(),
    }


def write_dir(d, tensors, shards=1):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 16}))
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.5}))
    if shards == 1:
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
        return
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::shards]}
        save_file(part, d / file, metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def check(tensor_dump, model_dir, tensors, tmp_path):
    listed = [json.loads(l) for l in run([tensor_dump, model_dir, "list"]).stdout.splitlines()]
    listed = {l["name"]: l for l in listed if "name" in l}
    assert sorted(listed) == sorted(tensors)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    names = sorted(tensors)
    r = run([tensor_dump, model_dir, "dump", out] + names)
    for line in r.stdout.splitlines():
        info = json.loads(line)
        t = tensors[info["name"]]
        assert info["dtype"] == {torch.float32: "f32", torch.float16: "f16",
                                 torch.bfloat16: "bf16"}[t.dtype]
        assert info["shape"] == list(t.shape)
        ours = np.fromfile(info["file"], dtype=np.float32).reshape(info["shape"])
        ref = t.float().numpy()
        assert (ours.view(np.uint32) == ref.view(np.uint32)).all(), info["name"]


def test_single_file(tensor_dump, tmp_path):
    tensors = make_tensors(0)
    write_dir(tmp_path / "m", tensors)
    check(tensor_dump, tmp_path / "m", tensors, tmp_path)


def test_sharded_with_index(tensor_dump, tmp_path):
    tensors = make_tensors(1)
    write_dir(tmp_path / "m", tensors, shards=3)
    check(tensor_dump, tmp_path / "m", tensors, tmp_path)


def test_sharded_missing_shard(tensor_dump, tmp_path):
    write_dir(tmp_path / "m", make_tensors(2), shards=2)
    (tmp_path / "m" / "model-00002-of-00002.safetensors").unlink()
    r = run([tensor_dump, tmp_path / "m", "list"], check=False)
    assert r.returncode == 1
    assert "model-00002-of-00002.safetensors" in r.stderr and "missing" in r.stderr


def test_unsupported_dtype(tensor_dump, tmp_path):
    tensors = make_tensors(3)
    tensors["model.layers.0.position_ids"] = torch.arange(4, dtype=torch.float64)
    write_dir(tmp_path / "m", tensors)
    r = run([tensor_dump, tmp_path / "m", "list"], check=False)
    assert r.returncode == 1
    assert "unimplemented" in r.stderr
    assert "model.layers.0.position_ids" in r.stderr and "F64" in r.stderr
