"""32 concurrent chat requests with response_format json_schema against 32 free ones
(ignore_eos), through the openai SDK against `dserve serve MODEL` started here: output
tokens/s of each, alternated twice. Usage: .venv/bin/python tools/structured_output_bench.py MODEL"""
import concurrent.futures
import pathlib
import sys
import time

import openai
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference"))
import server_util
M = sys.argv[1]
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
          "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
with server_util.running("build/dserve", M, "--threads", 2, "--served-model-name", "m", "--max-num-seqs", 64, log_path="/tmp/structured_output_bench.log") as s:
    c = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0)
    def one(i, constrained):
        kw = dict(model="m", messages=[{"role": "user", "content": f"Describe person {i} as JSON."}],
                  max_tokens=128, temperature=1.0, seed=i)
        if constrained:
            kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
        else:
            kw["extra_body"] = {"ignore_eos": True}
        return c.chat.completions.create(**kw).usage.completion_tokens
    one(0, True); one(0, False)  # warm (trie, grammar)
    for constrained in (False, True, False, True):
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(32) as p:
            toks = sum(p.map(lambda i: one(i, constrained), range(32)))
        dt = time.time() - t0
        print(("constrained" if constrained else "free"), toks, "tokens", round(dt, 2), "s", round(toks / dt, 1), "tok/s")
