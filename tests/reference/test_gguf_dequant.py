"""dserve's GGUF reader and dequantiser against gguf-py (llama.cpp's own Python
package): every tensor type, bit-exact.

The C++ side is the test-only tool `tensor_dump` (tests/unit/loader/tensor_dump.cc),
which opens a model and writes tensors dequantised to raw float32 files.
"""
import json
import pathlib

import gguf
import numpy as np
import pytest

from conftest import run

Q = gguf.GGMLQuantizationType


def dump(tool, model, names, out_dir, gguf_names=True):
    """Returns {name: (info, float32 array in PyTorch shape)} from tensor_dump."""
    args = [tool, "--gguf-names"] if gguf_names else [tool]
    r = run(args + [model, "dump", out_dir] + list(names))
    result = {}
    for line in r.stdout.splitlines():
        info = json.loads(line)
        data = np.fromfile(info["file"], dtype=np.float32).reshape(info["shape"])
        result[info["name"]] = (info, data)
    assert sorted(result) == sorted(names)
    return result


def list_tensors(tool, model, gguf_names=False):
    args = [tool, "--gguf-names"] if gguf_names else [tool]
    lines = [json.loads(l) for l in run(args + [model, "list"]).stdout.splitlines()]
    tensors = {l["name"]: l for l in lines if "name" in l}
    extra = {k: v for l in lines if "name" not in l for k, v in l.items()}
    return tensors, extra


def reference(t: gguf.ReaderTensor) -> np.ndarray:
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)


def assert_same(ours: np.ndarray, ref: np.ndarray, what: str):
    assert ours.shape == ref.shape, what
    # Bit-exact: the dequantiser does the same float operations in the same order.
    same = (ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))
    if not same.all():
        i = np.argwhere(~same)[0]
        pytest.fail(f"{what}: {(~same).sum()} of {same.size} differ, first at {tuple(i)}: "
                    f"{ours[tuple(i)]!r} vs {ref[tuple(i)]!r}")


@pytest.fixture(scope="module")
def tensor_dump(test_tool):
    return test_tool("tensor_dump")


def test_default_model_every_type(tensor_dump, default_model, tmp_path):
    reader = gguf.GGUFReader(default_model)
    # Up to two tensors of each type the file holds (Q4_1, Q8_0, F32).
    chosen = {}
    for t in reader.tensors:
        chosen.setdefault(t.tensor_type, [])
        if len(chosen[t.tensor_type]) < 2:
            chosen[t.tensor_type].append(t)
    assert {Q.Q4_1, Q.Q8_0, Q.F32} <= set(chosen)
    picked = [t for ts in chosen.values() for t in ts]
    ours = dump(tensor_dump, default_model, [t.name for t in picked], tmp_path)
    for t in picked:
        info, data = ours[t.name]
        assert info["dtype"] == t.tensor_type.name.lower()
        assert info["n_bytes"] == t.n_bytes
        assert_same(data, reference(t), t.name)


def test_default_model_names_and_shapes(tensor_dump, default_model):
    reader = gguf.GGUFReader(default_model)
    tensors, extra = list_tensors(tensor_dump, default_model)
    assert extra["rope_pairs_interleaved"] is True  # general.architecture == "llama"
    assert len(tensors) == len(reader.tensors)
    layer_map = {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            hf = f"model.layers.{parts[1]}.{layer_map[parts[2]]}.{parts[3]}"
        else:
            hf = f"{top[parts[0]]}.{parts[1]}"
        assert hf in tensors, t.name
        # gguf-py lists dims innermost first; dserve uses PyTorch order.
        assert tensors[hf]["shape"] == [int(d) for d in reversed(t.shape)], t.name


def test_default_model_metadata(tensor_dump, default_model):
    reader = gguf.GGUFReader(default_model)
    meta = json.loads(run([tensor_dump, "--gguf-names", default_model, "meta"]).stdout)
    assert meta["general.architecture"] == "llama"
    for key in ["llama.block_count", "llama.embedding_length", "tokenizer.ggml.bos_token_id"]:
        assert meta[key] == reader.fields[key].contents()
    assert meta["llama.rope.freq_base"] == pytest.approx(reader.fields["llama.rope.freq_base"].contents())
    assert meta["tokenizer.ggml.tokens"] == reader.fields["tokenizer.ggml.tokens"].contents()
    assert meta["tokenizer.ggml.token_type"] == reader.fields["tokenizer.ggml.token_type"].contents()


def random_k_blocks(rng, qtype, n_blocks):
    """Random K-quant blocks with sane f16 super-block scales (gguf-py cannot quantise
    these types, and random bytes would give inf/nan scales)."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, size=(n_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin lead the block
        raw[:, 0:4] = scales.reshape(n_blocks, 4)
    else:  # Q6_K: d trails the block
        raw[:, -2:] = scales[:, :2].reshape(n_blocks, 2)
    return raw


def make_tensors(rng):
    """(name, qtype, raw array for GGUFWriter, PyTorch shape) for every supported type."""
    out = []
    for qtype, shape in [(Q.F32, (3, 64)), (Q.F16, (5, 32)), (Q.BF16, (4, 96)),
                         (Q.Q8_0, (6, 128)), (Q.Q4_0, (2, 3, 64)), (Q.Q4_1, (7, 32)),
                         (Q.Q5_0, (3, 128)), (Q.Q5_1, (2, 2, 96))]:
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, ..., :3] = [0.0, 1e-3, -65000.0] if qtype != Q.F16 else [0.0, 1e-3, -6.5e4]
        out.append((f"t_{qtype.name.lower()}", qtype, gguf.quants.quantize(x, qtype), shape))
    for qtype, shape in [(Q.Q4_K, (3, 512)), (Q.Q5_K, (2, 256)), (Q.Q6_K, (2, 2, 768))]:
        n_blocks = int(np.prod(shape)) // 256
        raw = random_k_blocks(rng, qtype, n_blocks)
        raw = raw.reshape(shape[:-1] + (shape[-1] // 256 * raw.shape[1],))
        out.append((f"t_{qtype.name.lower()}", qtype, raw, shape))
    return out


def write_gguf(path, tensors, split_max_tensors=0, alignment=None):
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    if alignment:
        w.add_custom_alignment(alignment)
    for name, qtype, raw, _ in tensors:
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_all(tensor_dump, model, tensors, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    ours = dump(tensor_dump, model, [t[0] for t in tensors], out_dir)
    for name, qtype, raw, shape in tensors:
        info, data = ours[name]
        assert info["dtype"] == qtype.name.lower(), name
        assert tuple(info["shape"]) == shape, name
        ref = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert ref.shape == shape
        assert_same(data, ref, f"{name} ({qtype.name})")


def test_q5_converted_at_load_exactly(tensor_dump, tmp_path):
    """Q5_0 and Q5_1 (llama-quantize's fallback where rows are not a multiple of 256)
    are converted when the model is opened, to Q8_0 and F32: every value stays what
    gguf-py's dequantiser gives."""
    tensors = [t for t in make_tensors(np.random.default_rng(7)) if t[1] in (Q.Q5_0, Q.Q5_1)]
    path = tmp_path / "q5.gguf"
    write_gguf(path, tensors)
    ours = dump(tensor_dump, path, [t[0] for t in tensors], tmp_path, gguf_names=False)
    for name, qtype, raw, shape in tensors:
        info, data = ours[name]
        assert info["dtype"] == {Q.Q5_0: "q8_0", Q.Q5_1: "f32"}[qtype], name
        assert tuple(info["shape"]) == shape
        ref = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        assert_same(data, ref, f"{name} ({qtype.name} converted)")


@pytest.mark.parametrize("alignment", [None, 64])
def test_written_gguf_every_type(tensor_dump, tmp_path, alignment):
    tensors = make_tensors(np.random.default_rng(1234))
    path = tmp_path / "all_types.gguf"
    write_gguf(path, tensors, alignment=alignment)
    check_all(tensor_dump, path, tensors, tmp_path)


def test_written_split_gguf(tensor_dump, tmp_path):
    tensors = make_tensors(np.random.default_rng(99))
    write_gguf(tmp_path / "split.gguf", tensors, split_max_tensors=4)
    parts = sorted(p.name for p in tmp_path.glob("split-*.gguf"))
    assert parts == ["split-00001-of-00003.gguf", "split-00002-of-00003.gguf",
                     "split-00003-of-00003.gguf"]
    check_all(tensor_dump, tmp_path / parts[0], tensors, tmp_path)
    # A missing part is a clear error naming it.
    (tmp_path / parts[2]).unlink()
    r = run([tensor_dump, tmp_path / parts[0], "list"], check=False)
    assert r.returncode == 1
    assert parts[2] in r.stderr and "missing" in r.stderr


def test_written_gguf_metadata_types(tensor_dump, tmp_path):
    path = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**62)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 0.25)
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo\nworld")
    w.add_array("t.arr_str", ["a", "", "ccc"])
    w.add_array("t.arr_int", [1, -2, 3])
    w.add_array("t.arr_float", [0.5, -1.5])
    w.add_array("t.arr_bool", [True, False])
    w.add_tensor("x", np.arange(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = json.loads(run([tensor_dump, "--gguf-names", path, "meta"]).stdout)
    assert meta["general.architecture"] == "qwen2"
    assert meta["t.u8"] == 200 and meta["t.i8"] == -100
    assert meta["t.u16"] == 60000 and meta["t.i16"] == -30000
    assert meta["t.u32"] == 4_000_000_000 and meta["t.i32"] == -2_000_000_000
    assert meta["t.u64"] == 2**62 and meta["t.i64"] == -(2**62)
    assert meta["t.f32"] == 0.25 and meta["t.f64"] == 1e-300
    assert meta["t.bool"] is True and meta["t.str"] == "héllo\nworld"
    assert meta["t.arr_str"] == ["a", "", "ccc"]
    assert meta["t.arr_int"] == [1, -2, 3]
    assert meta["t.arr_float"] == [0.5, -1.5]
    assert meta["t.arr_bool"] == [True, False]
    _, extra = list_tensors(tensor_dump, path)
    assert extra["rope_pairs_interleaved"] is False  # not a llama file
