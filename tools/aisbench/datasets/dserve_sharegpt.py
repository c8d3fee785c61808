"""ais-bench dataset config: a ShareGPT-format JSON file (ais-bench's sharegpt_gen, with
the file's path from the environment instead of ais-bench's source tree).

From the environment, as in models/dserve_stream_chat.py:
  AISBENCH_SHAREGPT  the file, an absolute path (a relative one is taken in ais-bench's
      dataset directory, as ais-bench's own config does; the default is that config's)

Every human turn is one request ("every" mode): the conversation so far, the model's own
earlier answers included, asking for as many tokens as the conversation's last recorded
answer has (counted with the model config's tokenizer, AISBENCH_TOKENIZER; ais-bench keeps
one length per conversation). Use --num-prompts to take the first N conversations.
"""
sharegpt_datasets = [
    dict(
        abbr="sharegpt",
        type="ais_bench.benchmark.datasets.sharegpt.ShareGPTDataset",
        disable_shuffle=True,
        path="{{$AISBENCH_SHAREGPT:ais_bench/datasets/sharegpt/ShareGPT_V3_unfiltered_cleaned_split.json}}",
        # max_out_len among the inputs: each request asks for as many tokens as the
        # recorded answer has (as vLLM's benchmark does), not the model config's max_out_len.
        reader_cfg=dict(input_columns=["question", "answer", "max_out_len"],
                        output_column="answer"),
        infer_cfg=dict(
            prompt_template=dict(
                type="ais_bench.benchmark.openicl.icl_prompt_template."
                     "icl_prompt_template_multiturn.MultiTurnPromptTemplate",
                template=dict(round=[
                    dict(role="HUMAN", prompt="{question}"),
                    dict(role="BOT", prompt="{answer}"),
                ]),
            ),
            retriever=dict(
                type="ais_bench.benchmark.openicl.icl_retriever.icl_zero_retriever."
                     "ZeroRetriever"),
            inferencer=dict(
                type="ais_bench.benchmark.openicl.icl_inferencer.icl_multiturn_inferencer."
                     "MultiTurnGenInferencer",
                infer_mode="every"),
        ),
        eval_cfg=dict(
            evaluator=dict(type="ais_bench.benchmark.datasets.sharegpt.ShareGPTEvaluator")),
    )
]
