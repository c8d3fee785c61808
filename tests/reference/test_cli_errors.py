"""Bad input to `dserve generate` / `dserve perplexity`: each case must end with one
clear line on stderr ("dserve: error: ...") naming the problem, a non-zero exit
status, and no crash (a negative return code would be a signal)."""
import json
import os
import shutil

import pytest

from conftest import run

import torch
from test_llama_reference import tiny_checkpoint  # noqa: E402


def _fails_cleanly(args, *must_contain, env=None):
    r = run(args, check=False, env=env, timeout=120)
    assert r.returncode > 0, f"exit {r.returncode}; stderr: {r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{r.stderr}"
    assert lines[0].startswith("dserve: error: "), lines[0]
    for text in must_contain:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def checkpoint_copy(tmp_path):
    """A writable copy of a tiny Llama checkpoint."""
    d = tmp_path / "model"
    shutil.copytree(tiny_checkpoint(), d)
    d.joinpath("reference.json").unlink()
    return d


def _edit_config(d, **changes):
    path = d / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _generate(model, *extra):
    return ["generate", "--model", model, "--prompt-ids", "1,2,3", "--max-tokens", 4,
            "--print-ids", *extra]


def test_missing_model_path(dserve_bin, tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    _fails_cleanly([dserve_bin, *_generate(missing)], str(missing))


def test_missing_default_model_says_make_model(dserve_bin, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DSERVE_MODEL"}
    env["DSERVE_CACHE"] = str(tmp_path)
    _fails_cleanly([dserve_bin, "generate", "--prompt", "hi", "--max-tokens", 2],
                   "make model", env=env)


def test_corrupt_gguf(dserve_bin, tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(os.urandom(4096))
    _fails_cleanly([dserve_bin, *_generate(bad)], str(bad))


def test_truncated_gguf(dserve_bin, default_model, tmp_path):
    bad = tmp_path / "truncated.gguf"
    with open(default_model, "rb") as f:
        bad.write_bytes(f.read(1 << 20))
    _fails_cleanly([dserve_bin, *_generate(bad)], str(bad))


def test_config_shape_disagrees_with_tensor(dserve_bin, checkpoint_copy):
    _edit_config(checkpoint_copy, intermediate_size=300)
    line = _fails_cleanly([dserve_bin, *_generate(checkpoint_copy)],
                          "model.layers.0.mlp.gate_proj.weight", "[256, 128]", "[300, 128]")
    assert "config.json" in line


def test_config_head_count_disagrees_with_tensor(dserve_bin, checkpoint_copy):
    _edit_config(checkpoint_copy, num_key_value_heads=4)
    _fails_cleanly([dserve_bin, *_generate(checkpoint_copy)], "k_proj.weight")


def test_unsupported_architecture(dserve_bin, checkpoint_copy):
    _edit_config(checkpoint_copy, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    _fails_cleanly([dserve_bin, *_generate(checkpoint_copy)], "GPT2LMHeadModel", "unsupported")


def test_unsupported_rope_type(dserve_bin, checkpoint_copy):
    _edit_config(checkpoint_copy, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4})
    _fails_cleanly([dserve_bin, *_generate(checkpoint_copy)], "longrope")


def test_missing_tensor(dserve_bin, checkpoint_copy):
    from safetensors.torch import load_file, save_file
    path = checkpoint_copy / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    _fails_cleanly([dserve_bin, *_generate(checkpoint_copy)], "model.layers.1.mlp.up_proj.weight")


@pytest.mark.parametrize("content", ["{not json", '{"model": {"type": "Unigram", "vocab": []}}', ""])
def test_unreadable_tokenizer(dserve_bin, checkpoint_copy, content):
    checkpoint_copy.joinpath("tokenizer.json").write_text(content)
    _fails_cleanly([dserve_bin, "generate", "--model", checkpoint_copy, "--prompt", "hello",
                    "--max-tokens", 2], "tokenizer.json")


def test_inconsistent_config(dserve_bin, checkpoint_copy):
    _edit_config(checkpoint_copy, num_key_value_heads=3)
    _fails_cleanly([dserve_bin, *_generate(checkpoint_copy)], "num_key_value_heads")


def test_token_id_outside_vocabulary(dserve_bin):
    model = tiny_checkpoint()
    _fails_cleanly([dserve_bin, "generate", "--model", model, "--prompt-ids", "1,99999",
                    "--print-ids"], "99999")


@pytest.mark.parametrize("flag,value,text", [
    ("--temperature", "-1", "temperature"),
    ("--top-p", "1.5", "top_p"),
    ("--top-k", "-3", "top_k"),
    ("--max-tokens", "0", "max-tokens"),
    ("--prompt-ids", "1,x,3", "'x'"),
])
def test_bad_generate_arguments(dserve_bin, flag, value, text):
    args = [dserve_bin, "generate", "--model", tiny_checkpoint(), "--print-ids"]
    if flag != "--prompt-ids":
        args += ["--prompt-ids", "1,2"]
    _fails_cleanly(args + [flag, value], text)


def test_perplexity_bad_inputs(dserve_bin, tmp_path):
    model = tiny_checkpoint()
    missing = tmp_path / "missing.txt"
    _fails_cleanly([dserve_bin, "perplexity", "--model", model, "--token-ids", missing],
                   str(missing))
    one = tmp_path / "one.txt"
    one.write_text("5")
    _fails_cleanly([dserve_bin, "perplexity", "--model", model, "--token-ids", one], "2 tokens")
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3 4")
    _fails_cleanly([dserve_bin, "perplexity", "--model", model, "--token-ids", ids,
                    "--ctx", 100000], "ctx")
    _fails_cleanly([dserve_bin, "perplexity", "--model", model, "--token-ids", ids,
                    "--logprobs-out", tmp_path / "no-dir" / "out.json"], "no-dir")


def test_usage_errors(dserve_bin):
    _fails_cleanly([dserve_bin])
    _fails_cleanly([dserve_bin, "generate", "--no-such-flag"], "no-such-flag")
    _fails_cleanly([dserve_bin, "serve", "--no-such-flag"], "no-such-flag")


def _has_gpu():
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_device_cuda_without_a_gpu(dserve_bin, default_model, command):
    """--device cuda where there is no GPU (or no CUDA backend in the binary): one
    line saying so, not a crash and not a silent fall back to the CPU."""
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    args = ([dserve_bin, *_generate(default_model, "--device", "cuda")] if command == "generate"
            else [dserve_bin, "serve", "--model", default_model, "--device", "cuda",
                  "--port", "0", "--log-level", "error"])
    _fails_cleanly(args, "--device cuda")
