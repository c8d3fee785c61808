"""W8A8 (compressed-tensors int-quantized) DeepSeek-V3 and DeepSeek-V2 checkpoints made
by llmcompressor, served by dserve, against a torch reference written here.

The tiny random DeepSeek models are test_deepseek_reference.py's (MLA with and without
q_lora_rank, YaRN, the first layer dense and the rest DeepSeekMoE with 16 routed
experts). llmcompressor loads each with its MoE experts linearised
(load_quantizable_moe: one nn.Linear per expert projection, so that every expert is
calibrated and quantised) and quantises it one-shot with its "W8A8" preset: int8
weights with per-channel scales, activations quantised per token at run time. It
leaves lm_head and the router gates (mlp.gate) in float, as its DeepSeek examples
do; the checkpoint stores experts one by one (experts.N.gate_proj.weight, ...).

The reference reads the saved checkpoint: the float model (experts linearised the
same way) with every int8 weight dequantised (q * weight_scale), and each quantised
linear layer's input quantised per token (d = max|x| / 127, q = round-half-even(x / d))
before the int8 product, as test_w8a8_reference.py's reference does (and, as there,
activations that sit on a rounding tie may be rounded the other way to match). One exception,
as in vLLM: MLA's kv_b_proj is dequantised once at load and multiplied in float (its
weight is split and absorbed into the query and output paths, vLLM's MLA does the
same), so its input is not quantised. dserve runs the expanded (one batch) and the
weight-absorbed (token by token) forms of MLA; both must agree with the reference
within 1e-3, and so be as far from the float model as the format itself is.
"""
import contextlib
import json
import shutil

import pytest

from conftest import cache_dir, content_key, run

import torch
import transformers

import quantisers  # noqa: E402
import safetensors.torch  # noqa: E402

if quantisers.version("llmcompressor") is None:
    pytest.skip("llmcompressor is not installed", allow_module_level=True)

import test_deepseek_reference as ds  # noqa: E402
import test_w8a8_reference as w8a8  # noqa: E402

FIXTURE_VERSION = 1
PROMPT_LEN = 48
# The layers dserve (as vLLM's MLA) multiplies in float after dequantising the weight.
FLOAT_ACTIVATION_LAYERS = ("kv_b_proj",)

CASES = ["v3-qlora-yarn", "v2-grouped"]


@contextlib.contextmanager
def _conversion_mappings_restored():
    """transformers' checkpoint conversion mappings as they were before the block.
    load_quantizable_moe registers llmcompressor's for the model type (to load the
    experts as 2D linears, then to save them so) and leaves them registered: a DeepSeek
    model saved later in the same process would keep its fused 3D experts
    (experts.gate_up_proj), which no Hugging Face checkpoint has, and a plain
    from_pretrained would leave the experts randomly initialised."""
    from transformers import conversion_mapping as cm
    cache = cm._checkpoint_conversion_mapping_cache
    saved = None if cache is None else dict(cache)
    user = set(cm.USER_REGISTERED_MAPPINGS)
    try:
        yield
    finally:
        cm._checkpoint_conversion_mapping_cache = saved
        cm.USER_REGISTERED_MAPPINGS.clear()
        cm.USER_REGISTERED_MAPPINGS.update(user)


def _load_linearised(model_dir):
    """The model with its MoE experts as one nn.Linear per projection (llmcompressor's),
    for use in memory (it is not saved; quantisers.llmcompressor_deepseek_w8a8 saves in
    a process of its own)."""
    from llmcompressor.modeling.moe.linearize import load_quantizable_moe
    with _conversion_mappings_restored(), load_quantizable_moe():
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def fixture(name):
    """(float dir, W8A8 dir) for a test_deepseek_reference case, built once and cached."""
    case = ds._case(name)
    key = content_key(case, FIXTURE_VERSION, ds.VOCAB, transformers.__version__,
                      torch.__version__, quantisers.version("llmcompressor"))
    d = cache_dir() / f"w8a8-deepseek-{name}-{key}"
    if not (d / "done").exists():
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        ds._build_model(case).save_pretrained(tmp / "float")
        quantisers.word_level_tokenizer(ds.VOCAB).save_pretrained(tmp / "float")
        quantisers.run("llmcompressor_deepseek_w8a8", float_dir=tmp / "float",
                       out_dir=tmp / "w8a8", vocab=ds.VOCAB, seed=2000 + case["seed"])
        (tmp / "done").write_text("")
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return d / "float", d / "w8a8"


def prompt(name):
    g = torch.Generator().manual_seed(1000 + ds._case(name)["seed"])
    return torch.randint(0, ds.VOCAB, (PROMPT_LEN,), generator=g).tolist()


@torch.no_grad()
def _reference_model(float_dir, w8a8_dir):
    tensors = safetensors.torch.load_file(str(w8a8_dir / "model.safetensors"))
    model = _load_linearised(float_dir)  # the architecture; every weight replaced below
    state = {k: v for k, v in tensors.items() if not k.endswith("_scale")}
    for name, t in list(state.items()):
        if t.dtype == torch.int8:
            state[name] = t.float() * tensors[name + "_scale"].float()
    model.load_state_dict(state, strict=True)
    n_int8 = 0
    for name, module in list(model.named_modules()):
        w = tensors.get(name + ".weight")
        if not isinstance(module, torch.nn.Linear) or w is None or w.dtype != torch.int8:
            continue
        if name.endswith(FLOAT_ACTIVATION_LAYERS):
            continue  # dequantised above, multiplied in float
        n_int8 += 1
        linear = w8a8.W8A8Linear(w, tensors[name + ".weight_scale"], None, module.bias,
                                 key=w8a8.input_key(name))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, linear)
    assert n_int8 > 40  # attention, shared and routed experts of every layer
    return model


def dserve_logprobs(dserve_bin, model_dir, ids, tmp_path, *extra):
    path = tmp_path / "ids.txt"
    path.write_text(",".join(map(str, ids)))
    out = tmp_path / "logprobs.json"
    run([dserve_bin, "perplexity", "--model", model_dir, "--token-ids", path,
         "--logprobs-out", out, "--threads", 2, *extra])
    rows = json.loads(out.read_text())["scored"]
    assert [r["position"] for r in rows] == list(range(1, len(ids)))
    return [r["logprob"] for r in rows]


def assert_formats_error(got, want, float_dir, ids):
    """Really quantised: the format's own error (the reference `want` against the float
    model) is far above the agreement tolerance, and dserve's distance from the float
    model is that error. Its size depends on llmcompressor's calibration and, in these
    tiny random MoE models, on int8 noise moving a router's choice; not dserve's to bound."""
    unquantised = w8a8._logprobs(_load_linearised(float_dir), ids)
    format_error = w8a8.mean_distance(want, unquantised)
    assert format_error > 1e-2, format_error
    assert abs(w8a8.mean_distance(got, unquantised) - format_error) < 1e-3


@pytest.mark.parametrize("name", CASES)
def test_against_torch_reference(name, dserve_bin, tmp_path):
    float_dir, w8a8_dir = fixture(name)
    q = json.loads((w8a8_dir / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "int-quantized"
    tensors = safetensors.torch.load_file(str(w8a8_dir / "model.safetensors"))
    for t in ("model.layers.1.mlp.experts.3.down_proj.weight",
              "model.layers.1.mlp.shared_experts.up_proj.weight",
              "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
              "model.layers.0.mlp.gate_proj.weight"):
        assert tensors[t].dtype == torch.int8, t
    assert tensors["model.layers.1.mlp.gate.weight"].dtype == torch.float32  # router: float
    assert tensors["lm_head.weight"].dtype == torch.float32

    ids = prompt(name)
    reference = w8a8.reference_with_ties(_reference_model(float_dir, w8a8_dir), ids)
    expanded = dserve_logprobs(dserve_bin, w8a8_dir, ids, tmp_path, "--batch", 512)
    absorbed = dserve_logprobs(dserve_bin, w8a8_dir, ids, tmp_path, "--batch", 1,
                               "--quantization", "compressed-tensors")
    # Within 1e-3 everywhere, up to activations on a rounding tie (w8a8.Rounding).
    flips = w8a8.assert_agrees_up_to_ties(expanded, reference, "expanded MLA")
    w8a8.assert_agrees_up_to_ties(absorbed, reference, "absorbed MLA")
    assert_formats_error(expanded, reference(flips)[0], float_dir, ids)
