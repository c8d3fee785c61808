"""ais-bench dataset config: synthetic prompts of a fixed length (ais-bench's
synthetic_gen, "string" type, with its lengths from the environment).

Each prompt is AISBENCH_INPUT_LEN words "A" (one token each for most tokenizers; the
server's chat template adds its own tokens around them) and asks for AISBENCH_OUTPUT_LEN
tokens: with AISBENCH_IGNORE_EOS=1 (model config) every request generates exactly that
many. From the environment, as in models/dserve_stream_chat.py (defaults in brackets):
  AISBENCH_NUM_PROMPTS [100]  requests
  AISBENCH_INPUT_LEN [128]    prompt words
  AISBENCH_OUTPUT_LEN [128]   max_tokens of every request
  AISBENCH_RANGE_RATIO [0]    r > 0: each length drawn uniformly from
                              [len * (1 - r), len * (1 + r)] (vLLM's --random-range-ratio)
The prompts are all the same: serve with --no-enable-prefix-caching to measure prefill
rather than the prefix cache.
"""

_input_len = int("{{$AISBENCH_INPUT_LEN:128}}")
_output_len = int("{{$AISBENCH_OUTPUT_LEN:128}}")
_ratio = float("{{$AISBENCH_RANGE_RATIO:0}}")
# ais-bench's uniform draw truncates a real number from [MinValue, MaxValue]: MaxValue
# one past the last length (the draw never reaches it) gives each integer of the range
# the same chance.
_input = {"MinValue": int(_input_len * (1 - _ratio)),
          "MaxValue": int(_input_len * (1 + _ratio)) + (_ratio > 0)}
_output = {"MinValue": int(_output_len * (1 - _ratio)),
           "MaxValue": int(_output_len * (1 + _ratio)) + (_ratio > 0)}

synthetic_datasets = [
    dict(
        abbr="synthetic",
        type="ais_bench.benchmark.datasets.synthetic.SyntheticDataset",
        config={
            "Type": "string",
            "RequestCount": int("{{$AISBENCH_NUM_PROMPTS:100}}"),
            "TrustRemoteCode": False,
            "StringConfig": {
                "Input": {"Method": "uniform", "Params": _input},
                "Output": {"Method": "uniform", "Params": _output},
            },
            "TokenIdConfig": {"RequestSize": _input_len, "PrefixLen": 0},
        },
        reader_cfg=dict(input_columns=["question", "max_out_len"], output_column="answer"),
        infer_cfg=dict(
            prompt_template=dict(
                type="ais_bench.benchmark.openicl.icl_prompt_template.icl_prompt_template."
                     "PromptTemplate",
                template="{question}"),
            retriever=dict(
                type="ais_bench.benchmark.openicl.icl_retriever.icl_zero_retriever."
                     "ZeroRetriever"),
            inferencer=dict(
                type="ais_bench.benchmark.openicl.icl_inferencer.icl_gen_inferencer."
                     "GenInferencer"),
        ),
        eval_cfg=dict(
            evaluator=dict(type="ais_bench.benchmark.datasets.math.MATHEvaluator",
                           version="v2"),
            pred_postprocessor=dict(type="ais_bench.benchmark.datasets.math.math_postprocess_v2"),
        ),
    )
]
