"""`dserve bench throughput --identical-requests`: every request the first one's prompt
and sampling seed, so that the streams stay the same token for token (as the parallel
sequences of llama-batched-bench, which a like-for-like comparison of a MoE model's
concurrent decode needs: the same experts for every sequence). Without the flag the
random prompts differ and so do the outputs. Either way every prompt is computed when
prefix caching is off. And `--warmup`: a first pass that the counts leave out."""
import json

import pytest

from conftest import run


@pytest.mark.parametrize("identical", [False, True])
def test_identical_requests_give_one_stream(identical, dserve_bin, default_model, tmp_path):
    out = tmp_path / "result.json"
    n, input_len, output_len = 6, 24, 12
    flags = ["--identical-requests"] if identical else []
    r = run([dserve_bin, "bench", "throughput", "--model", default_model, "--threads", 2,
             "--num-prompts", n, "--input-len", input_len, "--output-len", output_len,
             "--no-enable-prefix-caching", "--output-json", out, *flags], timeout=300)
    j = json.loads(out.read_text())
    assert j["num_requests"] == n
    assert j["total_num_tokens"] == n * (input_len + output_len)
    assert f"prefix cache hits 0 of {n * input_len} tokens" in r.stdout, r.stdout
    assert j["distinct_outputs"] == (1 if identical else n)


def test_warmup_is_not_counted(dserve_bin, default_model, tmp_path):
    """--warmup runs other prompts of the same shape first: the timed run's counts are
    its own (steps, tokens) and, prefix caching on, it reuses nothing the warm-up
    cached."""
    out = tmp_path / "result.json"
    n, input_len, output_len = 3, 40, 5
    r = run([dserve_bin, "bench", "throughput", "--model", default_model, "--threads", 2,
             "--num-prompts", n, "--input-len", input_len, "--output-len", output_len,
             "--max-num-seqs", 1, "--warmup", "--output-json", out], timeout=300)
    j = json.loads(out.read_text())
    assert j["total_num_tokens"] == n * (input_len + output_len)
    # One request at a time: a prompt step and output_len - 1 decode steps each.
    assert f"Elapsed: {j['elapsed_time']:.3f} s, {n * output_len} steps" in r.stdout, r.stdout
    assert f"prefix cache hits 0 of {n * input_len} tokens" in r.stdout, r.stdout
