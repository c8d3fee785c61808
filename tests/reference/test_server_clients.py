"""What clients nobody on the project wrote (the openai SDK, lm-eval, guidellm, litellm)
found in `dserve serve`, each checked through the openai SDK or raw HTTP
against a reference: transformers' tokenizer for the default model (what the stop
token is, how many tokens a text is), prometheus_client's parser for /metrics, the
gguf package to write a model file with a huge context_length."""
import shutil
import subprocess

import openai
import pytest

import server_util

# A question the default model answers in one short sentence and then ends with eos
# (see test_sampling_reference.py): the request finishes with finish_reason "stop".
SHORT_ANSWER = [{"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France?"}]
SHORT_ANSWER_PROMPT = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                       "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("clients") / "serve.log"
    with server_util.running(dserve_bin, default_model, "--served-model-name", "smollm2",
                             "--threads", 2, "--max-model-len", 1024, log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0,
                         timeout=300)


@pytest.fixture(scope="module")
def hf_tokenizer(default_model):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(str(default_model.parent),
                                                      gguf_file=default_model.name)


raw_post = server_util.post_json


# ---- 1. a generated eos is output, with its logprob, and counted -------------------

def test_completion_keeps_the_eos_it_stopped_on(client, hf_tokenizer):
    r = client.completions.create(model="smollm2", prompt=SHORT_ANSWER_PROMPT, max_tokens=60,
                                  temperature=0, logprobs=1)
    c = r.choices[0]
    assert c.finish_reason == "stop"
    tokens = c.logprobs.tokens
    assert tokens[-1] == hf_tokenizer.eos_token          # the stop token is the last output
    assert c.logprobs.token_logprobs[-1] > -50          # with its real logprob
    assert hf_tokenizer.eos_token not in c.text          # but its text is not shown
    assert "".join(tokens[:-1]) == c.text
    text_ids = hf_tokenizer(c.text, add_special_tokens=False)["input_ids"]
    assert r.usage.completion_tokens == len(tokens) == len(text_ids) + 1


def test_chat_keeps_the_eos_it_stopped_on(client, hf_tokenizer):
    r = client.chat.completions.create(model="smollm2", messages=SHORT_ANSWER, max_tokens=60,
                                       temperature=0, logprobs=True)
    c = r.choices[0]
    assert c.finish_reason == "stop"
    content = c.logprobs.content
    assert content[-1].token == hf_tokenizer.eos_token
    assert r.usage.completion_tokens == len(content)
    text_ids = hf_tokenizer(c.message.content, add_special_tokens=False)["input_ids"]
    assert r.usage.completion_tokens == len(text_ids) + 1


def test_stop_token_ids_stay_in_the_output(client, hf_tokenizer):
    # A stop id that is not special: counted and listed like eos; its text only with
    # include_stop_str_in_output, as vLLM.
    free = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=8,
                                     temperature=0, logprobs=0, extra_body={"ignore_eos": True})
    ids = hf_tokenizer(free.choices[0].logprobs.tokens[3], add_special_tokens=False)["input_ids"]
    assert len(ids) == 1
    for include in (False, True):
        r = client.completions.create(
            model="smollm2", prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=0,
            extra_body={"ignore_eos": True, "stop_token_ids": ids,
                        "include_stop_str_in_output": include})
        c = r.choices[0]
        assert c.finish_reason == "stop"
        assert c.logprobs.tokens == free.choices[0].logprobs.tokens[:4]
        assert r.usage.completion_tokens == 4
        want = "".join(c.logprobs.tokens[:4 if include else 3])
        assert c.text == want


# ---- 2. tools without a parser refused; continuous_usage_stats honoured -------------

def test_tools_without_a_parser_are_refused_with_a_reason(client):
    # As vLLM: tools mean tool_choice "auto", which needs --enable-auto-tool-choice and
    # --tool-call-parser; "none" still serves (the tools are only shown to the model).
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=SHORT_ANSWER, tools=[tool],
                                       max_tokens=4)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "tool_choice"
    assert "--tool-call-parser" in e.value.body["message"]
    r = client.chat.completions.create(model="smollm2", messages=SHORT_ANSWER, tools=[tool],
                                       tool_choice="none", max_tokens=4)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats(client, chat):
    kw = dict(model="smollm2", max_tokens=12, temperature=0, stream=True,
              stream_options={"include_usage": True, "continuous_usage_stats": True},
              extra_body={"ignore_eos": True})
    if chat:
        stream = client.chat.completions.create(messages=SHORT_ANSWER, **kw)
        plain = client.chat.completions.create(messages=SHORT_ANSWER, max_tokens=12,
                                               temperature=0, model="smollm2",
                                               extra_body={"ignore_eos": True})
    else:
        stream = client.completions.create(prompt="The ocean is", **kw)
        plain = client.completions.create(prompt="The ocean is", max_tokens=12, temperature=0,
                                          model="smollm2", extra_body={"ignore_eos": True})
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert with_choices and all(c.usage is not None for c in with_choices)
    counts = [c.usage.completion_tokens for c in with_choices]
    assert counts == sorted(counts) and counts[-1] == plain.usage.completion_tokens == 12
    assert all(c.usage.prompt_tokens == plain.usage.prompt_tokens for c in with_choices)
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in with_choices)
    final = chunks[-1]
    assert not final.choices and final.usage.completion_tokens == 12


# ---- 4. error mapping -------------------------------------------------------------

@pytest.mark.parametrize("field", ["add_generation_prompt", "add_special_tokens"])
def test_tokenize_messages_bad_boolean_is_400(server, field):
    status, body = raw_post(server, "/tokenize", {"messages": SHORT_ANSWER, field: "yes"})
    assert status == 400, body
    assert body["error"]["param"] == field and "boolean" in body["error"]["message"]


def test_huge_max_tokens_message_does_not_overflow(server, client):
    n_prompt = client.completions.create(model="smollm2", prompt="The ocean is",
                                         max_tokens=1).usage.prompt_tokens
    status, body = raw_post(server, "/v1/completions",
                            {"prompt": "The ocean is", "max_tokens": 2147483647})
    assert status == 400, body
    assert f"you requested {n_prompt + 2147483647} tokens" in body["error"]["message"]


def test_empty_api_key_is_refused(dserve_bin, default_model):
    r = subprocess.run([str(dserve_bin), "serve", str(default_model), "--api-key", ""],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "API key must not be empty" in r.stderr
    r = subprocess.run([str(dserve_bin), "serve", str(default_model)], capture_output=True,
                       text=True, timeout=60, env={"DSERVE_API_KEY": ""})
    assert r.returncode != 0 and "DSERVE_API_KEY is set but empty" in r.stderr


def test_huge_context_length_says_what_does_not_fit(dserve_bin, default_model, tmp_path):
    import gguf
    path = tmp_path / "huge-context.gguf"
    shutil.copy(default_model, path)
    reader = gguf.GGUFReader(path, "r+")
    field = reader.fields["llama.context_length"]
    field.parts[field.data[0]][0] = 2 ** 31
    del reader
    assert gguf.GGUFReader(path).fields["llama.context_length"].contents() == 2 ** 31
    r = subprocess.run([str(dserve_bin), "serve", str(path), "--port", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "bad_alloc" not in r.stderr
    assert "2147483648" in r.stderr and "--max-model-len" in r.stderr


# ---- 5. token counters move while a request runs -----------------------------------

def test_token_counters_move_per_step(server, client):
    def total(families, name):
        return sum(s.value for s in families[name].samples if s.name.endswith("_total"))

    before = server.metrics()
    stream = client.completions.create(model="smollm2", prompt="Once upon a time",
                                       max_tokens=300, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    n_prompt = client.completions.create(model="smollm2", prompt="Once upon a time",
                                         max_tokens=1).usage.prompt_tokens
    seen = 0
    for chunk in stream:
        seen += 1
        if seen == 20:
            break
    during = server.metrics()
    stream.close()
    finished = sum(s.value for s in during["vllm:request_success"].samples
                   if s.name.endswith("_total")) - sum(
        s.value for s in before["vllm:request_success"].samples if s.name.endswith("_total"))
    # The probe request (max_tokens 1) finished; the stream has not.
    assert finished == 1
    assert total(during, "vllm:generation_tokens") - total(before, "vllm:generation_tokens") >= 20
    assert total(during, "vllm:prompt_tokens") - total(before, "vllm:prompt_tokens") == 2 * n_prompt
