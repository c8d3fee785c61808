"""DeepSeek-V3's multi-token-prediction (MTP) layer, against a torch reference.

The checkpoint is the tiny DeepSeek-V3 of test_deepseek_reference.py with an MTP module
added as DeepSeek ships it, in layer n_layers: enorm, hnorm, eh_proj, a full MLA + MoE
decoder block and shared_head (norm, head), random weights of realistic scale
(num_nextn_predict_layers: 1). The reference follows DeepSeek-V3's technical report
(section 2.2) and vLLM's deepseek_mtp.py: at position p the token t[p+1] and the main
model's output h[p] (after its final norm) give
    x = eh_proj([enorm(embed(t[p+1])) | hnorm(h[p])])   (the embedding zeroed at p = 0),
    x = block(x) at position p,   logits = shared_head.head(shared_head.norm(x)),
with transformers' own DeepseekV3 modules for the block (the checkpoint loaded with one
more layer, so that transformers maps the block's weights itself) and the rest written
here. dserve (test tool mtp_tool) must agree within 1e-3 in F32 at every position.
"""
import json
import shutil

import pytest

from conftest import run
from test_deepseek_reference import VOCAB, _cached, _case, _fixture, _key

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

MTP_FIXTURE_VERSION = 1


def _with_mtp_layer(tmp, case):
    """The case's checkpoint plus random MTP weights in layer n_layers."""
    src, _ = _fixture(case)
    for f in src.iterdir():
        if f.name != "reference.json":
            shutil.copy(f, tmp / f.name)
    tensors = safetensors_torch.load_file(tmp / "model.safetensors")
    n, h = case["layers"], case["hidden"]
    g = torch.Generator().manual_seed(77)
    extra = {}
    for name, t in tensors.items():
        if not name.startswith(f"model.layers.{n - 1}."):
            continue
        new = name.replace(f"layers.{n - 1}.", f"layers.{n}.")
        if name.endswith("norm.weight"):
            extra[new] = 1.0 + 0.2 * torch.randn(t.shape, generator=g)
        elif name.endswith("e_score_correction_bias"):
            extra[new] = 0.05 * torch.randn(t.shape, generator=g)
        else:
            extra[new] = t.float().std() * torch.randn(t.shape, generator=g)
    p = f"model.layers.{n}."
    extra.update({p + "enorm.weight": 1.0 + 0.2 * torch.randn(h, generator=g),
                  p + "hnorm.weight": 1.0 + 0.2 * torch.randn(h, generator=g),
                  p + "eh_proj.weight": 0.06 * torch.randn(h, 2 * h, generator=g),
                  p + "shared_head.norm.weight": 1.0 + 0.2 * torch.randn(h, generator=g),
                  p + "shared_head.head.weight": 0.1 * torch.randn(VOCAB, h, generator=g)})
    tensors.update(extra)
    safetensors_torch.save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (tmp / "config.json").write_text(json.dumps(config))


def _rms_norm(x, w, eps):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    norm = DeepseekV3RMSNorm(x.shape[-1], eps=eps)
    norm.weight.data.copy_(w)
    return norm(x)


@torch.no_grad()
def _reference_mtp_logits(d, prompt, case):
    """[len(prompt) - 1, vocab]: the MTP layer's logits at positions 0 .. n - 2."""
    load = transformers.AutoModelForCausalLM.from_pretrained
    main = load(d, dtype=torch.float32).eval()
    cfg = transformers.AutoConfig.from_pretrained(d)
    n = cfg.num_hidden_layers
    cfg.num_hidden_layers = n + 1  # the MTP block as one more layer, weights mapped
    cfg._attn_implementation = "eager"
    extended = load(d, config=cfg, dtype=torch.float32).eval()
    block = extended.model.layers[n]
    w = safetensors_torch.load_file(d / "model.safetensors")
    p, eps = f"model.layers.{n}.", cfg.rms_norm_eps

    ids = torch.tensor([prompt])
    h = main.model(ids).last_hidden_state[0, :-1]  # after the final norm, as vLLM feeds it
    m = h.shape[0]
    e = main.model.embed_tokens(ids[0, 1:])
    positions = torch.arange(m)
    e[positions == 0] = 0
    x = torch.cat([_rms_norm(e, w[p + "enorm.weight"], eps),
                   _rms_norm(h, w[p + "hnorm.weight"], eps)], dim=-1) @ w[p + "eh_proj.weight"].T
    x = x[None]
    rope = extended.model.rotary_emb(x, positions[None])
    mask = torch.full((1, 1, m, m), float("-inf")).triu(1)
    out = block(x, attention_mask=mask, position_ids=positions[None], position_embeddings=rope)
    out = out[0] if isinstance(out, tuple) else out
    out = _rms_norm(out[0], w[p + "shared_head.norm.weight"], eps)
    return out @ w[p + "shared_head.head.weight"].T


def mtp_checkpoint():
    """(checkpoint dir, prompt, reference logits) of the tiny V3 with an MTP layer."""
    case = _case("v3-qlora-yarn")

    def build(tmp):
        _with_mtp_layer(tmp, case)
        _, ref = _fixture(case)
        prompt = ref["prompt"]
        logits = _reference_mtp_logits(tmp, prompt, case)
        (tmp / "reference.json").write_text(json.dumps({"prompt": prompt,
                                                        "mtp_logits": logits.tolist()}))
    d, ref = _cached("tiny-deepseek-v3-mtp", _key(case, MTP_FIXTURE_VERSION), build)
    return d, ref


def _fp8_mtp_checkpoint():
    """The MTP checkpoint with every linear projection (the MTP layer's too) in FP8
    with 128 x 128 block scales, as DeepSeek ships V3/R1; the reference from the
    weights as dserve keeps them (dequantised; kv_b_proj rounded to BF16)."""
    from test_deepseek_reference import FP8_BLOCK, _fp8_dequantize, _fp8_quantize, _is_fp8_linear
    case = _case("v3-qlora-yarn")
    src, ref = mtp_checkpoint()

    def build(tmp):
        tensors = safetensors_torch.load_file(src / "model.safetensors")
        fp8, kept = {}, {}
        for name, t in tensors.items():
            if _is_fp8_linear(name, t):
                q, sc = _fp8_quantize(t)
                fp8[name], fp8[name + "_scale_inv"] = q, sc
                deq = _fp8_dequantize(q, sc)
                kept[name] = (deq.to(torch.bfloat16).float() if name.endswith("kv_b_proj.weight")
                              else deq)
            else:
                fp8[name] = kept[name] = t
        config = json.loads((src / "config.json").read_text())
        ref_dir = tmp / "dequantised"
        ref_dir.mkdir()
        (ref_dir / "config.json").write_text(json.dumps(config))
        safetensors_torch.save_file(kept, ref_dir / "model.safetensors", metadata={"format": "pt"})
        logits = _reference_mtp_logits(ref_dir, ref["prompt"], case)
        shutil.rmtree(ref_dir)
        safetensors_torch.save_file(fp8, tmp / "model.safetensors", metadata={"format": "pt"})
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                         "activation_scheme": "dynamic",
                                         "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
        (tmp / "config.json").write_text(json.dumps(config))
        (tmp / "reference.json").write_text(json.dumps({"prompt": ref["prompt"],
                                                        "mtp_logits": logits.tolist()}))
    return _cached("tiny-deepseek-v3-mtp-fp8", _key(case, MTP_FIXTURE_VERSION, FP8_BLOCK), build)


def _worst_mtp_error(test_tool, d, ref):
    prompt, want = ref["prompt"], ref["mtp_logits"]
    r = run([test_tool("mtp_tool"), "--model", d, "--prompt-ids", ",".join(map(str, prompt)),
             "--threads", 2])
    got = json.loads(r.stdout)["logits"]
    assert len(got) == len(want) == len(prompt) - 1
    return max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))


def test_mtp_fp8_layer_kept_at_one_byte(test_tool):
    """The MTP layer loads in the checkpoint's FP8 (kept at one byte, the kernels
    convert) and matches the reference on the weights as dserve holds them."""
    d, ref = _fp8_mtp_checkpoint()
    assert _worst_mtp_error(test_tool, d, ref) < 1e-3


def test_mtp_logits_match_the_reference(test_tool):
    d, ref = mtp_checkpoint()
    prompt, want = ref["prompt"], ref["mtp_logits"]
    r = run([test_tool("mtp_tool"), "--model", d, "--prompt-ids", ",".join(map(str, prompt)),
             "--threads", 2])
    got = json.loads(r.stdout)["logits"]
    assert len(got) == len(want) == len(prompt) - 1
    worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))
    assert worst < 1e-3, worst
    # The head is not degenerate: the reference's argmax varies over the positions.
    assert len({max(range(VOCAB), key=row.__getitem__) for row in want}) > 5


def _engine(test_tool, model, tmp_path, requests, *args):
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests))
    r = run([test_tool("engine_tool"), "--model", model, "--requests", path, "--threads", 2,
             "--block-size", 16, *args])
    return json.loads(r.stdout)


def _mtp(n):
    return ["--speculative-config",
            json.dumps({"method": "deepseek_mtp", "num_speculative_tokens": n})]


def test_mtp_speculation_keeps_every_output(test_tool, tmp_path):
    """32 requests batched with chunked prefill, greedy and seeded-sampled, with 1-3
    MTP drafts per step: the same tokens as without speculation (random MTP weights:
    drafts are rejected, so every step verifies and corrects); then with a pool small
    enough to preempt. Every block comes back."""
    import random
    d, _ = mtp_checkpoint()
    rng = random.Random(99)
    reqs = [{"prompt": [rng.randrange(0, VOCAB) for _ in range(rng.randrange(1, 200))],
             "max_tokens": rng.randrange(2, 40)} for _ in range(32)]
    for i, r in enumerate(reqs):
        if i % 3 == 0:
            r.update(temperature=0.9, seed=500 + i)
    batch = ["--mode", "batch", "--max-num-batched-tokens", 128]
    plain = _engine(test_tool, d, tmp_path, reqs, *batch)
    for n in (1, 2, 3):
        spec = _engine(test_tool, d, tmp_path, reqs, *batch, *_mtp(n))
        assert spec["outputs"] == plain["outputs"], n
        s = spec["stats"]
        assert s["n_free_blocks"] == s["n_blocks"]
        assert s["spec_n_drafts"] > 0
        # Each drafting step proposes N drafts unless its chain ran out of slots.
        assert s["spec_n_drafts"] <= s["spec_n_draft_tokens"] <= n * s["spec_n_drafts"]
    tight = ["--mode", "batch", "--max-num-batched-tokens", 64, "--num-blocks", 24]
    want = _engine(test_tool, d, tmp_path, reqs, *tight)
    got = _engine(test_tool, d, tmp_path, reqs, *tight, *_mtp(2))
    assert got["stats"]["n_preemptions"] > 0
    assert got["outputs"] == want["outputs"] == plain["outputs"]
    assert got["stats"]["n_free_blocks"] == got["stats"]["n_blocks"] == 24


def _served_ids(server, prompts, max_tokens=24, **kw):
    import openai
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    model = c.models.list().data[0].id
    out = []
    for p in prompts:
        r = c.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0,
                                 logprobs=1, extra_body={"ignore_eos": True}, **kw)
        out.append([t for t in r.choices[0].logprobs.tokens])
    return out


def test_mtp_under_tensor_parallelism_serves_the_same_tokens(dserve_bin, tmp_path):
    """dserve serve on 2 tensor-parallel ranks with 2 MTP drafts per step, token-id
    prompts through the openai SDK: the same tokens as one rank without speculation."""
    import random
    import server_util
    d, _ = mtp_checkpoint()
    rng = random.Random(4)
    prompts = [[rng.randrange(0, VOCAB) for _ in range(n)] for n in (5, 17, 40)]
    common = ["--threads", 2, "--max-model-len", 256, "--kv-cache-memory", 16 << 20]
    with server_util.running(dserve_bin, d, *common, log_path=tmp_path / "one.log") as one:
        want = _served_ids(one, prompts)
    mtp = json.dumps({"method": "deepseek_mtp", "num_speculative_tokens": 2})
    with server_util.running(dserve_bin, d, *common, "--tensor-parallel-size", 2,
                             "--master-port", server_util.free_port(),
                             "--speculative-config", mtp, log_path=tmp_path / "tp.log") as tp:
        got = _served_ids(tp, prompts)
        m = tp.metrics()
    assert got == want
    drafts = sum(s.value for s in m["vllm:spec_decode_num_drafts"].samples
                 if s.name.endswith("_total"))
    assert drafts > 0
