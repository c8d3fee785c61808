"""dserve's logits processing against transformers' logits processors.

For random logits and random token histories, `sampling_tool` (tests/unit/sampling)
prints Sampler::processed_logits: the distribution dserve draws from, as logits, with
-inf where a token was filtered out. The reference applies, in vLLM v1's order:
  * SequenceBiasLogitsProcessor with one-token sequences (OpenAI's logit_bias);
  * RepetitionPenaltyLogitsProcessor over the prompt and output ids (HF and vLLM agree);
  * frequency and presence penalties by OpenAI's definition (transformers has no
    processor for them): logit -= frequency * count + presence * (count > 0), over the
    output ids only;
  * TemperatureLogitsWarper, then MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper.
vLLM applies min_p before top_k / top_p, whereas transformers' generate() puts
MinPLogitsWarper last; the reference chains the same processors in vLLM's order.
"""
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from conftest import run

CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7),
    dict(temperature=1.0, repetition_penalty=1.3),
    dict(temperature=1.0, repetition_penalty=0.8),
    dict(temperature=1.0, frequency_penalty=0.7),
    dict(temperature=1.0, presence_penalty=-0.5),
    dict(temperature=1.0, frequency_penalty=0.4, presence_penalty=0.6, repetition_penalty=1.2),
    dict(temperature=1.0, top_k=1),
    dict(temperature=0.8, top_k=40),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=1.3, top_p=0.3),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.5, min_p=0.02),
    dict(temperature=0.9, top_k=50, top_p=0.8),
    dict(temperature=1.0, min_p=0.05, top_p=0.8),
    dict(temperature=1.0, top_k=6000, top_p=0.99),
    dict(temperature=0.9, min_p=0.05, top_k=20, top_p=0.95),
    dict(temperature=0.6, min_p=0.01, top_k=100, top_p=0.7, repetition_penalty=1.1,
         frequency_penalty=0.2, presence_penalty=0.3),
    # logit_bias ids: "best" stands for the trial's best tokens, "out" for its output
    # ids (so the bias meets the penalties), numbers for fixed ids.
    dict(temperature=1.0, logit_bias={"best0": -100.0, "best1": 3.5, 7: 100.0}),
    dict(temperature=0.8, top_k=40, top_p=0.9, logit_bias={"best0": -2.0, "best3": 1.25}),
    dict(temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.5,
         logit_bias={"out0": -1.5, "out1": 4.0, "best2": -0.5}),
]
VOCABS = [257, 5000, 32000]
N_TRIALS = 4


def resolve_bias(case, output, logits):
    """The case's logit_bias with "bestK" / "outK" keys turned into this trial's ids."""
    best = np.argsort(-logits, kind="stable")
    ids = {"best": [int(x) for x in best], "out": output}
    bias = {}
    for key, value in case.get("logit_bias", {}).items():
        if isinstance(key, str):
            kind = key.rstrip("0123456789")
            key = ids[kind][int(key[len(kind):])]
        bias[key] = value
    return bias


def reference(case, bias, prompt, output, logits):
    """The processed logits by transformers' processors and OpenAI's penalty formula."""
    ids = torch.tensor([prompt + output], dtype=torch.long)
    scores = torch.tensor(logits, dtype=torch.float32)[None]
    if bias:
        sequence_bias = [[[token], value] for token, value in bias.items()]
        scores = SequenceBiasLogitsProcessor(sequence_bias=sequence_bias)(ids, scores)
    rep = case.get("repetition_penalty", 1.0)
    if rep != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(penalty=rep)(ids, scores)
    counts = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=len(logits))
    counts = counts.to(torch.float32)[None]
    scores = scores - case.get("frequency_penalty", 0.0) * counts
    scores = scores - case.get("presence_penalty", 0.0) * (counts > 0).to(torch.float32)
    scores = TemperatureLogitsWarper(case["temperature"])(ids, scores)
    if case.get("min_p", 0.0) > 0:
        scores = MinPLogitsWarper(min_p=case["min_p"])(ids, scores)
    if case.get("top_k", 0) > 0:
        scores = TopKLogitsWarper(top_k=case["top_k"])(ids, scores)
    if case.get("top_p", 1.0) < 1.0:
        scores = TopPLogitsWarper(top_p=case["top_p"])(ids, scores)
    return scores[0].numpy()


def make_trials(case_index, vocab):
    rng = np.random.default_rng(1000 * case_index + vocab)
    trials = []
    for _ in range(N_TRIALS):
        # Peaked enough that top_p / min_p keep a handful to a few hundred tokens.
        logits = (rng.standard_normal(vocab) * rng.uniform(1.0, 4.0)).astype(np.float32)
        prompt = rng.integers(0, vocab, size=rng.integers(0, 30)).tolist()
        # Output ids repeat (so counts > 1) and include some of the best tokens, so
        # penalties move tokens across the filter thresholds.
        best = np.argsort(-logits)[:10]
        output = (rng.choice(best, size=5).tolist() +
                  rng.integers(0, vocab, size=rng.integers(0, 20)).tolist())
        output = [int(x) for x in rng.permutation(output + output[:3])]
        trials.append((prompt, output, logits))
    return trials


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("case_index", range(len(CASES)))
def test_processed_logits_match_transformers(test_tool, case_index, vocab):
    case = CASES[case_index]
    trials = make_trials(case_index, vocab)
    biases = [resolve_bias(case, o, l) for _, o, l in trials]

    def options(bias):
        kv = [f"{k}={v}" for k, v in case.items() if k != "logit_bias"]
        if bias:
            kv.append("logit_bias=" + ",".join(f"{t}:{v!r}" for t, v in bias.items()))
        return " ".join(kv)
    stdin = "".join(
        f"{options(b)}\n{' '.join(map(str, p))}\n{' '.join(map(str, o))}\n"
        f"{' '.join(repr(float(x)) for x in l)}\n" for (p, o, l), b in zip(trials, biases))
    lines = run([test_tool("sampling_tool")], input=stdin).stdout.splitlines()
    assert len(lines) == len(trials), lines[:1]
    for (prompt, output, logits), bias, line in zip(trials, biases, lines):
        got = np.array([float(x) for x in line.split()], dtype=np.float64)
        want = reference(case, bias, prompt, output, logits).astype(np.float64)
        kept_got, kept_want = np.isfinite(got), np.isfinite(want)
        assert np.array_equal(kept_got, kept_want), (
            f"{case}: kept {kept_got.sum()} tokens, transformers {kept_want.sum()}; "
            f"differ at {np.flatnonzero(kept_got != kept_want)[:10]}")
        assert kept_got.sum() >= 1
        np.testing.assert_allclose(got[kept_got], want[kept_want], rtol=1e-6, atol=1e-6)


def test_invalid_options_are_rejected(test_tool):
    stdin = "top_p=1.5\n\n\n0.0 1.0\ntemperature=-1\n\n\n0.0 1.0\ntop_k=-2\n\n\n0.0 1.0\n"
    lines = run([test_tool("sampling_tool")], input=stdin).stdout.splitlines()
    assert [l.split(":")[0] for l in lines] == ["error"] * 3
    assert "top_p" in lines[0] and "temperature" in lines[1] and "top_k" in lines[2]


# ---- `dserve generate` with the new sampling flags, on the default model ----------

CHAT_PROMPT = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"


def _generate(dserve_bin, model, *args, max_tokens=40):
    return run([dserve_bin, "generate", "--model", model, "--max-tokens", max_tokens,
                *args]).stdout


def test_stop_string_spanning_tokens(dserve_bin, default_model):
    full = _generate(dserve_bin, default_model, "--prompt", CHAT_PROMPT, "--temperature", 0)
    text = full.rstrip("\n")
    assert len(text) > 30, full
    # A stop string that starts inside one token and ends inside a later one: with the
    # default model's "I'm glad to make your acquaintance." it is "make your ac", from
    # after the space of " make" to the middle of " acquaintance".
    stop = text[12:24]
    out = _generate(dserve_bin, default_model, "--prompt", CHAT_PROMPT, "--temperature", 0,
                    "--stop", "never appears", "--stop", stop)
    assert out == text[:text.index(stop)] + "\n"
    # --print-ids with --stop: the ids up to and including the one completing the stop.
    ids = _generate(dserve_bin, default_model, "--prompt", CHAT_PROMPT, "--temperature", 0,
                    "--print-ids", "--stop", stop).strip().split(",")
    all_ids = _generate(dserve_bin, default_model, "--prompt", CHAT_PROMPT, "--temperature", 0,
                        "--print-ids").strip().split(",")
    assert 1 < len(ids) < len(all_ids) and all_ids[:len(ids)] == ids


# A question the default model answers in one short, confident sentence ("The capital
# of France is Paris.") and then ends: its eos does not hang on a near-tie, so kernel
# changes that move logits in the last bits do not move it.
SHORT_ANSWER_PROMPT = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                       "<|im_start|>assistant\n")


def test_min_tokens_masks_eos(dserve_bin, default_model):
    base = ["--prompt", SHORT_ANSWER_PROMPT, "--temperature", 0, "--print-ids"]
    short = _generate(dserve_bin, default_model, *base, max_tokens=60).strip().split(",")
    assert len(short) < 30, "the greedy answer should end with eos well before 60 tokens"
    longer = _generate(dserve_bin, default_model, *base, "--min-tokens", 45,
                       max_tokens=60).strip().split(",")
    assert len(longer) >= 45
    assert longer[:len(short)] == short  # identical until eos would have been chosen


def test_seeded_sampling_with_penalties_is_reproducible(dserve_bin, default_model):
    args = ["--prompt", "Once upon a time", "--temperature", 0.9, "--top-p", 0.95,
            "--min-p", 0.02, "--repetition-penalty", 1.1, "--frequency-penalty", 0.3,
            "--presence-penalty", 0.2, "--print-ids"]
    a = _generate(dserve_bin, default_model, *args, "--seed", 7)
    b = _generate(dserve_bin, default_model, *args, "--seed", 7)
    c = _generate(dserve_bin, default_model, *args, "--seed", 8)
    assert a == b and a != c


@pytest.mark.parametrize("flag,value,text", [
    ("--min-p", "1.5", "min_p"),
    ("--repetition-penalty", "0", "repetition_penalty"),
    ("--frequency-penalty", "2.5", "frequency_penalty"),
    ("--presence-penalty", "-3", "presence_penalty"),
    ("--min-tokens", "200", "min_tokens"),
    ("--stop", "", "stop strings"),
])
def test_bad_sampling_flags(dserve_bin, default_model, flag, value, text):
    r = run([dserve_bin, "generate", "--model", default_model, "--prompt-ids", "1,2",
             "--print-ids", flag, value], check=False)
    assert r.returncode != 0 and text in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
