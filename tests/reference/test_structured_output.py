"""Structured output (constrained decoding) on the default model, through the official
`openai` SDK. References we did not write: `jsonschema` (validity of every JSON
output), pydantic (parsing it into the model), Python's `re.fullmatch` (guided_regex),
and xgrammar (the allowed-token set after a prefix, on the same tokenizer)."""
import asyncio
import enum
import json
import re
import subprocess
from typing import Annotated, Literal, Optional, Union

import jsonschema
import numpy as np
import openai
import pytest
from pydantic import BaseModel, Field

import server_util

MAX_TOKENS = 400  # the longest valid output of the schemas below is well under this


# Ten schemas of increasing difficulty. Strings, numbers and lists are bounded (a valid
# prefix can otherwise grow past any max_tokens at temperature 1; the grammar keeps the
# text valid, not short).
class Answer(BaseModel):
    answer: bool


class Color(BaseModel):
    color: Literal["red", "green", "blue"]
    brightness: int = Field(ge=0, le=100)


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


class Scores(BaseModel):
    # Each score bounded too: an unbounded integer is an endless valid prefix (seen: one
    # of hundreds of digits at temperature 1 on an AVX-512 machine).
    scores: list[Annotated[int, Field(ge=0, le=100)]] = Field(min_length=1, max_length=4)
    passed: bool


class Profile(BaseModel):
    username: str = Field(pattern=r"^[a-z][a-z0-9_]{2,11}$")
    nickname: Optional[str] = Field(max_length=12)
    stars: int = Field(ge=1, le=5)


class Address(BaseModel):
    city: str = Field(max_length=16)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Customer(BaseModel):
    name: str = Field(max_length=16)
    address: Address
    vip: bool


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    quantity: int = Field(ge=1, le=99)


class Order(BaseModel):
    order_id: int = Field(ge=1000, le=9999)
    items: list[Item] = Field(min_length=1, max_length=3)
    status: Literal["pending", "shipped", "delivered"]


class Size(str, enum.Enum):
    small = "S"
    medium = "M"
    large = "L"


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    breed: str = Field(max_length=12)


class Pet(BaseModel):
    pet: Union[Cat, Dog]
    size: Size
    tags: list[Literal["cute", "loud", "old"]] = Field(max_length=3)


class Leaf(BaseModel):
    label: str = Field(max_length=8)


class Branch(BaseModel):
    label: str = Field(max_length=8)
    leaves: list[Leaf] = Field(max_length=2)


class Tree(BaseModel):
    root: str = Field(max_length=8)
    branches: list[Branch] = Field(min_length=1, max_length=2)


class Line(BaseModel):
    product: Literal["pen", "book", "lamp"]
    qty: int = Field(ge=1, le=9)
    note: Optional[str] = Field(max_length=10)


class Party(BaseModel):
    name: str = Field(max_length=12)
    address: Address


class Invoice(BaseModel):
    number: str = Field(pattern=r"^INV-[0-9]{4}$")
    seller: Party
    buyer: Party
    lines: list[Line] = Field(min_length=1, max_length=3)
    currency: Literal["USD", "EUR"]
    paid: bool


MODELS = [Answer, Color, Person, Scores, Profile, Customer, Order, Pet, Tree, Invoice]


def served_name():
    from conftest import REPO
    return re.search(r"^SERVED_NAME \?= (\S+)", (REPO / "Makefile").read_text(), re.M).group(1)


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    server_util.DEFAULT_MODEL = default_model
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with server_util.running(dserve_bin, default_model, "--max-model-len", 1024,
                             "--served-model-name", served_name(),
                             "--max-num-seqs", 64, "--threads", 2, "--seed", 0,
                             log_path=log) as s:
        yield s


@pytest.fixture(scope="module")
def model_id(server):
    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    return c.models.list().data[0].id


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0,
                         timeout=300)


def aclient(server):
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0,
                              timeout=600)


def messages(model):
    return [{"role": "user", "content": f"Give me an example {model.__name__} as JSON."}]


def test_fifty_generations_are_valid_json_for_ten_schemas(server, model_id):
    """client.chat.completions.parse(response_format=Model) for half of the requests,
    response_format={"type": "json_schema", ...} for the other half; temperature 1,
    five seeds per schema, all 50 at once."""
    async def one(model, seed):
        c = aclient(server)
        if seed % 2 == 0:
            r = await c.chat.completions.parse(model=model_id, messages=messages(model),
                                               response_format=model, temperature=1,
                                               seed=seed, max_tokens=MAX_TOKENS)
            parsed = r.choices[0].message.parsed
            assert isinstance(parsed, model)
        else:
            r = await c.chat.completions.create(
                model=model_id, messages=messages(model), temperature=1, seed=seed,
                max_tokens=MAX_TOKENS,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": model.__name__, "strict": True,
                                                 "schema": model.model_json_schema()}})
        await c.close()
        return model, seed, r.choices[0]

    async def all_of_them():
        return await asyncio.gather(*[one(m, 100 + s) for m in MODELS for s in range(5)])

    results = asyncio.run(all_of_them())
    assert len(results) == 50
    texts = set()
    for model, seed, choice in results:
        text = choice.message.content
        assert choice.finish_reason == "stop", (model.__name__, seed, text)
        value = json.loads(text)
        jsonschema.validate(value, model.model_json_schema())
        assert model.model_validate_json(text) == model.model_validate(value)
        texts.add(text)
    assert len(texts) > 25, "temperature 1 with different seeds should vary the outputs"


def test_guided_regex_outputs_fullmatch(client, model_id):
    patterns = [r"\(\d{3}\) \d{3}-\d{4}", r"[a-z]{1,12}@[a-z]{1,10}\.(com|org|net)",
                r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", r"[A-Z][a-z]{1,10}( [A-Z][a-z]{1,10})?",
                r"-?\d{1,4}(\.\d{1,2})?", r"(yes|no|maybe)!?"]
    for i, pattern in enumerate(patterns):
        r = client.completions.create(model=model_id, prompt="Here is one:", n=3, temperature=1,
                                      seed=i, max_tokens=40, extra_body={"guided_regex": pattern})
        for c in r.choices:
            assert c.finish_reason == "stop", (pattern, c.text)
            assert re.fullmatch(pattern, c.text), (pattern, c.text)
        r = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Answer:"}], temperature=1,
            seed=i, max_tokens=40, extra_body={"structured_outputs": {"regex": pattern}})
        assert re.fullmatch(pattern, r.choices[0].message.content), pattern


def test_guided_choice_outputs_one_of_the_choices(client, model_id):
    choices = ["positive", "negative", "neutral", "mixed feelings", "n/a"]
    seen = set()
    for seed in range(8):
        r = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Sentiment of 'great movie'?"}],
            temperature=1, seed=seed, max_tokens=20, extra_body={"guided_choice": choices})
        assert r.choices[0].message.content in choices
        assert r.choices[0].finish_reason == "stop"
        seen.add(r.choices[0].message.content)
    r = client.completions.create(model=model_id, prompt="The answer is", max_tokens=5,
                                  extra_body={"structured_outputs": {"choice": ["A", "B"]}})
    assert r.choices[0].text in ("A", "B")


def test_guided_grammar_and_json_object(client, model_id):
    grammar = r'''
        root ::= expr
        expr ::= term (ws [+-] ws term)*
        term ::= [1-9] [0-9]{0,2} | "(" expr ")"
        ws   ::= " "?
    '''
    # The same language as a regex only up to nesting; check the flat outputs by regex
    # and the rest by evaluating them (Python's parser is the reference).
    for seed in range(4):
        r = client.completions.create(model=model_id, prompt="2 + 2 =", temperature=1, seed=seed,
                                      max_tokens=40, extra_body={"guided_grammar": grammar})
        text = r.choices[0].text
        if r.choices[0].finish_reason == "stop":
            assert re.fullmatch(r"[0-9+\-() ]+", text), text
            eval(compile(text, "<grammar output>", "eval"), {"__builtins__": {}})  # parses
    for seed in range(4):
        r = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "A JSON object with a name"}],
            temperature=0.7, seed=seed, max_tokens=80,
            response_format={"type": "json_object"})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert text.startswith("{"), text
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    for body in ({"guided_json": schema}, {"structured_outputs": {"json": json.dumps(schema)}}):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "ok?"}],
                                           max_tokens=20, extra_body=body)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_constrained_output_is_the_same_alone_and_batched(server, model_id):
    """A constrained request's tokens depend only on its own row: the same seed gives
    the same text alone and among concurrent free and constrained requests."""
    schema = Customer.model_json_schema()
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}

    async def constrained(c, seed):
        r = await c.chat.completions.create(model=model_id, messages=messages(Customer),
                                            temperature=1, seed=seed, max_tokens=MAX_TOKENS,
                                            response_format=rf)
        return r.choices[0].message.content

    async def free(c, seed):
        r = await c.completions.create(model=model_id, prompt="Once upon a time", temperature=1,
                                       seed=seed, max_tokens=60)
        return r.choices[0].text

    async def run():
        c = aclient(server)
        alone = [await constrained(c, s) for s in (7, 8)]
        batched = await asyncio.gather(constrained(c, 7), free(c, 1), constrained(c, 9),
                                       free(c, 2), constrained(c, 8), free(c, 3))
        await c.close()
        return alone, batched

    alone, batched = asyncio.run(run())
    assert batched[0] == alone[0]
    assert batched[4] == alone[1]


def test_readme_example(server):
    """The structured-output curl command of docs/serving.md, as printed (but on this port)."""
    from conftest import REPO
    text = (REPO / "docs" / "serving.md").read_text()
    section = text.split("## Structured output", 1)[1]
    cmd = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    cmd = cmd.replace("localhost:8000", f"127.0.0.1:{server.port}")
    r = subprocess.run(["bash", "-c", cmd.strip() + " --fail-with-body"], capture_output=True,
                       text=True, timeout=300, check=True)
    body = json.loads(r.stdout)
    schema = json.loads(re.search(r'"schema": (\{.*\})\}\}\}', cmd.replace("\n", " "), re.S).group(1))
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)


@pytest.mark.parametrize("body,param,needle", [
    ({"guided_regex": "(ab"}, "guided_regex", "missing ')'"),
    ({"guided_json": {"type": "strung"}}, "guided_json", "unknown type 'strung'"),
    ({"guided_json": {"type": "object", "properties": {"a": {"not": {}}}}}, "guided_json",
     "keyword 'not'"),
    ({"guided_grammar": "root ::= foo"}, "guided_grammar", "'foo' is referenced but not defined"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one kind"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "not supported"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice",
     "only one kind"),
    ({"structured_outputs": {"lark": "x"}}, "structured_outputs.lark", "not supported"),
])
def test_bad_constraints_are_400_naming_the_problem(client, model_id, body, param, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=5, extra_body=body)
    err = e.value.body
    assert err["param"] == param, err
    assert needle in err["message"], err


# ---------------------------------------------------------------------------------
# Token masks against xgrammar.

N_PREFIXES = 1000  # per schema, as the issue asks
MAX_STEPS = 60


@pytest.fixture(scope="module")
def xgr_tokenizer(default_model):
    """xgrammar's TokenizerInfo for the default model's tokenizer (transformers reading
    the GGUF). Special tokens stand for no text, so neither engine may emit them inside
    the output; xgrammar learns that from an empty byte string."""
    xgr = pytest.importorskip("xgrammar")
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(str(default_model.parent),
                                                     gguf_file=default_model.name)
    base = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152)
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    vocab = [b"" if i in special else bytes(b) for i, b in enumerate(base.decoded_vocab)]
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=49152,
                             stop_token_ids=base.stop_token_ids)
    return xgr, xgr.GrammarCompiler(info), info


def without_lengths(schema):
    """The schema without minLength / maxLength. The one deliberate difference from
    xgrammar: its length-bounded strings are [^"\\\\\\r\\n]{m,n}, which admits raw control
    characters (not valid JSON, RFC 8259 section 7) and no escapes; ours are JSON string
    characters, escapes included. test_xgrammar_length_bounded_strings_admit_control_characters
    shows the difference; bounded lengths are checked by jsonschema above."""
    if isinstance(schema, dict):
        return {k: without_lengths(v) for k, v in schema.items()
                if k not in ("minLength", "maxLength")}
    if isinstance(schema, list):
        return [without_lengths(v) for v in schema]
    return schema


def compare_walks(test_tool, default_model, tmp_path, xgr_tokenizer, kind, spec, compiled):
    """Random walks through our allowed sets (grammar_tool), each prefix's set compared
    with xgrammar's after the same tokens; stop tokens separately: xgrammar allows them
    exactly when our matcher is complete."""
    xgr, _, info = xgr_tokenizer
    spec_file = tmp_path / "spec"
    spec_file.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    out = subprocess.run(
        [str(test_tool("grammar_tool")), "walk", str(default_model), kind, str(spec_file),
         str(N_PREFIXES), str(MAX_STEPS), "1"], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == N_PREFIXES
    vocab = 49152
    stop = list(info.stop_token_ids)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    matcher, prev = None, None
    n_judged = 0
    for line in lines:
        prefix, complete, mask = line.split()
        ids = [] if prefix == "-" else [int(x) for x in prefix.split(",")]
        if prev is not None and ids[:-1] == prev and ids:
            assert matcher.accept_token(ids[-1]), ids
        else:
            matcher = xgr.GrammarMatcher(compiled)
            for t in ids:
                assert matcher.accept_token(t), ids
        prev = ids
        matcher.fill_next_token_bitmask(bitmask)
        want = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:vocab].astype(bool)
        got = np.unpackbits(np.frombuffer(bytes.fromhex(mask), dtype=np.uint8),
                            bitorder="little")[:vocab].astype(bool)
        assert bool(want[stop].any()) == (complete == "1"), ids
        want[stop] = False
        if not np.array_equal(want, got):
            # xgrammar's mask and xgrammar's own parser can disagree (after "((uses" in
            # the nested grammar below its mask refuses "))" yet accept_token("))")
            # succeeds). Then its parser decides each differing token.
            for t in np.nonzero(want != got)[0].tolist():
                judge = xgr.GrammarMatcher(compiled)
                for u in ids:
                    assert judge.accept_token(u)
                assert judge.accept_token(t) == bool(got[t]), (
                    f"{kind}: after {ids} token {t} is {'allowed' if got[t] else 'refused'} by "
                    f"us, and xgrammar's mask and parser both disagree")
            n_judged += 1
    return n_judged


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_json_schema_masks_agree_with_xgrammar(model, test_tool, default_model, tmp_path,
                                               xgr_tokenizer):
    _, compiler, _ = xgr_tokenizer
    schema = without_lengths(model.model_json_schema())
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
    assert compare_walks(test_tool, default_model, tmp_path, xgr_tokenizer, "json", schema,
                         compiled) == 0


RECURSIVE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "number"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
    "tag": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["v"]}},
    "$ref": "#/$defs/node"}


@pytest.mark.parametrize("kind,spec", [
    ("json_object", ""),
    ("json", RECURSIVE),
    ("json", {"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 1234},
              "minItems": 2, "maxItems": 5}),
    ("regex", r"[A-Z][a-zé€]{2,8} \d{1,3}(\.\d+)?|[^a-z]{3}"),
    ("grammar", 'root ::= "(" item ("," item)* ")"\nitem ::= [a-z]+ | root | "\\"" [^"]* "\\""'),
    ("choice", ["alpha", "alphabet", "beta", "gamma ray"]),
], ids=["json_object", "recursive", "int_range", "regex", "grammar", "choice"])
def test_other_masks_agree_with_xgrammar(kind, spec, test_tool, default_model, tmp_path,
                                         xgr_tokenizer):
    _, compiler, _ = xgr_tokenizer
    if kind == "json_object":
        compiled = compiler.compile_json_schema(json.dumps({"type": "object"}), any_whitespace=False)
    elif kind == "json":
        compiled = compiler.compile_json_schema(json.dumps(spec), any_whitespace=False)
    elif kind == "regex":
        compiled = compiler.compile_regex(spec)
    elif kind == "grammar":
        compiled = compiler.compile_grammar(spec)
    else:
        alts = " | ".join(json.dumps(c) for c in spec)
        compiled = compiler.compile_grammar(f"root ::= {alts}")
    n_judged = compare_walks(test_tool, default_model, tmp_path, xgr_tokenizer, kind, spec,
                             compiled)
    # Only the nested GBNF grammar hits xgrammar's mask/parser disagreement.
    assert n_judged == 0 or kind == "grammar"


def test_xgrammar_length_bounded_strings_admit_control_characters(xgr_tokenizer, test_tool,
                                                                  tmp_path):
    """Why without_lengths() exists: xgrammar lets a raw tab into a maxLength string,
    which json.loads (the JSON reference) refuses; our grammar takes the escaped tab only."""
    xgr, compiler, _ = xgr_tokenizer
    schema = {"type": "string", "maxLength": 5}
    raw, escaped = '"a\tb"', '"a\\tb"'
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    assert json.loads(escaped) == "a\tb"
    m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=False))
    assert m.accept_string(raw)
    (tmp_path / "s").write_text(json.dumps(schema))

    def ours(text):
        (tmp_path / "t").write_text(text)
        return subprocess.run([str(test_tool("grammar_tool")), "match", "json",
                               str(tmp_path / "s"), str(tmp_path / "t")],
                              capture_output=True, text=True, check=True).stdout.strip()
    assert ours(raw) == "0"
    assert ours(escaped) == "1"
