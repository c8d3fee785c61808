"""--kv-cache-dtype (auto = float16 on the CPU, float16, float32) on `dserve serve` and
`dserve bench throughput`: a bad value is one clear error; the KV budget counts the
real bytes per token, so float16 gets twice the blocks of float32 and the start-up
log says so; both dtypes run the default model to completion."""
import re

import pytest

import server_util
from conftest import run

BENCH = ["bench", "throughput", "--dataset-name", "random", "--num-prompts", 4,
         "--input-len", 8, "--output-len", 4, "--threads", 2]


@pytest.mark.parametrize("cmd", ["serve", "bench"])
def test_bad_value_is_one_clear_error(cmd, dserve_bin, default_model):
    if cmd == "serve":
        args = [dserve_bin, "serve", default_model, "--port", server_util.free_port()]
    else:
        args = [dserve_bin, *BENCH, "--model", default_model]
    r = run([*args, "--kv-cache-dtype", "bfloat16"], check=False, timeout=120)
    assert r.returncode > 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got:\n{r.stderr}"
    assert lines[0].startswith("dserve: error: ") and "--kv-cache-dtype" in lines[0], lines[0]
    for choice in ("auto", "float16", "float32"):
        assert choice in lines[0], lines[0]


@pytest.mark.parametrize("cmd", [["serve"], ["bench", "throughput"]])
def test_help_shows_the_flag(cmd, dserve_bin):
    out = run([dserve_bin, *cmd, "--help"]).stdout
    assert "--kv-cache-dtype" in out and "float16" in out


def _kv_log(dserve_bin, default_model, *dtype):
    r = run([dserve_bin, *BENCH, "--model", default_model, "--kv-cache-memory", 64 << 20,
             "--log-level", "info", *dtype], timeout=300)
    m = re.search(r"KV cache: (\d+) blocks of (\d+) tokens = (\d+) tokens, ([\d.]+) MiB "
                  r"\((\d+) bytes/token, (\w+)\)", r.stderr)
    assert m, r.stderr
    assert "Total num output tokens:  16" in r.stdout, r.stdout
    blocks, block_size, tokens, mib, bytes_per_token = (float(x) for x in m.groups()[:5])
    assert tokens == blocks * block_size
    assert abs(mib * 2**20 - tokens * bytes_per_token) < 0.1 * 2**20
    return int(blocks), int(bytes_per_token), m.group(6)


def test_float16_holds_twice_the_tokens(dserve_bin, default_model):
    b16, bpt16, name16 = _kv_log(dserve_bin, default_model, "--kv-cache-dtype", "float16")
    b32, bpt32, name32 = _kv_log(dserve_bin, default_model, "--kv-cache-dtype", "float32")
    auto = _kv_log(dserve_bin, default_model)
    assert (name16, name32) == ("f16", "f32")
    assert bpt32 == 2 * bpt16
    # SmolLM2-135M: 30 layers x (K + V) x 3 KV heads x 64 dims.
    assert bpt32 == 30 * 2 * 3 * 64 * 4
    assert b16 == 2 * b32
    assert auto == (b16, bpt16, name16)
