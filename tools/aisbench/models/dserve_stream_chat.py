"""ais-bench model config: `dserve serve`'s /v1/chat/completions, streamed (ais-bench's
vllm_api_stream_chat pointed at dserve).

    ais_bench --config-dir tools/aisbench --models dserve_stream_chat \
        --datasets dserve_synthetic --mode perf

Values come from the environment (defaults in brackets) by mmengine's substitution of
environment variables in a config's text; that needs a config that imports nothing (one
mmengine does not read as a lazy-import config), hence the types as dotted names:
  AISBENCH_HOST [127.0.0.1], AISBENCH_PORT [8000]  the server (`make serve` listens on 8000)
  AISBENCH_MODEL [the server's first in /v1/models] the model name sent
  AISBENCH_TOKENIZER [none]  a directory with the model's tokenizer files (a Hugging Face
      model directory, or one written from a GGUF file: docs/benchmarks.md); ais-bench
      loads it in every perf run and to size the ShareGPT dataset's requests
  AISBENCH_CONCURRENCY [1]  requests in flight at most (ais-bench's batch_size); a comma
      list ("1,8,32") runs one benchmark per value, one after another
  AISBENCH_REQUEST_RATE [0]  requests/s (gamma arrivals, Poisson by default); 0 sends each
      request as soon as the concurrency allows
  AISBENCH_BURSTINESS [1]  the gamma's shape: 1 Poisson, below 1 burstier, above 1 more
      regular, 0 evenly spaced (every interval 1 / rate)
  AISBENCH_IGNORE_EOS [0]  1: every request generates its max_tokens (perf runs)
  AISBENCH_API_KEY [none]  sent as a Bearer token (`dserve serve --api-key`)
"""

_rate = float("{{$AISBENCH_REQUEST_RATE:0}}")
_burstiness = float("{{$AISBENCH_BURSTINESS:1}}")
# mmengine needs a non-empty default: "-" stands for none.
_model, _tokenizer, _api_key = (v if v != "-" else "" for v in (
    "{{$AISBENCH_MODEL:-}}", "{{$AISBENCH_TOKENIZER:-}}", "{{$AISBENCH_API_KEY:-}}"))

models = [
    dict(
        attr="service",
        type="ais_bench.benchmark.models.api_models.vllm_custom_api_chat.VLLMCustomAPIChat",
        abbr=f"dserve-stream-chat-c{c}" + (f"-rate{_rate:g}" if _rate > 0 else ""),
        path=_tokenizer,
        model=_model,
        stream=True,
        request_rate=_rate,
        traffic_cfg=dict(burstiness=_burstiness),
        use_timestamp=False,
        retry=2,
        api_key=_api_key,
        host_ip="{{$AISBENCH_HOST:127.0.0.1}}",
        host_port=int("{{$AISBENCH_PORT:8000}}"),
        url="",
        max_out_len=512,  # datasets that give each request its length override it
        batch_size=c,
        trust_remote_code=False,
        generation_kwargs=dict(
            temperature=0.01,
            ignore_eos="{{$AISBENCH_IGNORE_EOS:0}}" == "1",
        ),
        pred_postprocessor=dict(
            type="ais_bench.benchmark.utils.postprocess.model_postprocessors."
                 "extract_non_reasoning_content"),
    )
    for c in map(int, "{{$AISBENCH_CONCURRENCY:1}}".split(","))
]
