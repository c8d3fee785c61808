"""lm-eval (EleutherAI's harness, pinned from PyPI) scoring a small local
multiple-choice task through `dserve serve`, against transformers' log-probabilities
of the same continuations on the same GGUF file.

lm-eval's `local-completions` loglikelihood requests send context + continuation as
token ids with `echo: true, logprobs: 1, max_tokens: 1`, and drop the last
`token_logprobs` entry as the generated token. A server that leaves a generated stop
token out of its output makes lm-eval drop a real prompt token instead: a one-token
continuation then scores 0.0. The task's chat-formatted one-word questions make the
model end with <|im_end|> after many of the choices, so that case is exercised.

`tokenizer_backend=remote` makes lm-eval read the tokenizer through the server's
`GET /tokenizer_info` and `/tokenize` (as it does with vLLM): no Hugging Face download.
"""
import json
import math

import pytest

import server_util
from conftest import REPO, cache_dir, content_key
from test_smollm2_reference import _load_reference_model, _sha256
from test_smollm2_reference import dequantised_checkpoint  # noqa: F401  (fixture)

lm_eval = pytest.importorskip("lm_eval")
import torch  # noqa: E402
import transformers  # noqa: E402

TASK_DIR = REPO / "tests" / "reference" / "data" / "lm_eval_mc"
SCORE_TOLERANCE = 1e-2  # nats per item (the bound; F32 against F32)
SERVED = "smollm2"


def _encode_pair(tok, context: str, continuation: str):
    """lm-eval's TemplateLM._encode_pair: the continuation's ids are those of
    context + continuation past the context's ids (no special tokens)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    return ctx, whole[len(ctx):]


@torch.no_grad()
def _reference_scores(model_path, requests):
    tok, model = _load_reference_model(model_path)
    out = []
    for context, continuation in requests:
        ctx, cont = _encode_pair(tok, context, continuation)
        ids = torch.tensor([ctx + cont])
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        out.append(sum(float(logprobs[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)))
    return out


@pytest.fixture(scope="module")
def f32_model(dequantised_checkpoint, default_model, tmp_path_factory):  # noqa: F811
    """The default model's weights as transformers dequantises them (F32), with the
    tokenizer and chat template transformers reads from the GGUF: scores then compare
    the serving path itself, not the Q4_1 kernels' rounding (up to 0.3 nats on an
    unlikely choice)."""
    d = tmp_path_factory.mktemp("smollm2-f32")
    for name in ("model.safetensors", "config.json"):
        (d / name).symlink_to(dequantised_checkpoint / name)
    _load_reference_tokenizer(default_model).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def served(dserve_bin, f32_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("lm_eval") / "serve.log"
    with server_util.running(dserve_bin, f32_model, "--served-model-name", SERVED,
                             "--kv-cache-dtype", "float32", "--threads", 2,
                             log_path=log) as s:
        yield s


def _run_lm_eval(server, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    monkeypatch.chdir(TASK_DIR)  # the task's data_files path is relative
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = (f"model={SERVED},base_url={server.base_url}/v1/completions,"
            "tokenizer_backend=remote,num_concurrent=1,max_retries=1")
    return simple_evaluate(model="local-completions", model_args=args, tasks=["dserve_mc"],
                           task_manager=TaskManager(include_path=str(TASK_DIR)),
                           log_samples=True, batch_size=1)


def test_lm_eval_agrees_with_transformers(served, default_model, monkeypatch):
    results = _run_lm_eval(served, monkeypatch)
    samples = results["samples"]["dserve_mc"]
    docs = [json.loads(line) for line in (TASK_DIR / "questions.jsonl").read_text().splitlines()]
    assert len(samples) == len(docs)

    requests, got = [], []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        for arg, resp in zip(s["arguments"], s["resps"]):
            requests.append(tuple(arg))  # (context, continuation)
            got.append(float(resp[0][0]))
    key = content_key(_sha256(default_model), requests, transformers.__version__,
                      torch.__version__)
    path = cache_dir() / f"lm-eval-mc-reference-{key}.json"
    if not path.exists():
        path.write_text(json.dumps(_reference_scores(default_model, requests)))
    want = json.loads(path.read_text())

    worst = max(range(len(got)), key=lambda i: abs(got[i] - want[i]))
    assert abs(got[worst] - want[worst]) <= SCORE_TOLERANCE, (
        f"{requests[worst]!r}: lm-eval through dserve {got[worst]:.4f}, transformers "
        f"{want[worst]:.4f}")
    # The same choices win, so the same accuracy.
    n_choices = [len(d["choices"]) for d in docs]
    ref_correct, k = 0, 0
    for d, n in zip(docs, n_choices):
        scores = want[k:k + n]
        ref_correct += int(max(range(n), key=scores.__getitem__) == d["answer"])
        k += n
    acc = results["results"]["dserve_mc"]["acc,none"]
    assert math.isclose(acc, ref_correct / len(docs)), (acc, ref_correct / len(docs))


def test_tokenizer_info_matches_transformers(served, default_model):
    status, body = served.get("/tokenizer_info")
    assert status == 200, body
    info = json.loads(body)
    tok = _load_reference_tokenizer(default_model)
    assert info["eos_token"] == tok.eos_token
    assert info["bos_token"] == tok.bos_token
    assert info["chat_template"] == tok.chat_template
    assert isinstance(info["tokenizer_class"], str) and info["model_max_length"] > 0
    # lm-eval's own client of the endpoint: the eos id it derives is the model's.
    from lm_eval.utils import RemoteTokenizer
    remote = RemoteTokenizer(served.base_url)
    assert remote.eos_token_id == tok.eos_token_id
    assert remote.encode("Hello world") == tok("Hello world", add_special_tokens=False)["input_ids"]


def _load_reference_tokenizer(model_path):
    d, name = str(model_path.parent), model_path.name
    return transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
