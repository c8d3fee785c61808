"""msModelSlim's W8A8 layout (--quantization ascend, as vllm-ascend reads it), served by
dserve, against a torch reference written here.

msmodelslim (PyPI) needs Ascend's torch_npu and does not run on this CPU machine, so
the test writes the files itself following the layout vllm-ascend reads
(vllm_ascend/quantization: w8a8.py, w8a8_dynamic.py, quant_config.py):
quant_model_description.json naming every tensor's type (W8A8_DYNAMIC, W8A8, FLOAT),
and per quantised linear layer X: X.weight (int8, per-channel symmetric here),
X.weight_scale and X.weight_offset ([n_out, 1]); for static W8A8 also X.input_scale
and X.input_offset ([1], calibrated on random prompts and the test's; offset 0: dserve reads
symmetric static activations only), X.deq_scale (input_scale * weight_scale, f32) and
X.quant_bias (int32, the layer's float bias over deq_scale, rounded). The float
weights are test_w8a8_reference.py's tiny Llama / Qwen2 and
test_w8a8_deepseek_reference.py's tiny DeepSeek-V3 (MoE experts one by one; kv_b_proj
and the router gate stay FLOAT, as msModelSlim leaves them).

The reference follows vllm-ascend's definitions: dynamic y = (q_x . q_w) * d_x *
weight_scale + bias with q_x per token (max|x| / 127, round half even); static
y = deq_scale * (q_x . q_w + quant_bias) with q_x = clamp(round(x / input_scale) +
input_offset, -128, 127) (the float bias is in quant_bias). dserve's log-probs must agree
within 1e-3 at every position, up to activations on a rounding tie
(test_w8a8_reference.assert_agrees_up_to_ties).
"""
import json
import shutil

import pytest

from conftest import cache_dir, content_key, run

import torch
import transformers

pytest.importorskip("llmcompressor")  # the float fixtures come from the W8A8 tests
import safetensors.torch  # noqa: E402

import test_w8a8_deepseek_reference as dsw  # noqa: E402
import test_w8a8_reference as w8a8  # noqa: E402

FIXTURE_VERSION = 2
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
    """max |input| of every quantised linear layer over random prompts and the test's
    prompt (so that no activation of the test passes the calibrated range, where
    vllm-ascend clamps to [-128, 127] and dserve to [-127, 127])."""
    amax, hooks = {}, []
    for name, m in _quantised_linears(model):
        def hook(_, args, name=name):
            amax[name] = max(amax.get(name, 0.0), args[0].abs().max().item())
        hooks.append(m.register_forward_pre_hook(hook))
    g = torch.Generator().manual_seed(3000 + seed)
    model(torch.randint(0, vocab, (8, 64), generator=g))
    model(torch.tensor([prompt]))
    for h in hooks:
        h.remove()
    return amax


def _write(model, out_dir, static, vocab, seed, prompt):
    """The msModelSlim layout of `model`'s weights in out_dir (plus config, tokenizer)."""
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    types = {}
    amax = _calibrate(model, vocab, seed, prompt) if static else {}
    layer_type = "W8A8" if static else "W8A8_DYNAMIC"
    for name, m in _quantised_linears(model):
        w = m.weight.detach().float()
        ws = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
        state[name + ".weight"] = torch.round(w / ws).clamp(-127, 127).to(torch.int8)
        state[name + ".weight_scale"] = ws
        state[name + ".weight_offset"] = torch.zeros_like(ws)
        new = [".weight", ".weight_scale", ".weight_offset"]
        if static:
            s = torch.tensor([amax[name] / 127.0], dtype=torch.float32)
            deq = (s * ws.reshape(-1)).float()
            bias = m.bias.detach().float() if m.bias is not None else torch.zeros(w.shape[0])
            state[name + ".input_scale"] = s
            state[name + ".input_offset"] = torch.zeros(1, dtype=torch.int8)
            state[name + ".deq_scale"] = deq
            state[name + ".quant_bias"] = torch.round(bias / deq).to(torch.int32)
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
    key = content_key(case, FIXTURE_VERSION, transformers.__version__, torch.__version__)
    d = cache_dir() / f"ascend-w8a8-{case['name']}-{key}"
    if not (d / "done").exists():
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _write(model, tmp / "w8a8", case["static"], case["vocab"], len(case["name"]), prompt)
        (tmp / "done").write_text("")
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return float_dir, d / "w8a8", prompt


class AscendStaticLinear(torch.nn.Module):
    """y = deq_scale * (q_x . q_w + quant_bias), q_x = clamp(round(x / s) + o, -128, 127)."""

    def __init__(self, q_weight, input_scale, input_offset, deq_scale, quant_bias, key):
        super().__init__()
        self.q_weight = q_weight.double()
        self.s, self.o = float(input_scale), float(input_offset)
        self.deq, self.qb = deq_scale.double(), quant_bias.double()
        self.key = key

    def forward(self, x):
        q = w8a8.ROUNDING.round(x.float() * (1.0 / torch.tensor(self.s)), self.key) + self.o
        q = torch.clamp(q, -128, 127).double()
        return ((q @ self.q_weight.T + self.qb) * self.deq).float()


@torch.no_grad()
def _reference_model(case, w8a8_dir):
    _, model, _ = _float_model(case["kind"], case["base"])
    t = safetensors.torch.load_file(str(w8a8_dir / "model.safetensors"))
    n = 0
    for name, m in _quantised_linears(model):
        q, key = t[name + ".weight"], w8a8.input_key(name)
        assert q.dtype == torch.int8 and not t[name + ".weight_offset"].any()
        if case["static"]:
            linear = AscendStaticLinear(q, t[name + ".input_scale"].item(),
                                        t[name + ".input_offset"].item(), t[name + ".deq_scale"],
                                        t[name + ".quant_bias"], key)
        else:
            linear = w8a8.W8A8Linear(q, t[name + ".weight_scale"], None,
                                     t.get(name + ".bias"), key=key)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, linear)
        n += 1
    assert n >= 14
    return model


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_against_torch_reference(case, dserve_bin, tmp_path):
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
