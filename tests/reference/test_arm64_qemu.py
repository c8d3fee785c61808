"""The aarch64 build (`make build-arm64`) under qemu-aarch64 against the references.

No ARM machine is at hand, so the cross-built dserve runs under user-mode qemu as a
Kunpeng 920 class core (neoverse-n1: NEON + dotprod, no SVE/i8mm/BF16, the level
neon-dotprod) and as an ARMv8.0 core (cortex-a72: the level neon):

- per-position log-probabilities of the tiny random Llama and DeepSeek-V3 checkpoints
  of test_llama_reference.py / test_deepseek_reference.py within 1e-3 of transformers
  in F32, and the same greedy continuation;
- a W8A8 (int8 x int8) tiny Llama from llmcompressor against the torch reference of
  test_w8a8_reference.py, on both levels;
- on the default model, the aarch64 greedy text equals the x86 binary's (and
  transformers') up to the first position where transformers' two best logits are
  within 0.05 (past a near-tie, kernels that quantise activations may pick either).

`make test` builds the aarch64 tree first, so in CI these never skip; run alone they
skip when $DSERVE_ARM64_BUILD_DIR/dserve (default build-arm64/dserve) is absent.
"""
import json
import os
import pathlib

import pytest

from conftest import REPO, run
import test_deepseek_reference as deepseek
import test_llama_reference as llama
from test_smollm2_reference import PROMPTS, TIE_MARGIN, reference  # noqa: F401 (fixture)

QEMU = REPO / "tools" / "qemu_arm64.sh"
# (qemu core, the level dserve must pick on it)
CORES = [("neoverse-n1", "neon-dotprod"), ("cortex-a72", "neon")]


@pytest.fixture(scope="module")
def arm64_bin():
    d = pathlib.Path(os.environ.get("DSERVE_ARM64_BUILD_DIR", REPO / "build-arm64"))
    p = d / "dserve"
    if not p.exists():
        pytest.skip(f"{p} not built; run `make build-arm64`")
    return p


def qemu_run(core, args, check=True):
    env = dict(os.environ, DSERVE_QEMU_CPU=core)
    return run([QEMU, *args], check=check, env=env)


def _greedy(runner, binary, model, prompt_ids, n, extra=()):
    r = runner([binary, "generate", "--model", model, "--prompt-ids",
                ",".join(map(str, prompt_ids)), "--max-tokens", n, "--temperature", 0,
                "--print-ids", "--ignore-eos", "--threads", 2, *extra])
    return [int(x) for x in r.stdout.strip().split(",")], r.stderr


def _logprobs(runner, binary, model, prompt, tmp_path, batch=512):
    ids = tmp_path / "ids.txt"
    ids.write_text(",".join(map(str, prompt)))
    out = tmp_path / f"logprobs-{batch}.json"
    runner([binary, "perplexity", "--model", model, "--token-ids", ids, "--batch", batch,
            "--logprobs-out", out, "--threads", 2])
    rows = json.loads(out.read_text())["scored"]
    assert [r["position"] for r in rows] == list(range(1, len(prompt)))
    return [r["logprob"] for r in rows]


def _worst(a, b):
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.parametrize("core,level", CORES, ids=[c for c, _ in CORES])
def test_isa_level_is_detected_and_logged(core, level, arm64_bin):
    model_dir = llama.tiny_checkpoint()
    r = qemu_run(core, [arm64_bin, "generate", "--model", model_dir, "--prompt-ids", "1,2,3",
                        "--max-tokens", 1, "--print-ids", "--log-level", "info"])
    assert f"CPU kernels: cpu-{level} (this machine has: scalar, neon" in r.stderr, \
        r.stderr[-2000:]


@pytest.mark.parametrize("core,level", CORES, ids=[c for c, _ in CORES])
def test_llama_against_transformers(core, level, arm64_bin, tmp_path):
    # GQA (2 KV heads for 4 query heads), untied embeddings, F32.
    model_dir, ref = llama._fixture(llama.CASES[0])
    prompt, want = ref["prompt"], ref["native"]
    runner = lambda args: qemu_run(core, args)  # noqa: E731
    logprobs = _logprobs(runner, arm64_bin, model_dir, prompt, tmp_path)
    assert _worst(logprobs, want["logprobs"]) < 1e-3
    greedy, _ = _greedy(runner, arm64_bin, model_dir, prompt, llama.GEN_LEN)
    assert greedy == want["greedy"]


def test_deepseek_v3_against_transformers(arm64_bin, tmp_path):
    # MLA with q_lora and YaRN, DeepSeekMoE: the expanded form (one batch) and the
    # weight-absorbed form over the latent cache (token by token).
    model_dir, ref = deepseek._fixture(deepseek._case("v3-qlora-yarn"))
    prompt, want = ref["prompt"], ref["native"]
    runner = lambda args: qemu_run("neoverse-n1", args)  # noqa: E731
    expanded = _logprobs(runner, arm64_bin, model_dir, prompt, tmp_path, batch=512)
    absorbed = _logprobs(runner, arm64_bin, model_dir, prompt, tmp_path, batch=1)
    assert _worst(expanded, want["logprobs"]) < 1e-3, "expanded MLA vs transformers"
    assert _worst(absorbed, want["logprobs"]) < 1e-3, "absorbed MLA vs transformers"
    greedy, _ = _greedy(runner, arm64_bin, model_dir, prompt, deepseek.GEN_LEN)
    assert greedy == want["greedy"]


@pytest.mark.parametrize("core,level", CORES, ids=[c for c, _ in CORES])
def test_deepseek_fp8_kept_against_transformers(core, level, arm64_bin, tmp_path):
    """FP8 weights kept in memory (the default) on the NEON FP8 kernels: the FP8 copy of
    the V3 case against transformers on the weights as dserve holds them."""
    model_dir, ref = deepseek._fp8_fixture()
    prompt, want = ref["prompt"], ref["fp8"]
    runner = lambda args: qemu_run(core, args)  # noqa: E731
    got = _logprobs(runner, arm64_bin, model_dir, prompt, tmp_path, batch=512)
    assert _worst(got, want["logprobs"]) < 1e-3
    greedy, stderr = _greedy(runner, arm64_bin, model_dir, prompt, deepseek.GEN_LEN, ["--log-level", "info"])
    assert greedy == want["greedy"]
    assert f"CPU kernels: cpu-{level} (" in stderr and "kept as f8_e4m3" in stderr, stderr[-2000:]


@pytest.mark.parametrize("core,level", CORES, ids=[c for c, _ in CORES])
def test_w8a8_against_torch_reference(core, level, arm64_bin, tmp_path):
    """A tiny Llama quantised to W8A8 by llmcompressor (test_w8a8_reference.py's
    dynamic case) on the ARM int8 kernels: per row on the ARMv8.0 level, packed SDOT
    panels on neon-dotprod. Same criterion as on x86 against the torch reference."""
    import test_w8a8_reference as w8a8
    case = next(c for c in w8a8.CASES if c["name"] == "llama-dynamic")
    _, w8a8_dir = w8a8._fixture(case)
    prompt = w8a8._prompt(case)
    reference = w8a8.reference_with_ties(w8a8._reference_model(case, w8a8_dir), prompt)
    got = _logprobs(lambda args: qemu_run(core, args), arm64_bin, w8a8_dir, prompt, tmp_path)
    # Within 1e-3 everywhere, up to activations on a rounding tie (test_w8a8_reference).
    w8a8.assert_agrees_up_to_ties(got, reference, core)


def test_default_model_greedy_equals_x86(reference, arm64_bin, dserve_bin, default_model):  # noqa: F811
    ref = reference["prompts"][0]
    n = 32  # of the reference's 64: keeps the emulated run short
    ties = [i for i, m in enumerate(ref["margins"][:n]) if m < TIE_MARGIN]
    n = ties[0] if ties else n
    x86, _ = _greedy(run, dserve_bin, default_model, ref["ids"], n)
    arm, _ = _greedy(lambda args: qemu_run("neoverse-n1", args), arm64_bin, default_model,
                     ref["ids"], n)
    assert arm == x86, f"aarch64 {arm}\nx86     {x86}"
    assert arm == ref["greedy"][:n]


def test_isa_the_core_lacks_is_refused(arm64_bin):
    model_dir = llama.tiny_checkpoint()
    for isa in ("neon-dotprod", "avx512"):
        r = qemu_run("cortex-a72", [arm64_bin, "generate", "--model", model_dir,
                                    "--prompt-ids", "1,2,3", "--max-tokens", 1, "--print-ids",
                                    "--isa", isa],
                     check=False)
        assert r.returncode not in (0, -4, 132), r  # refused, never SIGILL
        assert f"--isa {isa}: not supported by this CPU; this machine has: scalar, neon" \
            in r.stderr, r.stderr[-2000:]
