"""msModelSlim's W8A8 layout (--quantization ascend, as vllm-ascend reads it), served by
dserve, against a torch reference written here.

Two sources of checkpoints:
  - msmodelslim itself (PyPI; its PyTorch calibrator runs on the CPU): a tiny Llama
    quantised W8A8_DYNAMIC and static W8A8 (per-tensor weights, asymmetric min-max
    activations with input_offset), its files renamed to the names vllm-ascend reads
    (model.safetensors, quant_model_description.json);
  - files the test writes following the same layout, for what msmodelslim's CPU
    calibrator cannot do here: Qwen2 (with q/k/v biases) and DeepSeek-V3 (MoE experts
    one by one; kv_b_proj and the router gate FLOAT, as msModelSlim leaves them), with
    per-channel weights. The float weights are test_w8a8_reference.py's and
    test_w8a8_deepseek_reference.py's tiny models.
Layout, per quantised linear layer X: X.weight (int8), X.weight_scale and
X.weight_offset; for static W8A8 also X.input_scale, X.input_offset, X.deq_scale
(input_scale * weight_scale) and X.quant_bias (int32: the float bias over deq_scale,
minus input_offset * sum(q_w)); quant_model_description.json names every tensor's type.

The reference (reference_model) follows vllm-ascend's definitions (w8a8.py,
w8a8_dynamic.py): dynamic y = (q_x . q_w) * d_x * weight_scale + bias with q_x per
token (max|x| / 127, round half even); static y = deq_scale * (q_x . q_w + quant_bias)
with q_x = clamp(round(x / input_scale) + input_offset) (the float bias is in
quant_bias). dserve's log-probs must agree within 1e-3 at every position, up to
activations on a rounding tie (test_w8a8_reference.assert_agrees_up_to_ties).
"""
import json
import shutil

import pytest

from conftest import cache_dir, content_key

import torch
import transformers

import quantisers  # noqa: E402
import safetensors.torch  # noqa: E402

if quantisers.version("llmcompressor") is None:  # the float fixtures come from the W8A8 tests
    pytest.skip("llmcompressor is not installed", allow_module_level=True)

import test_w8a8_deepseek_reference as dsw  # noqa: E402
import test_w8a8_reference as w8a8  # noqa: E402

FIXTURE_VERSION = 4
FLOAT_LAYERS = ("lm_head", "mlp.gate", "kv_b_proj")  # what msModelSlim leaves in float


def _float_model(kind, name):
    """(float dir, model with one nn.Linear per projection, prompt)."""
    if kind == "deepseek":
        float_dir, _ = dsw.fixture(name)
        return float_dir, dsw._load_linearised(float_dir), dsw.prompt(name)
    case = next(c for c in w8a8.CASES if c["name"] == name)
    float_dir, _ = w8a8._fixture(case)
    model = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    return float_dir, model.eval(), w8a8._prompt(case)


def _quantised_linears(model):
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and not n.endswith(FLOAT_LAYERS)]


@torch.no_grad()
def _calibrate(model, vocab, seed, prompt):
    """(min, max) of every quantised linear layer's input over random prompts and the
    test's prompt."""
    ranges, hooks = {}, []
    for name, m in _quantised_linears(model):
        def hook(_, args, name=name):
            lo, hi = ranges.get(name, (0.0, 0.0))
            ranges[name] = (min(lo, args[0].min().item()), max(hi, args[0].max().item()))
        hooks.append(m.register_forward_pre_hook(hook))
    g = torch.Generator().manual_seed(3000 + seed)
    model(torch.randint(0, vocab, (8, 64), generator=g))
    model(torch.tensor([prompt]))
    for h in hooks:
        h.remove()
    return ranges


def _write(model, out_dir, static, vocab, seed, prompt):
    """The msModelSlim layout of `model`'s weights in out_dir (plus config, tokenizer)."""
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    types = {}
    ranges = _calibrate(model, vocab, seed, prompt) if static else {}
    layer_type = "W8A8" if static else "W8A8_DYNAMIC"
    for name, m in _quantised_linears(model):
        w = m.weight.detach().float()
        ws = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
        state[name + ".weight"] = torch.round(w / ws).clamp(-127, 127).to(torch.int8)
        state[name + ".weight_scale"] = ws
        state[name + ".weight_offset"] = torch.zeros_like(ws)
        new = [".weight", ".weight_scale", ".weight_offset"]
        if static:
            # Asymmetric, as msModelSlim's min-max: [lo, hi] onto int8, widened a little
            # so that the test's prompt stays inside (see _LOW).
            lo, hi = ranges[name]
            s = torch.tensor([(hi - lo) / 250.0], dtype=torch.float32)
            o = int(round(-(hi + lo) / 2 / s.item()))
            deq = (s * ws.reshape(-1)).float()
            bias = m.bias.detach().float() if m.bias is not None else torch.zeros(w.shape[0])
            q_sum = state[name + ".weight"].double().sum(dim=1)
            state[name + ".input_scale"] = s
            state[name + ".input_offset"] = torch.tensor([float(o)])
            state[name + ".deq_scale"] = deq
            state[name + ".quant_bias"] = torch.round(bias / deq - o * q_sum).to(torch.int32)
            new += [".input_scale", ".input_offset", ".deq_scale", ".quant_bias"]
        if m.bias is not None:
            new.append(".bias")
        for suffix in new:
            types[name + suffix] = layer_type
    for k in state:
        types.setdefault(k, "FLOAT")
    out_dir.mkdir(parents=True)
    safetensors.torch.save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    config.pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(config))
    (out_dir / "quant_model_description.json").write_text(
        json.dumps({"model_quant_type": layer_type, **types}, indent=1))


CASES = [
    dict(name="llama-msmodelslim-dynamic", kind="msmodelslim", base="llama-dynamic",
         static=False, vocab=w8a8.VOCAB),
    dict(name="llama-msmodelslim-static", kind="msmodelslim", base="llama-static",
         static=True, vocab=w8a8.VOCAB),
    dict(name="qwen2-msmodelslim-static", kind="msmodelslim", base="qwen2-static",
         static=True, vocab=w8a8.VOCAB),
    dict(name="llama-dynamic", kind="dense", base="llama-dynamic", static=False, vocab=w8a8.VOCAB),
    dict(name="llama-static", kind="dense", base="llama-static", static=True, vocab=w8a8.VOCAB),
    dict(name="qwen2-dynamic", kind="dense", base="qwen2-dynamic", static=False, vocab=w8a8.VOCAB),
    dict(name="qwen2-static", kind="dense", base="qwen2-static", static=True, vocab=w8a8.VOCAB),
    dict(name="deepseek-v3-dynamic", kind="deepseek", base="v3-qlora-yarn", static=False,
         vocab=dsw.ds.VOCAB),
    dict(name="deepseek-v3-static", kind="deepseek", base="v3-qlora-yarn", static=True,
         vocab=dsw.ds.VOCAB),
]


def fixture(case):
    """(float dir, ascend dir, prompt) for a case, written once and cached."""
    float_dir, model, prompt = _float_model(case["kind"], case["base"])
    key = content_key(case, FIXTURE_VERSION, transformers.__version__, torch.__version__,
                      quantisers.version("msmodelslim"))
    d = cache_dir() / f"ascend-w8a8-{case['name']}-{key}"
    if not (d / "done").exists():
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if case["kind"] == "msmodelslim":
            quantisers.run("msmodelslim_w8a8", float_dir=float_dir, out_dir=tmp / "w8a8",
                           vocab=case["vocab"], seed=len(case["name"]), static=case["static"])
        else:
            _write(model, tmp / "w8a8", case["static"], case["vocab"], len(case["name"]), prompt)
        (tmp / "done").write_text("")
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return float_dir, d / "w8a8", prompt


# dserve quantises static activations into [-127, 127], the format into [-128, 127]:
# -128 is left out so that the x86 kernels can move a weight's sign onto the activation
# (kernels.h, quantize_q8_token). The reference follows dserve there; it matters only
# where the format gives -128, the calibrated range's lowest step.
_LOW = -127


def _per_row(t, n):
    """A [n] float64 view of a per-channel ([n, 1] / [n]) or per-tensor ([1]) tensor;
    an int64 deq_scale holds float32 bits in its low word."""
    if t.dtype == torch.int64:
        t = (t & 0xffffffff).to(torch.int32).view(torch.float32)
    return t.reshape(-1).double().expand(n) if t.numel() == 1 else t.reshape(-1).double()


class AscendStaticLinear(torch.nn.Module):
    """y = deq_scale * (q_x . q_w + quant_bias), q_x = clamp(round(x / s) + o, _LOW, 127)."""

    def __init__(self, q_weight, input_scale, input_offset, deq_scale, quant_bias, key):
        super().__init__()
        self.q_weight = q_weight.double()
        self.s, self.o = float(input_scale), float(input_offset)
        self.deq, self.qb = deq_scale, quant_bias.double()
        self.key = key

    def forward(self, x):
        q = w8a8.ROUNDING.round(x.float() * (1.0 / torch.tensor(self.s)), self.key) + self.o
        q = torch.clamp(q, _LOW, 127).double()
        return ((q @ self.q_weight.T + self.qb) * self.deq).float()


@torch.no_grad()
def reference_model(model, w8a8_dir):
    """`model` (the float architecture with the checkpoint's float weights) with every
    linear layer the description quantises replaced by vllm-ascend's computation."""
    t = safetensors.torch.load_file(str(w8a8_dir / "model.safetensors"))
    description = json.loads((w8a8_dir / "quant_model_description.json").read_text())
    floats = {k: v for k, v in t.items() if description.get(k) == "FLOAT"}
    missing, unexpected = model.load_state_dict(floats, strict=False)
    assert not unexpected, unexpected
    n = 0
    for name, m in list(model.named_modules()):
        kind = description.get(name + ".weight")
        if not isinstance(m, torch.nn.Linear) or kind in (None, "FLOAT"):
            continue
        q, key, n_out = t[name + ".weight"], w8a8.input_key(name), m.weight.shape[0]
        assert q.dtype == torch.int8 and not t[name + ".weight_offset"].any()
        if kind == "W8A8":
            linear = AscendStaticLinear(q, t[name + ".input_scale"].item(),
                                        t[name + ".input_offset"].item(),
                                        _per_row(t[name + ".deq_scale"], n_out),
                                        t[name + ".quant_bias"], key)
        else:
            assert kind == "W8A8_DYNAMIC", kind
            scale = _per_row(t[name + ".weight_scale"], n_out).float()
            linear = w8a8.W8A8Linear(q, scale, None, m.bias, key=key)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, linear)
        n += 1
    assert n >= 14
    return model


def _reference_model(case, w8a8_dir):
    _, model, _ = _float_model(case["kind"], case["base"])
    return reference_model(model, w8a8_dir)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_against_torch_reference(case, dserve_bin, tmp_path):
    if case["kind"] == "msmodelslim" and quantisers.version("msmodelslim") is None:
        pytest.skip("msmodelslim is not installed (requirements-test-nodeps.txt)")
    float_dir, w8a8_dir, prompt = fixture(case)
    description = json.loads((w8a8_dir / "quant_model_description.json").read_text())
    if case["kind"] == "deepseek":
        assert description["model.layers.1.self_attn.kv_b_proj.weight"] == "FLOAT"
        assert description["model.layers.1.mlp.gate.weight"] == "FLOAT"
        assert description["model.layers.1.mlp.experts.5.up_proj.weight"] == description[
            "model_quant_type"] == ("W8A8" if case["static"] else "W8A8_DYNAMIC")
    reference = w8a8.reference_with_ties(_reference_model(case, w8a8_dir), prompt)
    for extra in ([], ["--quantization", "ascend"]):
        got = dsw.dserve_logprobs(dserve_bin, w8a8_dir, prompt, tmp_path, *extra)
        w8a8.assert_agrees_up_to_ties(got, reference, " ".join(extra) or "default")
    if case["kind"] == "deepseek":  # the absorbed MLA form too
        got = dsw.dserve_logprobs(dserve_bin, w8a8_dir, prompt, tmp_path, "--batch", 1)
        w8a8.assert_agrees_up_to_ties(got, reference, "--batch 1")


# ---- bad input: one clear error naming the tensor ----

@pytest.fixture
def ascend_copy(tmp_path):
    _, w8a8_dir, _ = fixture(next(c for c in CASES if c["name"] == "qwen2-static"))
    d = tmp_path / "model"
    shutil.copytree(w8a8_dir, d)
    return d


def _edit(d, tensors=None, description=None):
    if tensors is not None:
        path = d / "model.safetensors"
        t = safetensors.torch.load_file(str(path))
        tensors(t)
        safetensors.torch.save_file(t, str(path), metadata={"format": "pt"})
    if description is not None:
        path = d / "quant_model_description.json"
        j = json.loads(path.read_text())
        description(j)
        path.write_text(json.dumps(j))


LAYER = "model.layers.1.mlp.up_proj"


def test_scale_of_wrong_shape(dserve_bin, ascend_copy):
    name = LAYER + ".weight_scale"
    _edit(ascend_copy, tensors=lambda t: t.update({name: t[name][:-1]}))
    w8a8._fails_cleanly(dserve_bin, ascend_copy, name, "shape")


def test_int8_weight_without_its_scale(dserve_bin, ascend_copy):
    name = LAYER + ".weight_scale"
    _edit(ascend_copy, tensors=lambda t: t.pop(name), description=lambda j: j.pop(name))
    w8a8._fails_cleanly(dserve_bin, ascend_copy, LAYER + ".weight", name, "missing")


def test_description_names_a_tensor_that_does_not_exist(dserve_bin, ascend_copy):
    name = "model.layers.1.mlp.side_proj.weight"
    _edit(ascend_copy, description=lambda j: j.update({name: "W8A8"}))
    w8a8._fails_cleanly(dserve_bin, ascend_copy, name, "not in the safetensors")


def test_description_misses_a_tensor(dserve_bin, ascend_copy):
    name = LAYER + ".quant_bias"
    _edit(ascend_copy, description=lambda j: j.pop(name))
    w8a8._fails_cleanly(dserve_bin, ascend_copy, name, "does not describe")


@pytest.mark.parametrize("where", ["tensor", "model"])
def test_unknown_quant_type(dserve_bin, ascend_copy, where):
    key = LAYER + ".weight" if where == "tensor" else "model_quant_type"
    _edit(ascend_copy, description=lambda j: j.update({key: "W4A8_DYNAMIC"}))
    w8a8._fails_cleanly(dserve_bin, ascend_copy, key, "W4A8_DYNAMIC")


@pytest.mark.parametrize("suffix", [".weight_scale", ".input_scale", ".deq_scale"])
@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf"), -1.0])
def test_zero_or_non_finite_scale(dserve_bin, ascend_copy, suffix, value):
    name = LAYER + suffix

    def edit(t):
        t[name] = t[name].clone()
        t[name].view(-1)[0] = value
    _edit(ascend_copy, tensors=edit)
    w8a8._fails_cleanly(dserve_bin, ascend_copy, name, "finite and positive")


def test_deq_scale_contradicting_the_scales(dserve_bin, ascend_copy):
    name = LAYER + ".deq_scale"
    _edit(ascend_copy, tensors=lambda t: t.update({name: t[name] * 2}))
    w8a8._fails_cleanly(dserve_bin, ascend_copy, name, "input_scale * weight_scale")


def test_quantization_flag_must_match_the_files(dserve_bin, ascend_copy):
    w8a8._fails_cleanly(dserve_bin, ascend_copy, "--quantization compressed-tensors", "ascend",
                        extra=["--quantization", "compressed-tensors"])
