"""dserve on the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against
transformers loading the same GGUF file (gguf_file=..., dequantised to FP32).

- Greedy: 64-token continuations of three fixed prompts equal the reference's up to
  the first position (if any) where the reference's two best logits are within 0.05
  of each other (past such a near-tie, kernels that quantise activations, as
  llama.cpp's do, may legitimately pick the other token).
- Perplexity of a fixed ~2,000-token English text (tests/reference/data) within 1%
  of the reference's.
- The same weights dequantised to an F32 Hugging Face checkpoint: dserve's
  per-position log-probabilities on that text within 1e-3 of the reference. This
  separates the model code (exact) from the quantised kernels (approximate).

The reference takes a while to compute (loading and dequantising the GGUF in
transformers), so it is cached under $DSERVE_CACHE/fixtures keyed by the model
file's hash, the prompts, the text and the library versions.
"""
import hashlib
import json
import math
import pathlib
import shutil

import pytest

from conftest import REPO, cache_dir, content_key, run

import torch
import transformers

PROMPTS = [
    "The three most useful things to know about the ocean are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a forest, there lived",
]
GEN_LEN = 64
TIE_MARGIN = 0.05
PPL_TOLERANCE = 0.01
TEXT = REPO / "tests" / "reference" / "data" / "lighthouse_keepers.txt"
FIXTURE_VERSION = 1


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_reference_model(model_path: pathlib.Path):
    import gguf  # noqa: F401
    import accelerate  # noqa: F401  # transformers needs it to load GGUF files
    d, name = str(model_path.parent), model_path.name
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32).eval()
    return tok, model


@torch.no_grad()
def _compute_reference(model_path: pathlib.Path) -> dict:
    tok, model = _load_reference_model(model_path)
    prompts = []
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        out = model.generate(torch.tensor([ids]), max_new_tokens=GEN_LEN, do_sample=False,
                             return_dict_in_generate=True, output_logits=True)
        margins = []
        for step_logits in out.logits:
            top2 = step_logits[0].float().topk(2).values
            margins.append(float(top2[0] - top2[1]))
        prompts.append({"text": text, "ids": ids,
                        "greedy": out.sequences[0, len(ids):].tolist(), "margins": margins})

    text_ids = tok(TEXT.read_text())["input_ids"]
    ids = torch.tensor([text_ids])
    logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return {
        "prompts": prompts,
        "text_ids": text_ids,
        "logprobs": logprobs.tolist(),
        "perplexity": math.exp(-logprobs.mean().item()),
    }


@pytest.fixture(scope="module")
def reference(default_model):
    key = content_key(_sha256(default_model), PROMPTS, GEN_LEN, TEXT.read_text(),
                      FIXTURE_VERSION, transformers.__version__, torch.__version__)
    path = cache_dir() / f"smollm2-reference-{key}.json"
    if not path.exists():
        ref = _compute_reference(default_model)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ref))
        tmp.rename(path)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def dequantised_checkpoint(default_model):
    """The GGUF's weights as transformers dequantises them, saved as an F32 Hugging
    Face directory (q/k rows in Hugging Face order; tied lm_head left out)."""
    from safetensors.torch import save_file
    key = content_key(_sha256(default_model), FIXTURE_VERSION, transformers.__version__)
    d = cache_dir() / f"smollm2-dequantised-{key}"
    if not (d / "model.safetensors").exists():
        _, model = _load_reference_model(default_model)
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors = {k: v.contiguous().clone() for k, v in model.state_dict().items()
                   if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        model.config.save_pretrained(tmp)
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)
    return d


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_greedy_matches_reference(index, reference, dserve_bin, default_model):
    ref = reference["prompts"][index]
    r = run([dserve_bin, "generate", "--model", default_model,
             "--prompt-ids", ",".join(map(str, ref["ids"])), "--max-tokens", GEN_LEN,
             "--temperature", 0, "--print-ids", "--ignore-eos"])
    got = [int(x) for x in r.stdout.strip().split(",")]
    want = ref["greedy"]
    # Compare up to the first near-tie in the reference (that position itself may differ).
    ties = [i for i, m in enumerate(ref["margins"]) if m < TIE_MARGIN]
    n = min(ties[0] if ties else len(want), len(want))
    assert got[:n] == want[:n], (
        f"prompt {index}: first difference at {next(i for i in range(n) if got[i] != want[i])}"
        f" (compared {n} tokens; reference near-ties at {ties[:5]})")


def test_perplexity_within_one_percent(reference, dserve_bin, default_model, tmp_path):
    out = tmp_path / "logprobs.json"
    r = run([dserve_bin, "perplexity", "--model", default_model, "--file", TEXT,
             "--logprobs-out", out])
    got = json.loads(out.read_text())
    ppl = float(r.stdout.split("perplexity:")[1].split()[0])
    assert abs(ppl - got["perplexity"]) < 1e-3 * ppl
    ids_match = got["input_ids"] == reference["text_ids"]
    want = reference["perplexity"]
    assert abs(ppl - want) <= PPL_TOLERANCE * want, (
        f"dserve {ppl:.4f} vs transformers {want:.4f}"
        f" ({len(got['input_ids'])} vs {len(reference['text_ids'])} tokens,"
        f" token ids {'equal' if ids_match else 'DIFFER'})")


def test_perplexity_on_reference_token_ids(reference, dserve_bin, default_model, tmp_path):
    """The same comparison with transformers' token ids, so that a model difference is
    told apart from a tokenizer difference."""
    ids = tmp_path / "ids.txt"
    ids.write_text(",".join(map(str, reference["text_ids"])))
    out = tmp_path / "logprobs.json"
    run([dserve_bin, "perplexity", "--model", default_model, "--token-ids", ids,
         "--logprobs-out", out])
    got = json.loads(out.read_text())
    assert len(got["scored"]) == len(reference["logprobs"])
    want = reference["perplexity"]
    assert abs(got["perplexity"] - want) <= PPL_TOLERANCE * want


def test_dequantised_f32_matches_reference_exactly(reference, dserve_bin,
                                                   dequantised_checkpoint, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text(",".join(map(str, reference["text_ids"])))
    out = tmp_path / "logprobs.json"
    run([dserve_bin, "perplexity", "--model", dequantised_checkpoint, "--token-ids", ids,
         "--logprobs-out", out])
    got = [r["logprob"] for r in json.loads(out.read_text())["scored"]]
    worst = max(abs(a - b) for a, b in zip(got, reference["logprobs"]))
    assert worst < 1e-3, f"max |log-prob difference| {worst:.2e}"
