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
