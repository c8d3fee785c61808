// engine_tool: test-only driver of the serving engine for tests/reference/test_engine.py
// and test_speculative.py. Reads requests (JSON: [{"prompt": [ids], "max_tokens": n},
// ...]) and runs them with ignore_eos, greedily unless a request gives "temperature"
// (and "seed", "top_p", "top_k"), printing JSON {"outputs": [[ids], ...],
// "stats": {...}} on stdout. --speculative-config JSON turns on speculative decoding.
//
//   --mode batch       all requests added at once to one LlmEngine (continuous batching)
//   --mode sequential  one request after another through one LlmEngine (prefix caching);
//                      "per_request_stats" holds the counters after each request
//   --mode solo        each request alone through CausalLm::forward with a contiguous
//                      KV cache, as `dserve generate` runs it (the oracle); "margins"
//                      holds, per request and output token, the gap between the two
//                      best logits
// --kv-cache-dtype auto / float16 (the default) or float32 sets the engine's paged KV
// cache (solo mode always uses the float32 contiguous cache).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "backend/backend.h"
#include "base/log.h"
#include "engine/llm_engine.h"
#include "loader/model_files.h"
#include "model/causal_lm.h"
#include "sampling/sampler.h"

namespace dserve {
namespace {

struct Req {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  SamplingOptions options;
};

nlohmann::json stats_json(const EngineStats& s) {
  return {{"n_steps", s.n_steps},
          {"n_preemptions", s.n_preemptions},
          {"n_prefix_queried_tokens", s.n_prefix_queried_tokens},
          {"n_prefix_hit_tokens", s.n_prefix_hit_tokens},
          {"n_computed_tokens", s.n_computed_tokens},
          {"n_generated_tokens", s.n_generated_tokens},
          {"n_blocks", s.n_blocks},
          {"n_free_blocks", s.n_free_blocks},
          {"n_running", s.n_running},
          {"n_waiting", s.n_waiting},
          {"spec_n_drafts", s.spec.n_drafts},
          {"spec_n_draft_tokens", s.spec.n_draft_tokens},
          {"spec_n_accepted_tokens", s.spec.n_accepted_tokens},
          {"spec_n_accepted_per_pos", s.spec.n_accepted_per_pos}};
}

SamplingOptions greedy(int max_tokens) {
  SamplingOptions o;
  o.temperature = 0.0f;
  o.ignore_eos = true;
  o.max_tokens = max_tokens;
  return o;
}

// The gap between the two largest logits: where it is tiny, a last-bit difference in
// the arithmetic may legitimately pick the other token.
float top2_margin(const std::vector<float>& logits) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : logits) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return a - b;
}

Result<std::vector<int32_t>> run_solo(CausalLm& model, const Req& r, std::vector<float>* margins) {
  DS_ASSIGN_OR_RETURN(SamplingParams params, SamplingParams::create(greedy(r.max_tokens)));
  SamplingState state(params, r.prompt, {});
  Sampler sampler;
  std::unique_ptr<SequenceCache> kv = model.new_cache();
  std::vector<int32_t> positions(r.prompt.size());
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<float> logits;
  DS_RETURN_IF_ERROR(model.forward(r.prompt, positions, *kv, LogitsFor::kLast, &logits));
  std::vector<int32_t> out;
  while (true) {
    margins->push_back(top2_margin(logits));
    const int32_t next = sampler.sample(state, logits).token;
    const auto finish = state.accept(next);
    out.push_back(next);
    if (finish) break;
    const int32_t pos = static_cast<int32_t>(kv->n_tokens());
    DS_RETURN_IF_ERROR(model.forward({&next, 1}, {&pos, 1}, *kv, LogitsFor::kLast, &logits));
  }
  return out;
}

// Runs requests [first, last) in one engine until they finish; outputs by index.
Status run_engine(LlmEngine& engine, const std::vector<Req>& reqs, size_t first, size_t last,
                  std::vector<std::vector<int32_t>>* outputs) {
  for (size_t i = first; i < last; ++i) {
    DS_RETURN_IF_ERROR(engine.add_request(i, reqs[i].prompt, reqs[i].options));
  }
  while (engine.has_unfinished_requests()) {
    DS_ASSIGN_OR_RETURN(std::vector<EngineOutput> outs, engine.step());
    for (const EngineOutput& o : outs) {
      auto& v = (*outputs)[o.id];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  }
  return Status::Ok();
}

int main_impl(int argc, char** argv) {
  CLI::App app{"engine_tool"};
  std::string model_path, requests_path, mode = "batch";
  EngineConfig ec;
  int n_blocks = 0, n_threads = 0;
  bool no_prefix = false;
  app.add_option("--model", model_path)->required();
  app.add_option("--requests", requests_path)->required();
  app.add_option("--mode", mode)->check(CLI::IsMember({"batch", "sequential", "solo"}));
  app.add_option("--max-num-seqs", ec.max_num_seqs);
  app.add_option("--max-num-batched-tokens", ec.max_num_batched_tokens);
  app.add_option("--block-size", ec.block_size);
  app.add_option("--kv-cache-memory", ec.kv_cache_memory);
  app.add_option("--num-blocks", n_blocks, "KV blocks (instead of --kv-cache-memory)");
  app.add_option("--max-model-len", ec.max_model_len);
  app.add_option("--threads", n_threads);
  app.add_flag("--no-enable-prefix-caching", no_prefix);
  std::string speculative;
  app.add_option("--speculative-config", speculative, "vLLM's JSON, e.g. {\"method\": \"ngram\", ...}");
  std::string kv_dtype = "auto";
  app.add_option("--kv-cache-dtype", kv_dtype, "auto (float16), float16 or float32")
      ->check(CLI::IsMember({"auto", "float16", "float32", "fp8"}));
  CLI11_PARSE(app, argc, argv);
  ec.enable_prefix_caching = !no_prefix;
  ec.kv_cache_dtype = kv_dtype == "float32" ? DType::kF32
                      : kv_dtype == "fp8"   ? DType::kF8_E4M3
                                            : DType::kF16;
  set_log_level("warning");

  std::vector<Req> reqs;
  {
    std::ifstream f(requests_path);
    const nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& r : j) {
      Req q{r.at("prompt").get<std::vector<int32_t>>(), r.at("max_tokens").get<int>(), {}};
      q.options = greedy(q.max_tokens);
      if (r.contains("temperature")) q.options.temperature = r.at("temperature").get<float>();
      if (r.contains("seed")) q.options.seed = r.at("seed").get<uint64_t>();
      if (r.contains("top_p")) q.options.top_p = r.at("top_p").get<float>();
      if (r.contains("top_k")) q.options.top_k = r.at("top_k").get<int>();
      reqs.push_back(std::move(q));
    }
  }
  Status status;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "engine_tool: error: %s\n", s.message().c_str());
    return 1;
  };
  Result<std::unique_ptr<ModelFiles>> files = ModelFiles::open(model_path);
  if (!files.ok()) return fail(files.status());
  if (!speculative.empty()) {
    Result<spec::SpeculativeConfig> sc = spec::SpeculativeConfig::parse(speculative);
    if (!sc.ok()) return fail(sc.status());
    ec.speculative = *sc;
  }
  CpuBackendOptions bo;
  bo.n_threads = n_threads;
  std::unique_ptr<Backend> backend = make_cpu_backend(bo);
  int64_t context = ec.max_model_len;
  if (context == 0) {
    for (const Req& r : reqs) context = std::max<int64_t>(context, r.prompt.size() + r.max_tokens);
    ec.max_model_len = static_cast<int>(context);
  }
  Result<std::unique_ptr<CausalLm>> model = load_causal_lm(std::move(*files), *backend, context);
  if (!model.ok()) return fail(model.status());

  nlohmann::json result;
  std::vector<std::vector<int32_t>> outputs(reqs.size());
  if (mode == "solo") {
    std::vector<std::vector<float>> margins(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      Result<std::vector<int32_t>> o = run_solo(**model, reqs[i], &margins[i]);
      if (!o.ok()) return fail(o.status());
      outputs[i] = *o;
    }
    result["margins"] = margins;
  } else {
    if (ec.speculative.method == spec::SpeculativeMethod::kMtp) {
      // The MTP layer's cache counts in the bytes per token (the engine would enable
      // it too, after --num-blocks became bytes).
      if (Status s = (*model)->enable_mtp(); !s.ok()) return fail(s);
    }
    if (n_blocks > 0) {
      ec.kv_cache_memory = int64_t{n_blocks} * ec.block_size *
                           static_cast<int64_t>((*model)->paged_bytes_per_token(ec.kv_cache_dtype));
    }
    Result<std::unique_ptr<LlmEngine>> engine =
        LlmEngine::create(**model, ec, backend->host_thread_pool());
    if (!engine.ok()) return fail(engine.status());
    if (mode == "batch") {
      status = run_engine(**engine, reqs, 0, reqs.size(), &outputs);
      if (!status.ok()) return fail(status);
    } else {
      result["per_request_stats"] = nlohmann::json::array();
      for (size_t i = 0; i < reqs.size(); ++i) {
        status = run_engine(**engine, reqs, i, i + 1, &outputs);
        if (!status.ok()) return fail(status);
        result["per_request_stats"].push_back(stats_json((*engine)->stats()));
      }
    }
    result["stats"] = stats_json((*engine)->stats());
  }
  result["outputs"] = outputs;
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace dserve

int main(int argc, char** argv) { return dserve::main_impl(argc, argv); }
