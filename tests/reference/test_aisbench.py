"""ais-bench (PyPI ais-bench-benchmark, the load and accuracy tool of vllm-ascend and the
Ascend deployment guides) against `dserve serve` on the default model, through the
configs in tools/aisbench/ and ais-bench's own venv (tools/aisbench_env.sh).

- perf mode, synthetic prompts, streamed (dserve_stream_chat) at concurrency 1 and 2
  and not streamed (dserve_general_chat): every request served and stopped by its
  max_tokens (ignore_eos), the token counts those of the server's /metrics, a stream's
  chunks as vLLM's; ais-bench's median TTFT, TPOT and E2EL and its output throughput
  within 10% of those of `dserve bench serve` (vLLM's definitions) on the same load;
- perf mode, a ShareGPT-format file written here, at a request rate: every turn served
  with exactly as many tokens as its recorded answer has (transformers' count), the
  conversations started at the rate;
- accuracy mode (`--mode all`, one run of two of ais-bench's own dataset configs):
  custom_qa_gen on a file in ais-bench's custom QA format: every question answered, the
  accuracy ais-bench reports the exact-match score of its own predictions;
  ARC_c_ppl_0_shot_str on a small file in ARC's format, scored by perplexity through
  vLLM's prompt_logprobs: every choice scored over the prompt transformers' chat template
  makes, the accuracy that of the choices with the least mean negative log-likelihood in
  the returned scores.

Both load generators run on the cores the server runs on, where other work comes and
goes: measured one after the other, the two have differed by 2x. So each ais-bench
benchmark and its `dserve bench serve` counterpart run at the same time against the same
server, each at the concurrency under test: their requests share the engine's steps, and
whatever slows the machine slows both.
"""
import io
import json
import os
import pathlib
import sqlite3
import subprocess
import time

import numpy as np
import pytest

import server_util
from conftest import REPO, cache_dir, content_key
from test_bench_serve import run_bench
from test_smollm2_reference import _sha256

transformers = pytest.importorskip("transformers")

SERVED = "smollm2"
REL_TOL = 0.10
# The synthetic load of the perf comparisons. Output lengths spread by +-10% (both tools
# draw them uniformly): with one length for all, a tool's concurrent requests end in the
# same engine step and the next ones arrive together, and whether they then share one
# prefill step or queue one behind another turns on which of them the engine saw first,
# microseconds apart: TTFT and TPOT (not E2EL) then swing by up to 50% between runs.
N_PROMPTS, INPUT_LEN, OUTPUT_LEN, RANGE_RATIO = 24, 128, 32, 0.1
CONFIGS = REPO / "tools" / "aisbench"
QA = REPO / "tests" / "reference" / "data" / "aisbench_qa.jsonl"


@pytest.fixture(scope="module")
def aisbench():
    """The venv's ais_bench (created on first use: a few minutes, then cached)."""
    r = subprocess.run([REPO / "tools" / "aisbench_env.sh"], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, r.stderr[-4000:]
    exe = pathlib.Path(r.stdout.strip()) / "bin" / "ais_bench"
    assert exe.exists(), exe
    return exe


@pytest.fixture(scope="module")
def tokenizer_dir(default_model):
    """The default model's tokenizer as transformers reads it from the GGUF, written out
    as the Hugging Face directory ais-bench's model `path` names."""
    key = content_key(_sha256(default_model), transformers.__version__)
    d = cache_dir() / f"aisbench-tokenizer-{key}"
    if not (d / "tokenizer_config.json").exists():
        tok = transformers.AutoTokenizer.from_pretrained(str(default_model.parent),
                                                         gguf_file=default_model.name)
        tmp = d.with_name(d.name + ".tmp")
        tok.save_pretrained(tmp)
        tmp.rename(d)
    return d


@pytest.fixture(scope="module")
def server(dserve_bin, default_model, tmp_path_factory):
    # Prefix caching off: ais-bench's synthetic prompts are all alike, the random ones of
    # `dserve bench serve` are not, and both must cost the server a full prefill.
    log = tmp_path_factory.mktemp("aisbench") / "serve.log"
    with server_util.running(dserve_bin, default_model, "--threads", 1, "--max-num-seqs", 16,
                             "--served-model-name", SERVED, "--no-enable-prefix-caching",
                             log_path=log) as s:
        yield s


def _counter(families, name, suffix="_total", **labels):
    return sum(s.value for s in families[name].samples
               if s.name == name + suffix and
               all(s.labels.get(k) == v for k, v in labels.items()))


def _in_flight(server):
    m = server.metrics()
    return sum(s.value for name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
               for s in m[name].samples)


class AisBenchRun:
    """One `ais_bench` invocation against `server`, in its own work directory."""

    def __init__(self, exe, server, tokenizer_dir, work, *args, **env):
        self.work = work
        self.log = work / "ais_bench.log"
        work.mkdir(parents=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "AISBENCH_HOST": "127.0.0.1", "AISBENCH_PORT": str(server.port),
               "AISBENCH_TOKENIZER": str(tokenizer_dir),
               **{k: str(v) for k, v in env.items()}}
        # ais-bench writes tmp/ and its outputs under the working directory.
        self.proc = subprocess.Popen(
            [exe, "--config-dir", CONFIGS, "--work-dir", work / "out", *map(str, args)],
            cwd=work, env=env, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def wait(self, timeout=300):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        assert rc == 0, self.log.read_text()[-6000:]
        (stamp,) = (self.work / "out").iterdir()
        return stamp

    def poll_until(self, cond, timeout=120):
        deadline = time.monotonic() + timeout
        while not cond():
            assert self.proc.poll() is None, self.log.read_text()[-6000:]
            assert time.monotonic() < deadline, "ais-bench did not get there in time"
            time.sleep(0.01)


def _perf_result(stamp, abbr, dataset):
    """ais-bench's result files of one benchmark: the common metrics (.json), the
    per-request metrics' mean and median (the .csv, in ms) and each request's details
    with its time points (the .jsonl, the arrays in the sqlite db beside it)."""
    d = stamp / "performances" / abbr
    common = {k: v["total"] for k, v in json.loads((d / f"{dataset}.json").read_text()).items()}
    lines = (d / f"{dataset}.csv").read_text().splitlines()
    header = lines[0].split(",")
    stats = {}  # {metric: {"Average": ..., "Median": ...}}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))
        stats[row["Performance Parameters"]] = {
            k: float(row[k].split()[0]) for k in ("Average", "Median")}
    details = [json.loads(line)
               for line in (d / f"{dataset}_details.jsonl").read_text().splitlines()]
    arrays = {}
    for db in (d / "db_data").iterdir():
        with sqlite3.connect(db) as conn:
            for row_id, blob in conn.execute("SELECT id, arr_blob FROM numpy_store"):
                arrays[(db.name, row_id)] = np.load(io.BytesIO(blob), allow_pickle=False)
    for r in details:
        r["time_points"] = arrays[(r["db_name"], r["time_points"]["__db_ref__"])]
    return common, stats, details


def _number(value):
    """A common metric as ais-bench writes it: 12, or "436.3988 token/s"."""
    return float(str(value).split()[0])


def _paired_perf(aisbench, server, tokenizer_dir, dserve_bin, default_model, tmp_path, model,
                 concurrencies):
    """Runs ais-bench's perf mode on `model`, one benchmark per concurrency one after
    another, and alongside each one `dserve bench serve` with the same load; checks that
    every request of both was served as asked. Returns {concurrency: (ais-bench's
    result, dserve bench serve's)}."""
    before = server.metrics()
    run = AisBenchRun(aisbench, server, tokenizer_dir, tmp_path / model,
                      "--models", model, "--datasets", "dserve_synthetic", "--mode", "perf",
                      "--num-warmups", 0,
                      AISBENCH_CONCURRENCY=",".join(map(str, concurrencies)),
                      AISBENCH_IGNORE_EOS=1, AISBENCH_NUM_PROMPTS=N_PROMPTS,
                      AISBENCH_INPUT_LEN=INPUT_LEN, AISBENCH_OUTPUT_LEN=OUTPUT_LEN,
                      AISBENCH_RANGE_RATIO=RANGE_RATIO)
    bench = {}
    for c in concurrencies:
        # `dserve bench serve` starts once ais-bench's first c requests have their first
        # token: its own first requests then find the other's decoding, as later ones
        # do. (Started with ais-bench's first requests, they would wait for that whole
        # prefill before theirs: a first TTFT twice the others'.)
        first_tokens = _counter(server.metrics(), "vllm:time_to_first_token_seconds", "_count")
        run.poll_until(lambda: _counter(server.metrics(), "vllm:time_to_first_token_seconds",
                                        "_count") >= first_tokens + c)
        bench[c], _ = run_bench(
            dserve_bin, server.base_url, tmp_path / f"bench-{model}-{c}", "--backend",
            "openai-chat", "--model", SERVED, "--dataset-name", "random",
            "--random-input-len", INPUT_LEN, "--random-output-len", OUTPUT_LEN,
            "--random-range-ratio", RANGE_RATIO, "--ignore-eos", "--temperature", 0.01,
            "--num-prompts", N_PROMPTS, "--max-concurrency", c,
            "--percentile-metrics", "ttft,tpot,itl,e2el", tokenizer=default_model)
        run.poll_until(lambda: _in_flight(server) == 0)
    stamp = run.wait()
    after = server.metrics()

    abbr = "dserve-" + model.removeprefix("dserve_").replace("_", "-")
    results = {c: (_perf_result(stamp, f"{abbr}-c{c}", "synthetic"), bench[c])
               for c in concurrencies}
    # Every request of both tools served and stopped by its max_tokens (ignore_eos), and
    # the server generated the tokens the two tools counted from the responses' usage.
    n_total = 2 * N_PROMPTS * len(concurrencies)
    assert _counter(after, "vllm:request_success", finished_reason="length") - \
        _counter(before, "vllm:request_success", finished_reason="length") == n_total
    generated = sum(_number(common["Total Generated Tokens"]) + ref["total_output_tokens"]
                    for (common, _, _), ref in results.values())
    assert _counter(after, "vllm:generation_tokens") - \
        _counter(before, "vllm:generation_tokens") == generated
    lo, hi = int(OUTPUT_LEN * (1 - RANGE_RATIO)), int(OUTPUT_LEN * (1 + RANGE_RATIO))
    for (common, _, details), ref in results.values():
        assert _number(common["Total Requests"]) == N_PROMPTS
        assert _number(common["Success Requests"]) == N_PROMPTS, common
        assert _number(common["Failed Requests"]) == 0, common
        assert all(r["success"] for r in details) and len(details) == N_PROMPTS
        assert all(lo <= r["output_tokens"] <= hi for r in details)
        assert _number(common["Total Generated Tokens"]) == \
            sum(r["output_tokens"] for r in details)
        assert ref["completed"] == N_PROMPTS and ref["failed"] == 0
    return results


def _close(name, ais, ref):
    print(f"    {name:28s} ais-bench {ais:9.2f}   dserve bench serve {ref:9.2f}   "
          f"({(ais - ref) / ref:+.1%})")
    return abs(ais - ref) <= REL_TOL * ref


def _agree(common, stats, ref, latencies):
    """Prints ais-bench's figures beside dserve bench serve's: the means, the medians and
    the output throughput; returns whether the medians and the throughput agree within
    REL_TOL. The medians, because the few requests that a burst of other work on these
    cores holds up move a mean of 24 by more than that (seen: mean TTFTs 14-19% apart,
    their medians 1-6%)."""
    ok = True
    for name in latencies:
        _close(f"mean {name} (ms)", stats[name]["Average"], ref[f"mean_{name.lower()}_ms"])
        ok &= _close(f"median {name} (ms)", stats[name]["Median"],
                     ref[f"median_{name.lower()}_ms"])
    return ok & _close("output throughput (token/s)",
                       _number(common["Output Token Throughput"]), ref["output_throughput"])


def _perf_agrees_with_bench_serve(aisbench, server, tokenizer_dir, dserve_bin, default_model,
                                  tmp_path, model, concurrencies, latencies, check_details):
    """The paired runs, once more if the figures disagree: both runs are printed, and the
    second must agree (a background burst can spoil one run; a real difference stays)."""
    for attempt in (1, 2):
        results = _paired_perf(aisbench, server, tokenizer_dir, dserve_bin, default_model,
                               tmp_path / f"attempt{attempt}", model, concurrencies)
        ok = True
        for c, ((common, stats, details), ref) in results.items():
            check_details(details)
            print(f"\n{model}, concurrency {c}, run {attempt}:")
            ok &= _agree(common, stats, ref, latencies)
        if ok:
            return
    pytest.fail("ais-bench and dserve bench serve disagree by more than 10% (above)")


def test_perf_streamed_agrees_with_bench_serve(aisbench, server, tokenizer_dir, dserve_bin,
                                               default_model, tmp_path):
    # ais-bench's definitions: TTFT = first data chunk - request sent; E2EL = last data
    # chunk (the usage chunk) - request sent; TPOT = (E2EL - TTFT) / (output tokens - 1);
    # output throughput = output tokens / (last answer - first request). vLLM's, which
    # dserve bench serve follows, measure the same: TTFT to the first chunk with a choice
    # (dserve's first chunk carries the first token), E2EL to the last one (the
    # finish_reason chunk, which dserve writes together with the usage chunk), TPOT
    # without the first token, throughput over the benchmark's duration.
    def check_details(details):
        # A stream as vLLM's: per token one chunk, then the finish_reason chunk and the
        # usage chunk (vLLM: a role chunk first, the finish_reason on the last token's
        # chunk), each a time point after the one of the request itself. (Where a
        # character spans tokens its text waits for the last of them: ASCII answers only.)
        ascii_answers = [r for r in details if r["prediction"].isascii()]
        assert ascii_answers
        assert all(len(r["time_points"]) == 1 + r["output_tokens"] + 2 for r in ascii_answers)

    _perf_agrees_with_bench_serve(aisbench, server, tokenizer_dir, dserve_bin, default_model,
                                  tmp_path, "dserve_stream_chat", (1, 2),
                                  ("TTFT", "TPOT", "E2EL"), check_details)


def test_perf_not_streamed_agrees_with_bench_serve(aisbench, server, tokenizer_dir, dserve_bin,
                                                   default_model, tmp_path):
    # Not streamed, ais-bench has two time points (request sent, answer received): its
    # E2EL compares with the streamed one of dserve bench serve (which has no other
    # mode), its TTFT is that E2EL and it reports no TPOT.
    def check_details(details):
        assert all(len(r["time_points"]) == 2 for r in details)

    _perf_agrees_with_bench_serve(aisbench, server, tokenizer_dir, dserve_bin, default_model,
                                  tmp_path, "dserve_general_chat", (2,), ("E2EL",),
                                  check_details)


def _sharegpt_file(path):
    """Twelve conversations: eight of one turn, four of two (the same answer twice, so
    both turns ask for as many tokens, whichever answer ais-bench counts)."""
    topics = ["lighthouses", "tides", "bread", "glaciers", "owls", "bridges", "tea",
              "volcanoes", "maps", "bees", "clocks", "rivers"]
    conversations = []
    for i, topic in enumerate(topics):
        answer = f"Here are {i + 2} short facts about {topic}. " + \
            " ".join(f"Fact {k}: {topic} are interesting for reason {k}." for k in range(i % 4 + 1))
        turns = [{"from": "human", "value": f"Tell me something about {topic}."},
                 {"from": "gpt", "value": answer}]
        if i % 3 == 0:
            turns += [{"from": "human", "value": "Tell me more."}, {"from": "gpt", "value": answer}]
        conversations.append({"id": f"conv{i}", "conversations": turns})
    path.write_text(json.dumps(conversations, indent=1))
    return conversations


def test_perf_sharegpt_at_a_request_rate(aisbench, server, tokenizer_dir, tmp_path):
    conversations = _sharegpt_file(tmp_path / "sharegpt.json")
    rate = 4.0
    run = AisBenchRun(aisbench, server, tokenizer_dir, tmp_path / "sharegpt",
                      "--models", "dserve_stream_chat", "--datasets", "dserve_sharegpt",
                      "--mode", "perf", "--num-warmups", 0,
                      AISBENCH_SHAREGPT=tmp_path / "sharegpt.json", AISBENCH_CONCURRENCY=8,
                      AISBENCH_REQUEST_RATE=rate, AISBENCH_BURSTINESS=0,
                      AISBENCH_IGNORE_EOS=1)
    stamp = run.wait()
    common, _, details = _perf_result(stamp, f"dserve-stream-chat-c8-rate{rate:g}",
                                         "sharegpt")
    n_turns = sum(len(c["conversations"]) // 2 for c in conversations)
    assert _number(common["Success Requests"]) == n_turns, common
    assert _number(common["Failed Requests"]) == 0, common
    assert all(r["success"] for r in details)

    # Each turn asked for as many tokens as its recorded answer has (ais-bench counts
    # them with the model config's tokenizer) and, ignore_eos, got exactly that many.
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    want = sorted(len(tok.encode(c["conversations"][1]["value"]))
                  for c in conversations for _ in range(len(c["conversations"]) // 2))
    assert sorted(r["output_tokens"] for r in details) == want

    # The first turns leave at the rate. Burstiness 0 makes every interval 1 / rate (with
    # gamma intervals the span is random: ais-bench scales the n intervals to n / rate in
    # all, the first one before the first send), and a conversation takes one token, its
    # later turns follow its answers: n first turns over (n - 1) / rate seconds, each
    # send no earlier than its token.
    first = sorted(r["time_points"][0] for r in details if r["turn_id"] == 0)
    span = first[-1] - first[0]
    assert abs(span - (len(first) - 1) / rate) <= 3 / rate, (span, first)


ARC_QUESTIONS = [
    ("Which of these is a mammal?", ["a shark", "a dolphin", "a trout", "a frog"], "B"),
    ("What do plants need to make food?", ["sunlight", "sand", "plastic", "noise"], "A"),
    ("Which object is magnetic?",
     ["a wooden spoon", "a glass cup", "an iron nail", "a paper towel"], "C"),
    ("What is the boiling point of water at sea level?",
     ["50 degrees Celsius", "0 degrees Celsius", "200 degrees Celsius", "100 degrees Celsius"],
     "D"),
    ("What gas do humans breathe out?", ["helium", "carbon dioxide", "neon", "argon"], "B"),
]
ACCURACY_ABBR = "dserve-general-chat-c4"


@pytest.fixture(scope="module")
def accuracy_run(aisbench, server, tokenizer_dir, tmp_path_factory):
    """One `--mode all` run of two of ais-bench's own dataset configs, on files written
    where they look (AIS_BENCH_DATASETS_CACHE): custom_qa_gen (its custom format,
    tests/reference/data/aisbench_qa.jsonl) and ARC_c_ppl_0_shot_str (ARC-Challenge's
    format, ARC_QUESTIONS; scored by perplexity). Returns (result directory, requests the
    server served)."""
    tmp = tmp_path_factory.mktemp("aisbench-accuracy")
    data = tmp / "datasets" / "ais_bench" / "datasets"
    (data / "custom").mkdir(parents=True)
    (data / "custom" / "qa.jsonl").write_text(QA.read_text())
    arc = data / "ARC" / "ARC-c"
    arc.mkdir(parents=True)
    lines = [json.dumps({"id": f"q{i}", "answerKey": answer, "question": {
        "stem": q, "choices": [{"text": t, "label": label} for t, label in zip(texts, "ABCD")]}})
        for i, (q, texts, answer) in enumerate(ARC_QUESTIONS)]
    for split in ("Dev", "Test"):
        (arc / f"ARC-Challenge-{split}.jsonl").write_text("\n".join(lines) + "\n")
    before = server.metrics()
    run = AisBenchRun(aisbench, server, tokenizer_dir, tmp / "run",
                      "--models", "dserve_general_chat",
                      "--datasets", "custom_qa_gen", "ARC_c_ppl_0_shot_str",
                      "--mode", "all", "--num-warmups", 0,
                      AISBENCH_CONCURRENCY=4, AIS_BENCH_DATASETS_CACHE=tmp / "datasets")
    stamp = run.wait()
    served = _counter(server.metrics(), "vllm:request_success") - \
        _counter(before, "vllm:request_success")
    return stamp, served


def test_accuracy_served_every_question(accuracy_run):
    _, served = accuracy_run
    n_qa = len(QA.read_text().splitlines())
    assert served == n_qa + 4 * len(ARC_QUESTIONS)  # perplexity: one request per choice


def test_accuracy_custom_qa(accuracy_run):
    stamp, _ = accuracy_run
    questions = [json.loads(line) for line in QA.read_text().splitlines()]
    predictions = [json.loads(line) for line in
                   (stamp / "predictions" / ACCURACY_ABBR / "qa.jsonl").read_text().splitlines()]
    assert sorted(p["id"] for p in predictions) == list(range(len(questions)))
    assert all(p["success"] and p["prediction"] for p in predictions), predictions
    by_id = {p["id"]: p for p in predictions}
    for i, q in enumerate(questions):
        assert by_id[i]["gold"] == q["answer"]
        assert q["question"] in by_id[i]["origin_prompt"]

    # ais-bench's custom QA scoring is exact match of the answer text.
    reported = json.loads(
        (stamp / "results" / ACCURACY_ABBR / "qa.json").read_text())["accuracy"]
    ours = 100 * sum(p["prediction"] == p["gold"] for p in predictions) / len(predictions)
    print(f"\naccuracy: ais-bench {reported:.2f}, exact match of its predictions {ours:.2f}")
    for p in sorted(predictions, key=lambda p: p["id"]):
        print(f"  {p['prediction']!r:45s} gold {p['gold']!r}")
    assert reported == pytest.approx(ours)


def test_accuracy_by_perplexity(accuracy_run, tokenizer_dir):
    stamp, _ = accuracy_run
    predictions = {p["id"]: p for p in map(json.loads, (
        stamp / "predictions" / ACCURACY_ABBR / "ARC-c.jsonl").read_text().splitlines())}
    assert sorted(predictions) == list(range(len(ARC_QUESTIONS)))
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    correct = 0
    for i, (question, texts, answer) in enumerate(ARC_QUESTIONS):
        p = predictions[i]
        assert p["success"]
        losses = {}
        for prompt, scores, ppl in zip(p["origin_prompt"], p["origin_prompt_logprobs"],
                                       p["ppl_list"]):
            # The scores cover the prompt the chat template made, token by token.
            text = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert scores[0] is None
            assert [int(next(iter(s))) for s in scores[1:]] == ids[1:]
            lps = [next(iter(s.values()))["logprob"] for s in scores[1:]]
            losses[ppl["label"]] = -sum(lps) / len(lps)
            assert ppl["ppl"] == pytest.approx(losses[ppl["label"]])
        assert sorted(losses) == list("ABCD")
        correct += min(losses, key=losses.get) == answer
    reported = json.loads(
        (stamp / "results" / ACCURACY_ABBR / "ARC-c.json").read_text())["accuracy"]
    ours = 100 * correct / len(ARC_QUESTIONS)
    print(f"\naccuracy by perplexity: ais-bench {reported:.2f}, least mean NLL {ours:.2f}")
    assert reported == pytest.approx(ours)
