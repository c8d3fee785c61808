#include "cli/bench_throughput.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "dserve/llm.h"
#include "tokenizer/tokenizer.h"

namespace dserve::cli {
namespace {

constexpr int kDefaultOutputLen = 128;  // random dataset, when --output-len is not given

struct Sample {
  Prompt prompt;
  int output_len = 0;
};

std::vector<Sample> random_dataset(const BenchThroughputOptions& o, int64_t vocab) {
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<Sample> out(o.num_prompts);
  for (Sample& s : out) {
    s.prompt.ids.resize(o.input_len);
    for (int32_t& t : s.prompt.ids) t = id(rng);
    s.output_len = o.output_len > 0 ? o.output_len : kDefaultOutputLen;
  }
  return out;
}

// ShareGPT as vLLM samples it: first human turn as the prompt, the reply's length as
// the output length (unless --output-len), dropping too short or too long pairs.
Result<std::vector<Sample>> sharegpt_dataset(const BenchThroughputOptions& o,
                                             const Tokenizer& tok) {
  std::ifstream f(o.dataset_path);
  if (!f) return not_found(o.dataset_path + ": cannot open");
  nlohmann::json data = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!data.is_array()) return invalid_argument(o.dataset_path + ": not a ShareGPT JSON list");
  std::vector<size_t> order(data.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(o.seed));
  std::vector<Sample> out;
  for (size_t i : order) {
    if (static_cast<int>(out.size()) >= o.num_prompts) break;
    const nlohmann::json& conv = data[i].value("conversations", nlohmann::json::array());
    if (!conv.is_array() || conv.size() < 2 || !conv[0].contains("value") ||
        !conv[1].contains("value") || !conv[0]["value"].is_string() ||
        !conv[1]["value"].is_string()) {
      continue;
    }
    Sample s;
    s.prompt.ids = tok.encode(conv[0]["value"].get<std::string>(), true);
    const int n_completion =
        static_cast<int>(tok.encode(conv[1]["value"].get<std::string>(), false).size());
    s.output_len = o.output_len > 0 ? o.output_len : n_completion;
    const int n_prompt = static_cast<int>(s.prompt.ids.size());
    if (n_prompt < 4 || s.output_len < 4 || n_prompt > 1024 || n_prompt + s.output_len > 2048) {
      continue;
    }
    out.push_back(std::move(s));
  }
  if (out.empty()) return invalid_argument(o.dataset_path + ": no usable conversations");
  return out;
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
  lo.max_model_len = o.max_model_len;
  if (lo.max_model_len == 0 && o.dataset_name == "random") {
    lo.max_model_len = o.input_len + (o.output_len > 0 ? o.output_len : kDefaultOutputLen);
  }
  lo.enable_prefix_caching = !o.no_enable_prefix_caching;
  lo.n_threads = o.common.n_threads;
  lo.isa = o.common.isa;
  DS_ASSIGN_OR_RETURN(std::unique_ptr<LLM> llm, LLM::create(path, lo));

  std::vector<Sample> samples;
  if (o.dataset_name == "random") {
    samples = random_dataset(o, llm->vocab_size());
  } else {
    if (llm->tokenizer() == nullptr)
      return invalid_argument("sharegpt needs the model's tokenizer");
    DS_ASSIGN_OR_RETURN(samples, sharegpt_dataset(o, *llm->tokenizer()));
  }
  std::vector<Prompt> prompts;
  std::vector<SamplingOptions> options;
  for (Sample& s : samples) {
    SamplingOptions so;
    so.temperature = 1.0f;
    so.top_p = 1.0f;
    so.ignore_eos = true;
    so.max_tokens = s.output_len;
    prompts.push_back(std::move(s.prompt));
    options.push_back(so);
  }

  const auto t0 = std::chrono::steady_clock::now();
  DS_ASSIGN_OR_RETURN(std::vector<CompletionOutput> outs, llm->generate(prompts, options));
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t n_in = 0, n_out = 0;
  for (const CompletionOutput& c : outs) {
    n_in += static_cast<int64_t>(c.prompt_ids.size());
    n_out += static_cast<int64_t>(c.token_ids.size());
  }
  const EngineStats st = llm->engine().stats();
  const double rps = outs.size() / elapsed;
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", rps,
              (n_in + n_out) / elapsed, n_out / elapsed);
  std::printf("Input tokens/s: %.2f\n", n_in / elapsed);
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
                        {"num_preemptions", st.n_preemptions}};
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
