"""ais-bench model config: `dserve serve`'s /v1/chat/completions, not streamed (ais-bench's
vllm_api_general_chat pointed at dserve).

    ais_bench --config-dir tools/aisbench --models dserve_general_chat \
        --datasets dserve_synthetic --mode perf

Values come from the environment as in models/dserve_stream_chat.py.
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
        abbr=f"dserve-general-chat-c{c}" + (f"-rate{_rate:g}" if _rate > 0 else ""),
        path=_tokenizer,
        model=_model,
        stream=False,
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
