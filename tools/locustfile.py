"""Load on an OpenAI-compatible server (dserve serve, or vLLM's) with Locust.

    locust -f tools/locustfile.py --host http://127.0.0.1:8000            # web UI on :8089
    locust -f tools/locustfile.py --host http://127.0.0.1:8000 --headless -u 32 -r 4 -t 60s

Each simulated user sends, in turn, chat completions and completions, streamed and not
(weights below), and checks every answer: a JSON body with choices and usage, or an SSE
stream of chunks ending in `data: [DONE]`. Streamed requests also report custom
metrics in Locust's tables, in milliseconds:
  TTFT  time to the first chunk that carries text;
  ITL   the time between one text chunk and the next (one entry per chunk);
  TPOT  (end - first chunk) / (chunks - 1), one entry per request.
Every request asks for exactly max_tokens tokens (vLLM's `ignore_eos`, as its own
benchmarks do), so the load does not depend on where the model would stop; set
DSERVE_LOAD_IGNORE_EOS=0 to let it stop. Settings through the environment:
DSERVE_LOAD_MODEL (default: the first of /v1/models), DSERVE_LOAD_MAX_TOKENS (64),
DSERVE_API_KEY (sent as a Bearer token).
"""
import json
import os
import time

from locust import HttpUser, between, events, task

MAX_TOKENS = int(os.environ.get("DSERVE_LOAD_MAX_TOKENS", "64"))
IGNORE_EOS = os.environ.get("DSERVE_LOAD_IGNORE_EOS", "1") != "0"
PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three uses of copper.",
    "What is the capital of Australia, and why was it chosen?",
]


def report(environment, name, milliseconds):
    environment.events.request.fire(request_type="METRIC", name=name, response_time=milliseconds,
                                    response_length=0, exception=None, context={})


class OpenAiUser(HttpUser):
    wait_time = between(0.0, 0.5)

    def on_start(self):
        key = os.environ.get("DSERVE_API_KEY")
        if key:
            self.client.headers["Authorization"] = f"Bearer {key}"
        self.model = os.environ.get("DSERVE_LOAD_MODEL")
        if not self.model:
            self.model = self.client.get("/v1/models", name="/v1/models").json()["data"][0]["id"]
        self.turn = 0

    def next_prompt(self):
        self.turn += 1
        return PROMPTS[self.turn % len(PROMPTS)]

    def body(self, chat, stream):
        b = {"model": self.model, "max_tokens": MAX_TOKENS, "stream": stream}
        if IGNORE_EOS:
            b["ignore_eos"] = True
        if chat:
            b["messages"] = [{"role": "user", "content": self.next_prompt()}]
        else:
            b["prompt"] = self.next_prompt()
        return b

    def plain(self, path, chat):
        with self.client.post(path, json=self.body(chat, False), name=path,
                              catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            body = r.json()
            if not body.get("choices") or body.get("usage", {}).get("completion_tokens", 0) < 1:
                r.failure(f"no choices or no completion tokens: {r.text[:200]}")

    def streamed(self, path, chat):
        name = path + " (stream)"
        start = time.perf_counter()
        times = []
        with self.client.post(path, json=self.body(chat, True), name=name, stream=True,
                              catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            done = finished = False
            for line in r.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    r.failure(f"error event: {data[:200]}")
                    return
                choice = chunk["choices"][0] if chunk.get("choices") else {}
                finished = finished or choice.get("finish_reason") is not None
                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if text:
                    times.append(time.perf_counter())
            if not done or not finished:
                r.failure("the stream ended without a finish_reason and data: [DONE]")
                return
        if not times:  # the model stopped at once: no token times to report
            return
        report(self.environment, "TTFT " + path, (times[0] - start) * 1000)
        for a, b in zip(times, times[1:]):
            report(self.environment, "ITL " + path, (b - a) * 1000)
        if len(times) > 1:
            report(self.environment, "TPOT " + path, (times[-1] - times[0]) * 1000 / (len(times) - 1))

    @task(3)
    def chat_stream(self):
        self.streamed("/v1/chat/completions", chat=True)

    @task(1)
    def chat(self):
        self.plain("/v1/chat/completions", chat=True)

    @task(1)
    def completion_stream(self):
        self.streamed("/v1/completions", chat=False)

    @task(1)
    def completion(self):
        self.plain("/v1/completions", chat=False)


@events.quitting.add_listener
def _fail_on_errors(environment, **_):
    """A run with any failed request exits non-zero (for CI and scripts)."""
    if environment.stats.total.num_failures > 0:
        environment.process_exit_code = 1
