"""dserve against transformers on tiny random Llama and Qwen2 checkpoints.

Each case builds a small LlamaForCausalLM / Qwen2ForCausalLM with transformers at a
fixed seed (GQA, tied or untied embeddings, Qwen2 q/k/v biases, every RoPE scaling
type dserve supports, F32 and BF16), saves it as a Hugging Face directory, and records
transformers' outputs for a fixed 64-token prompt: per-position log-probabilities,
top-1 tokens and a 32-token greedy continuation. Checkpoint and reference are cached
under $DSERVE_CACHE/fixtures keyed by a hash of everything that produced them.

dserve is driven through its CLI with token ids (no tokenizer needed):
`perplexity --token-ids` for log-probabilities, `generate --prompt-ids` for greedy text.

F32: log-probabilities within 1e-3 and identical greedy continuations.
BF16: the reference is transformers evaluating the same BF16 weights with FP32
arithmetic (dserve keeps activations, norms and accumulation in FP32 by design; a
pure-BF16 torch run rounds every intermediate and is a noisier oracle). There the
top-1 token must agree at every position, log-probabilities agree within 1e-3 and the
greedy continuations must be identical. Against the pure-BF16 transformers run, top-1 must agree wherever that run
is not itself near a tie.
"""
import json
import shutil

import pytest

from conftest import cache_dir, content_key, run

import torch
import transformers

VOCAB = 512
PROMPT_LEN = 64
GEN_LEN = 32
FIXTURE_VERSION = 5  # bump when the way checkpoints or references are made changes

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
YARN_MSCALE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
               "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.707, "mscale_all_dim": 1.0}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
LINEAR = {"rope_type": "linear", "factor": 2.0}

# name, architecture, dtype, tied, rope scaling (None: default), sizes, seed
CASES = [
    dict(name="llama-f32-untied", arch="llama", dtype="float32", tied=False, rope=None,
         hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, theta=10000.0, seed=1),
    dict(name="llama-f32-tied-llama3", arch="llama", dtype="float32", tied=True, rope=LLAMA3,
         hidden=128, layers=3, heads=8, kv_heads=2, ffn=320, theta=500000.0, seed=2),
    dict(name="llama-f32-yarn", arch="llama", dtype="float32", tied=False, rope=YARN,
         hidden=192, layers=2, heads=6, kv_heads=3, ffn=384, theta=10000.0, seed=3),
    dict(name="llama-f32-linear-bias", arch="llama", dtype="float32", tied=True, rope=LINEAR,
         hidden=128, layers=2, heads=4, kv_heads=1, ffn=256, theta=10000.0, seed=4,
         attention_bias=True),
    dict(name="qwen2-f32-untied", arch="qwen2", dtype="float32", tied=False, rope=None,
         hidden=256, layers=2, heads=8, kv_heads=2, ffn=512, theta=1000000.0, seed=5),
    dict(name="qwen2-f32-tied-yarn", arch="qwen2", dtype="float32", tied=True, rope=YARN_MSCALE,
         hidden=128, layers=4, heads=4, kv_heads=2, ffn=256, theta=10000.0, seed=6),
    dict(name="llama-bf16-tied", arch="llama", dtype="bfloat16", tied=True, rope=LLAMA3,
         hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, theta=10000.0, seed=7),
    dict(name="qwen2-bf16-untied", arch="qwen2", dtype="bfloat16", tied=False, rope=YARN,
         hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, theta=10000.0, seed=8),
]


def _config(case):
    common = dict(
        vocab_size=VOCAB, hidden_size=case["hidden"], intermediate_size=case["ffn"],
        num_hidden_layers=case["layers"], num_attention_heads=case["heads"],
        num_key_value_heads=case["kv_heads"], max_position_embeddings=256,
        rms_norm_eps=1e-5, tie_word_embeddings=case["tied"], initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": case["theta"],
                         **(case["rope"] or {})},
    )
    if case["arch"] == "llama":
        return transformers.LlamaConfig(attention_bias=case.get("attention_bias", False), **common)
    return transformers.Qwen2Config(**common)


def _build_model(case):
    torch.manual_seed(case["seed"])
    config = _config(case)
    cls = (transformers.LlamaForCausalLM if case["arch"] == "llama"
           else transformers.Qwen2ForCausalLM)
    model = cls(config)
    # transformers initialises norms to 1 and biases to 0; perturb them so that a
    # kernel ignoring a norm weight or a bias cannot pass.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.to(getattr(torch, case["dtype"])).eval()


def _prompt(case):
    g = torch.Generator().manual_seed(1000 + case["seed"])
    return torch.randint(0, VOCAB, (PROMPT_LEN,), generator=g).tolist()


@torch.no_grad()
def _reference(model, prompt):
    ids = torch.tensor([prompt])
    logits = model(ids).logits[0].float()  # [PROMPT_LEN, VOCAB]
    logprobs = torch.log_softmax(logits, dim=-1)
    scored = logprobs[:-1].gather(1, ids[0, 1:, None])[:, 0]
    top2 = logits.topk(2, dim=-1).values
    # An explicit mask: without one, generate() treats prompt tokens equal to the pad id
    # as padding and masks them out.
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GEN_LEN,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return {
        "logprobs": scored.tolist(),                 # log p(prompt[i] | prompt[:i]), i = 1..63
        "top1": logits.argmax(-1).tolist(),          # top-1 after each prefix
        "margin": (top2[:, 0] - top2[:, 1]).tolist(),  # top-1 minus top-2 logit
        "greedy": out[0, PROMPT_LEN:].tolist(),
    }


def _fixture(case):
    """(checkpoint dir, prompt, references) for a case, built once and cached."""
    key = content_key(case, FIXTURE_VERSION, VOCAB, PROMPT_LEN, GEN_LEN,
                      transformers.__version__, torch.__version__)
    d = cache_dir() / f"tiny-{case['name']}-{key}"
    ref_path = d / "reference.json"
    if not ref_path.exists():
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _build_model(case).save_pretrained(tmp)
        # References come from the saved checkpoint, loaded as a user would load it
        # (casting a live model with .to() would also round its RoPE buffers).
        prompt = _prompt(case)
        load = transformers.AutoModelForCausalLM.from_pretrained
        dtype = getattr(torch, case["dtype"])
        ref = {"prompt": prompt, "native": _reference(load(tmp, dtype=dtype).eval(), prompt)}
        if case["dtype"] != "float32":
            ref["fp32"] = _reference(load(tmp, dtype=torch.float32).eval(), prompt)
        (tmp / "reference.json").write_text(json.dumps(ref))
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return d, json.loads(ref_path.read_text())


def tiny_checkpoint(name="llama-f32-untied"):
    """A cached tiny checkpoint directory (for other tests: CLI errors)."""
    return _fixture(next(c for c in CASES if c["name"] == name))[0]


def _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text(",".join(map(str, prompt)))
    out = tmp_path / "logprobs.json"
    run([dserve_bin, "perplexity", "--model", model_dir, "--token-ids", ids,
         "--logprobs-out", out, "--threads", 2])
    got = json.loads(out.read_text())
    assert got["input_ids"] == prompt
    rows = got["scored"]
    assert [r["position"] for r in rows] == list(range(1, PROMPT_LEN))
    return [r["logprob"] for r in rows], [r["top_id"] for r in rows]


def _dserve_greedy(dserve_bin, model_dir, prompt):
    r = run([dserve_bin, "generate", "--model", model_dir, "--prompt-ids",
             ",".join(map(str, prompt)), "--max-tokens", GEN_LEN, "--temperature", 0,
             "--print-ids", "--ignore-eos", "--threads", 2])
    return [int(x) for x in r.stdout.strip().split(",")]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_against_transformers(case, dserve_bin, tmp_path):
    model_dir, ref = _fixture(case)
    prompt = ref["prompt"]
    logprobs, top1 = _dserve_logprobs(dserve_bin, model_dir, prompt, tmp_path)
    greedy = _dserve_greedy(dserve_bin, model_dir, prompt)

    if case["dtype"] == "float32":
        want = ref["native"]
        worst = max(abs(a - b) for a, b in zip(logprobs, want["logprobs"]))
        assert worst < 1e-3, f"max |log-prob difference| {worst:.2e}"
        assert greedy == want["greedy"]
        return

    # BF16 weights, FP32 arithmetic on both sides.
    want = ref["fp32"]
    mismatches = [i for i, (a, b) in enumerate(zip(top1, want["top1"][:-1])) if a != b]
    assert not mismatches, f"top-1 differs at positions {mismatches}"
    assert greedy == want["greedy"]
    worst = max(abs(a - b) for a, b in zip(logprobs, want["logprobs"]))
    assert worst < 1e-3, f"max |log-prob difference| {worst:.2e} against BF16 weights in FP32"
    # Pure-BF16 transformers: agree wherever that run's own top two are not near a tie.
    native = ref["native"]
    disagree = [i for i, (a, b) in enumerate(zip(top1, native["top1"][:-1]))
                if a != b and native["margin"][i] > 0.1]
    assert not disagree, f"top-1 differs from pure-BF16 transformers at {disagree}"


@pytest.mark.parametrize("batch,ctx", [(5, 0), (64, 24)])
def test_chunked_prefill_and_windows(batch, ctx, dserve_bin, tmp_path):
    """Feeding the prompt in batches that continue a KV cache gives the same
    log-probabilities as one batch; windows restart the cache at their boundaries."""
    model_dir, ref = _fixture(CASES[1])
    prompt = ref["prompt"]
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, prompt)))
    out = tmp_path / "logprobs.json"
    run([dserve_bin, "perplexity", "--model", model_dir, "--token-ids", ids, "--batch", batch,
         "--ctx", ctx, "--logprobs-out", out, "--threads", 2])
    rows = json.loads(out.read_text())["scored"]
    if ctx == 0:
        got = [r["logprob"] for r in rows]
        assert max(abs(a - b) for a, b in zip(got, ref["native"]["logprobs"])) < 1e-3
        return
    # Windows [0, 24), [24, 48), [48, 64): each scores all but its first token, and
    # the first window equals the unwindowed reference.
    assert [r["position"] for r in rows] == [p for p in range(1, PROMPT_LEN) if p % ctx != 0]
    first = [r["logprob"] for r in rows if r["position"] < ctx]
    assert max(abs(a - b) for a, b in zip(first, ref["native"]["logprobs"][:ctx - 1])) < 1e-3
