#include "cli/bench_throughput.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_datasets.h"
#include "dserve/llm.h"
#include "tokenizer/tokenizer.h"

namespace dserve::cli {
namespace {

constexpr int kDefaultOutputLen = 128;  // random dataset, when --output-len is not given

// The run's requests: --num-prompts samples of the dataset drawn with `seed`.
Status make_requests(const BenchThroughputOptions& o, LLM& llm, uint64_t seed,
                     std::vector<Prompt>* prompts, std::vector<SamplingOptions>* options) {
  std::vector<SampleRequest> samples;
  if (o.dataset_name == "random") {
    RandomDatasetOptions ro;
    ro.num_prompts = o.num_prompts;
    ro.input_len = o.input_len;
    ro.output_len = o.output_len > 0 ? o.output_len : kDefaultOutputLen;
    ro.seed = seed;
    // Text prompts that re-encode to --input-len tokens when there is a tokenizer (as
    // vLLM), raw ids otherwise.
    if (llm.tokenizer() != nullptr) {
      DS_ASSIGN_OR_RETURN(samples, sample_random(*llm.tokenizer(), ro));
    } else {
      DS_ASSIGN_OR_RETURN(samples, sample_random_ids(llm.vocab_size(), ro));
    }
  } else {
    if (llm.tokenizer() == nullptr)
      return invalid_argument("sharegpt needs the model's tokenizer");
    ShareGptOptions so;
    so.path = o.dataset_path;
    so.num_prompts = o.num_prompts;
    so.output_len = o.output_len;
    so.seed = seed;
    DS_ASSIGN_OR_RETURN(samples, sample_sharegpt(*llm.tokenizer(), so));
  }
  for (SampleRequest& s : samples) {
    const SampleRequest& source = o.identical_requests ? samples.front() : s;
    SamplingOptions so;
    so.temperature = 1.0f;
    so.top_p = 1.0f;
    so.ignore_eos = true;
    so.max_tokens = source.expected_output_len;
    if (o.identical_requests) so.seed = seed;
    Prompt p;
    p.ids = source.prompt_ids;
    prompts->push_back(std::move(p));
    options->push_back(so);
  }
  return Status::Ok();
}

Status bench(const BenchThroughputOptions& o) {
  if (o.num_prompts < 1) return invalid_argument("--num-prompts must be >= 1");
  if (o.input_len < 1 || o.output_len < 0) {
    return invalid_argument("--input-len must be >= 1 and --output-len >= 0");
  }
  if (o.dataset_name == "sharegpt" && o.dataset_path.empty()) {
    return invalid_argument("--dataset-name sharegpt needs --dataset-path");
  }
  const std::string path = o.common.model.empty() ? default_model_path() : o.common.model;
  DS_RETURN_IF_ERROR(open_model_files(o.common).status());  // a clear message if missing
  LlmOptions lo;
  lo.max_num_seqs = o.max_num_seqs;
  lo.max_num_batched_tokens = o.max_num_batched_tokens;
  lo.block_size = o.block_size;
  lo.kv_cache_memory = o.kv_cache_memory;
  DS_ASSIGN_OR_RETURN(lo.kv_cache_dtype, kv_cache_dtype_from_flag(o.kv_cache_dtype));
  lo.max_model_len = o.max_model_len;
  if (lo.max_model_len == 0 && o.dataset_name == "random") {
    lo.max_model_len = o.input_len + (o.output_len > 0 ? o.output_len : kDefaultOutputLen);
  }
  lo.enable_prefix_caching = !o.no_enable_prefix_caching;
  lo.n_threads = o.common.n_threads;
  lo.isa = o.common.isa;
  lo.device = o.common.device;
  lo.quantization = o.common.quantization;
  lo.fp8_weights = o.common.fp8_weights;
  DS_ASSIGN_OR_RETURN(std::unique_ptr<LLM> llm, LLM::create(path, lo));

  if (o.warmup) {
    std::vector<Prompt> prompts;
    std::vector<SamplingOptions> options;
    DS_RETURN_IF_ERROR(make_requests(o, *llm, o.seed + 1, &prompts, &options));
    DS_RETURN_IF_ERROR(llm->generate(prompts, options).status());
  }
  std::vector<Prompt> prompts;
  std::vector<SamplingOptions> options;
  DS_RETURN_IF_ERROR(make_requests(o, *llm, o.seed, &prompts, &options));

  const EngineStats before = llm->stats();  // the warm-up's counts, if any
  const auto t0 = std::chrono::steady_clock::now();
  DS_ASSIGN_OR_RETURN(std::vector<CompletionOutput> outs, llm->generate(prompts, options));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t n_in = 0, n_out = 0;
  std::vector<std::vector<int32_t>> streams;
  for (const CompletionOutput& c : outs) {
    n_in += static_cast<int64_t>(c.prompt_ids.size());
    n_out += static_cast<int64_t>(c.token_ids.size());
    streams.emplace_back(c.token_ids.begin(), c.token_ids.end());
  }
  std::sort(streams.begin(), streams.end());
  const int64_t distinct_outputs = std::unique(streams.begin(), streams.end()) - streams.begin();
  EngineStats st = llm->stats();
  st.n_steps -= before.n_steps;
  st.n_preemptions -= before.n_preemptions;
  st.n_prefix_hit_tokens -= before.n_prefix_hit_tokens;
  st.n_prefix_queried_tokens -= before.n_prefix_queried_tokens;
  const double rps = outs.size() / elapsed;
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", rps,
              (n_in + n_out) / elapsed, n_out / elapsed);
  std::printf("Input tokens/s: %.2f\n", n_in / elapsed);
  // The decode phase alone: after every sequence had its first token.
  const LLM::GenerateTiming timing = llm->last_generate_timing();
  const double decode_rate =
      timing.decode_seconds > 0 ? static_cast<double>(timing.decode_tokens) / timing.decode_seconds : 0.0;
  std::printf("Decode, once every sequence has a token: %lld tokens in %.3f s (%.2f tokens/s)\n",
              static_cast<long long>(timing.decode_tokens), timing.decode_seconds, decode_rate);
  std::printf("Total num prompt tokens:  %lld\n", static_cast<long long>(n_in));
  std::printf("Total num output tokens:  %lld\n", static_cast<long long>(n_out));
  std::printf(
      "Elapsed: %.3f s, %lld steps, %lld preemptions, prefix cache hits %lld of %lld "
      "tokens\n",
      elapsed, static_cast<long long>(st.n_steps), static_cast<long long>(st.n_preemptions),
      static_cast<long long>(st.n_prefix_hit_tokens),
      static_cast<long long>(st.n_prefix_queried_tokens));
  if (!o.output_json.empty()) {
    nlohmann::json j = {{"elapsed_time", elapsed},
                        {"num_requests", outs.size()},
                        {"total_num_tokens", n_in + n_out},
                        {"requests_per_second", rps},
                        {"tokens_per_second", (n_in + n_out) / elapsed},
                        {"input_tokens_per_second", n_in / elapsed},
                        {"output_tokens_per_second", n_out / elapsed},
                        {"decode_tokens", timing.decode_tokens},
                        {"decode_seconds", timing.decode_seconds},
                        {"decode_tokens_per_second", decode_rate},
                        {"num_preemptions", st.n_preemptions},
                        {"distinct_outputs", distinct_outputs}};
    std::ofstream(o.output_json) << j.dump(2) << "\n";
  }
  return Status::Ok();
}

}  // namespace

int run_bench_throughput(const BenchThroughputOptions& options) {
  Status s = bench(options);
  if (!s.ok()) return report_error(s);
  return 0;
}

}  // namespace dserve::cli
