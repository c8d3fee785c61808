#!/usr/bin/env python3
"""`dserve serve --device cuda` answering the openai SDK (for tools/gpu_check.sh; not a
test: it needs a GPU, and runs the same on `--device cpu` for trying it out).

Makes a tiny random Llama (transformers, seeded) over a real tokenizer (a directory
with tokenizer.json and tokenizer_config.json), serves it, and checks with the openai
SDK: 32 greedy completions sent at once give each the text and token log-probs it gets
alone, and a streamed completion's pieces join to the non-streamed text. Prints one
JSON object; exits 1 on any difference.

  python3 tools/gpu_serve_check.py build/dserve [--tokenizer DIR] [--device cuda]
"""
import argparse
import concurrent.futures
import json
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import openai
import torch
import transformers


def tiny_model(d: pathlib.Path, tokenizer_dir: pathlib.Path):
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=512,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # peaked enough that greedy text is not one repeated token
    model.save_pretrained(d, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, d / name)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(client, server, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"dserve exited {server.returncode}")
        try:
            return client.models.list().data[0].id
        except openai.APIConnectionError:
            time.sleep(0.5)
    raise SystemExit("dserve did not answer in time")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dserve")
    ap.add_argument("--tokenizer", default="build/gpu_bundle/tokenizer")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp) / "model"
        tiny_model(d, pathlib.Path(args.tokenizer))
        port = free_port()
        server = subprocess.Popen([args.dserve, "serve", "--model", str(d), "--device", args.device,
                                   "--port", str(port), "--max-num-seqs", "32",
                                   "--log-level", "warning"])
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                                   max_retries=0, timeout=120)
            model = wait_ready(client, server)
            prompts = [f"Request {i}: the quick brown fox number {i * 7} jumps" for i in range(32)]

            def complete(prompt):
                r = client.completions.create(model=model, prompt=prompt, max_tokens=16,
                                              temperature=0, logprobs=1)
                c = r.choices[0]
                return c.text, c.logprobs.token_logprobs

            alone = [complete(p) for p in prompts]
            with concurrent.futures.ThreadPoolExecutor(32) as pool:
                together = list(pool.map(complete, prompts))
            differ = [i for i in range(len(prompts)) if alone[i] != together[i]]
            stream = client.completions.create(model=model, prompt=prompts[0], max_tokens=16,
                                               temperature=0, stream=True)
            streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
            result = {
                "device": args.device,
                "requests": len(prompts),
                "concurrent_differ_from_alone": differ,
                "streamed_equals_non_streamed": streamed == alone[0][0],
                "sample_text": alone[0][0],
                "distinct_texts": len({a[0] for a in alone}),
            }
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(json.dumps(result, indent=1))
    ok = not result["concurrent_differ_from_alone"] and result["streamed_equals_non_streamed"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
