"""--kv-cache-dtype fp8 (float8_e4m3fn latents or keys and values, a quarter of float32's
bytes, half of float16's), measured against transformers through `dserve serve`'s
prompt_logprobs (vLLM's): every prompt position's log-probability of the actual next
token, computed through the paged cache of the chosen dtype.

- The tiny DeepSeek-V3 of test_deepseek_reference.py (MLA: the cache holds the latent
  rows [c | k_pe]): float32 within 1e-3 of transformers, float16 and fp8 within the
  stated mean errors.
- The default model (SmolLM2, Q4_1 weights, grouped-query attention) on 300 tokens of
  text against transformers' log-softmax (test_smollm2_reference.py's fixture): the
  perplexity within the stated fractions of transformers', fp8's mean per-position
  error under twice float16's.
- A tiny DeepSeek-V3 with 32 heads, which on a CPU with AVX512-BF16 takes the BF16
  products of MLA's absorbed attention over FP8 latents (two query tiles of 16 heads
  share each step's converted latents; the other tiny models have at most 8 heads):
  within fp8's tolerance of transformers, and the BF16 products' own change a small
  part of the FP8 cache's error.
The engine's batch invariance with fp8 is in test_engine.py; the kernels' bits against
the float32 pool on FP8 values in tests/backend_ops/paged_attention_test.cc.
"""
import math

import openai
import pytest

import server_util
from test_smollm2_reference import reference  # noqa: F401  (fixture)

# Mean absolute log-probability error per dtype on the tiny DeepSeek-V3 (random weights,
# 64 positions; measured 0.0000 / 0.011 / 0.175, the worst positions 0.0000 / 0.50 /
# 1.7: random weights amplify rounding). float32 must also be within 1e-3 everywhere.
TINY_TOLERANCE = {"float32": 1e-4, "float16": 0.02, "fp8": 0.25}
# The default model's perplexity against transformers' (measured: float16 +0.4%, fp8
# +2.5%, 2026-12-06): fp8 stores keys and values without a scale, as vLLM's fp8 cache
# does when a checkpoint brings none.
PPL_TOLERANCE = {"float16": 0.02, "fp8": 0.035}


def _prompt_logprobs(dserve_bin, model, ids, dtype, tmp_path, *extra, env=None):
    with server_util.running(dserve_bin, model, "--threads", 2, "--kv-cache-dtype", dtype,
                             "--kv-cache-memory", 64 << 20, *extra, env=env,
                             log_path=tmp_path / f"{dtype}.log") as s:
        c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=300)
        name = c.models.list().data[0].id
        r = c.completions.create(model=name, prompt=ids, max_tokens=1, temperature=0,
                                 extra_body={"prompt_logprobs": 0})
        pl = r.choices[0].prompt_logprobs
        return [pl[k][str(ids[k])]["logprob"] for k in range(1, len(ids))]


@pytest.mark.parametrize("form", ["expanded", "absorbed"])
@pytest.mark.parametrize("dtype", list(TINY_TOLERANCE))
def test_tiny_deepseek_v3_latents(dtype, form, dserve_bin, tmp_path):
    """Both MLA forms over the paged latents: prompt tokens attend expanded (the
    form transformers computes) or absorbed (DSERVE_MLA_PREFILL chooses; by default a
    prompt's tail and generated tokens attend absorbed)."""
    from test_deepseek_reference import _case, _fixture
    model_dir, ref = _fixture(_case("v3-qlora-yarn"))
    prompt, want = ref["prompt"], ref["native"]["logprobs"]
    got = _prompt_logprobs(dserve_bin, model_dir, prompt, dtype, tmp_path,
                           env={"DSERVE_MLA_PREFILL": form})
    worst = max(abs(a - b) for a, b in zip(got, want))
    mean = sum(abs(a - b) for a, b in zip(got, want)) / len(got)
    print(f"{dtype} {form}: worst {worst:.4f}, mean {mean:.4f}")
    assert mean < TINY_TOLERANCE[dtype], mean
    if dtype == "float32":
        assert worst < 1e-3, worst


# 32 heads (two query tiles): the tiny v3 of test_deepseek_reference.py otherwise.
MANY_HEADS = dict(name="v3-32-heads", arch="v3", seed=15, hidden=256, layers=2, heads=32,
                  ffn=256, moe_ffn=32, q_lora=96, kv_lora=64, nope=16, rope_dim=16, v=16,
                  shared=1, rope=None,
                  extra=dict(norm_topk_prob=True, routed_scaling_factor=2.5))


def _cpu_has_bf16():
    with open("/proc/cpuinfo") as f:
        return "avx512_bf16" in f.read()


def test_fp8_latents_with_bf16_products(dserve_bin, tmp_path):
    """Absorbed MLA over FP8 latents, BF16 products (where the CPU has them) against the
    exact float step (DSERVE_MLA_BF16=0) and transformers."""
    from test_deepseek_reference import _fixture
    model_dir, ref = _fixture(MANY_HEADS)
    prompt, want = ref["prompt"], ref["native"]["logprobs"]
    runs = {}
    for bf16 in ("1", "0"):
        runs[bf16] = _prompt_logprobs(dserve_bin, model_dir, prompt, "fp8", tmp_path,
                                      env={"DSERVE_MLA_PREFILL": "absorbed",
                                           "DSERVE_MLA_BF16": bf16})
    fp8_error = sum(abs(a - b) for a, b in zip(runs["0"], want)) / len(want)
    bf16_change = sum(abs(a - b) for a, b in zip(runs["1"], runs["0"])) / len(want)
    print(f"fp8 mean error {fp8_error:.4f}, BF16 products' mean change {bf16_change:.5f}")
    assert fp8_error < TINY_TOLERANCE["fp8"], fp8_error
    assert bf16_change < 0.1 * fp8_error, (bf16_change, fp8_error)
    assert (bf16_change > 0) == _cpu_has_bf16()  # the BF16 step ran where it exists


def test_default_model_perplexity(dserve_bin, default_model, reference, tmp_path):  # noqa: F811
    ids = reference["text_ids"][:300]
    want = reference["logprobs"][:299]
    ppl_want = math.exp(-sum(want) / len(want))
    err = {}
    for dtype in ("float16", "fp8"):
        got = _prompt_logprobs(dserve_bin, default_model, ids, dtype, tmp_path,
                               "--max-model-len", 1024)
        ppl = math.exp(-sum(got) / len(got))
        err[dtype] = sum(abs(a - b) for a, b in zip(got, want)) / len(got)
        print(f"{dtype}: perplexity {ppl:.3f} (transformers {ppl_want:.3f}), "
              f"mean |error| {err[dtype]:.4f}")
        assert abs(ppl / ppl_want - 1) < PPL_TOLERANCE[dtype], (dtype, ppl, ppl_want)
    assert err["fp8"] < 2 * err["float16"], err
