#include "dserve/llm.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <optional>

#include "backend/backend.h"
#include "backend/backend_registry.h"
#include "backend/cpu/cpu_isa.h"
#include "base/log.h"
#include "base/memory_limit.h"
#include "engine/llm_engine.h"
#include "engine/memory_budget.h"
#include "engine/output_text.h"
#include "loader/model_files.h"
#include "spec/speculative_config.h"
#include "tokenizer/tokenizer.h"

namespace dserve {

// The longest context served: positions and lengths are int32 throughout the engine.
constexpr int64_t kMaxContext = int64_t{1} << 30;

LLM::~LLM() = default;

int64_t LLM::vocab_size() const { return model_->info().vocab_size; }

EngineStats LLM::stats() const { return engine_->stats(); }

std::string LLM::model_stats() const { return model_->stats(); }

Result<std::unique_ptr<LLM>> LLM::create(const std::string& model_path, const LlmOptions& o) {
  std::unique_ptr<LLM> llm(new LLM());
  if (o.fp8_weights != "fp8" && o.fp8_weights != "bf16") {
    return invalid_argument("fp8_weights '" + o.fp8_weights + "': fp8 or bf16");
  }
  DS_ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> files,
                      ModelFiles::open(model_path, o.quantization,
                                       o.fp8_weights == "bf16" ? Fp8Weights::kBf16 : Fp8Weights::kFp8));
  DS_ASSIGN_OR_RETURN(ModelInfo info, read_model_info(*files));
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_model_files(*files);
  if (tok.ok()) {
    llm->tokenizer_ = std::move(tok).value();
  } else {
    DS_LOG_WARN("{}: no tokenizer ({}); only token-id prompts will work", model_path,
                tok.status().message());
  }
  if (o.max_model_len < 0) return invalid_argument("max_model_len must not be negative");
  const int64_t context = o.max_model_len > 0 ? o.max_model_len : info.max_position_embeddings;
  if (!o.isa.empty()) DS_RETURN_IF_ERROR(cpu::check_isa(o.isa));
  // The RoPE tables and the KV cache are sized for `context` at load: a model file's
  // context_length (up to 2^32 - 1) must say so rather than overflow or fail to allocate.
  const std::string context_source =
      o.max_model_len > 0 ? "--max-model-len" : "the model's context length (context_length / "
                                                "max_position_embeddings)";
  if (context > kMaxContext) {
    return invalid_argument(context_source + " is " + std::to_string(context) +
                            " tokens, more than the " + std::to_string(kMaxContext) +
                            " dserve can serve; pass a smaller --max-model-len");
  }
  BackendOptions backend;
  backend.device = o.device;
  backend.cpu.n_threads = o.n_threads;
  backend.cpu.isa = o.isa;
  DS_ASSIGN_OR_RETURN(llm->backend_, make_backend(backend));
  const int64_t weight_bytes = static_cast<int64_t>(files->total_tensor_bytes());
  const MemoryLimit limit = read_memory_limit();
  // With load_model this process may hold a share of the weights (one tensor-parallel
  // rank): only the memory it holds after loading can be counted.
  if (!o.load_model && weight_bytes > limit.bytes) {
    return Status(StatusCode::kResourceExhausted,
                  model_path + ": the weights (" + std::to_string(weight_bytes >> 20) +
                      " MiB) do not fit the memory limit of " + std::to_string(limit.bytes >> 20) +
                      " MiB (" + limit.source + ")");
  }
  Result<std::unique_ptr<CausalLm>> model = [&]() -> Result<std::unique_ptr<CausalLm>> {
    try {
      return o.load_model ? o.load_model(std::move(files), *llm->backend_, context)
                          : load_causal_lm(std::move(files), *llm->backend_, context);
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::kResourceExhausted,
                    "the tables sized by " + context_source + " of " + std::to_string(context) +
                        " tokens do not fit in memory; pass a smaller --max-model-len");
    }
  }();
  if (!model.ok()) return model.status();
  llm->model_ = std::move(model).value();
  // The backend's prepared copies (the CPU's packed panels) are memory on top of the
  // loaded weights; the mapped originals stay mapped too, except those the model
  // released (routed experts' packed copies replace them).
  const int64_t prepared_bytes = llm->backend_->prepared_weight_bytes();
  const int64_t released_bytes = llm->model_->released_weight_bytes();

  // The KV cache is sized within the process's memory limit (a container's cgroup
  // limit, else physical memory), so a limit too small fails here, not in an OOM kill.
  MemoryBudgetInput budget_in;
  budget_in.gpu_memory_utilization = o.gpu_memory_utilization;
  budget_in.kv_cache_memory = o.kv_cache_memory;
  if (const std::optional<Backend::DeviceMemory> device = llm->backend_->device_memory()) {
    // The KV pool lives in the device's memory: what the device holds now (context,
    // weights copied at load), plus the weights still to be copied on first use.
    budget_in.limit = MemoryLimit{device->total, device->description + " memory"};
    budget_in.weight_bytes =
        (device->total - device->free) + std::max<int64_t>(0, weight_bytes - device->weight_bytes);
  } else {
    budget_in.limit = limit;
    budget_in.weight_bytes = o.load_model ? std::max(resident_memory_bytes(), prepared_bytes)
                                           : weight_bytes - released_bytes + prepared_bytes;
    budget_in.prepared_bytes = prepared_bytes;
    budget_in.released_bytes = released_bytes;
    budget_in.resident_bytes = resident_memory_bytes();
  }
  budget_in.buffer_bytes = working_buffer_bytes(o.max_num_seqs, llm->model_->info().vocab_size,
                                                o.max_num_batched_tokens);
  DS_ASSIGN_OR_RETURN(KvCacheBudget budget, kv_cache_budget(budget_in));
  DS_LOG_INFO("memory: {}", budget.explanation);
  const int64_t kv_cache_memory = budget.bytes;

  EngineConfig ec;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.block_size = o.block_size;
  ec.kv_cache_memory = kv_cache_memory;
  ec.kv_cache_dtype = o.kv_cache_dtype;
  ec.max_model_len = static_cast<int>(context);
  ec.enable_prefix_caching = o.enable_prefix_caching;
  ec.seed = o.seed;
  if (!o.speculative_config.empty()) {
    DS_ASSIGN_OR_RETURN(ec.speculative, spec::SpeculativeConfig::parse(o.speculative_config));
  }
  if (llm->tokenizer_) ec.extra_eos_ids = llm->tokenizer_->stop_ids();
  DS_ASSIGN_OR_RETURN(llm->engine_,
                      LlmEngine::create(*llm->model_, ec, llm->backend_->host_thread_pool(),
                                        llm->tokenizer_.get()));
  return llm;
}

Result<std::vector<CompletionOutput>> LLM::generate(const std::vector<std::string>& prompts,
                                                    const SamplingOptions& options) {
  std::vector<Prompt> p(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) p[i].text = prompts[i];
  return generate(p, options);
}

Result<std::vector<CompletionOutput>> LLM::generate(
    const std::vector<std::vector<int32_t>>& prompts, const SamplingOptions& options) {
  std::vector<Prompt> p(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) p[i].ids = prompts[i];
  return generate(p, options);
}

Result<std::vector<CompletionOutput>> LLM::generate(const std::vector<Prompt>& prompts,
                                                    const SamplingOptions& options) {
  return generate(prompts, std::vector<SamplingOptions>(prompts.size(), options));
}

Result<std::vector<CompletionOutput>> LLM::generate(const std::vector<Prompt>& prompts,
                                                    const std::vector<SamplingOptions>& options) {
  if (options.size() != prompts.size()) {
    return invalid_argument("generate: " + std::to_string(prompts.size()) + " prompts but " +
                            std::to_string(options.size()) + " sampling options");
  }
  std::vector<SamplingParams> params;
  for (size_t i = 0; i < options.size(); ++i) {
    Result<SamplingParams> p = SamplingParams::create(options[i]);
    if (!p.ok())
      return Status(p.status().code(), "prompt " + std::to_string(i) + ": " + p.status().message());
    if (!p->stop().empty() && !tokenizer_) {
      return invalid_argument("stop strings need the model's tokenizer");
    }
    params.push_back(std::move(p).value());
  }
  // Per request: where its output goes and, with a tokenizer, its text.
  struct Pending {
    size_t index = 0;
    std::unique_ptr<OutputText> text;
  };
  // Output i * n + j is choice j of prompt i.
  size_t n_outputs = 0;
  for (const SamplingParams& p : params) n_outputs += static_cast<size_t>(p.n());
  std::vector<std::vector<int32_t>> prompt_ids(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!prompts[i].ids.empty()) {
      prompt_ids[i] = prompts[i].ids;
    } else {
      if (!tokenizer_) return invalid_argument("text prompts need the model's tokenizer");
      prompt_ids[i] = tokenizer_->encode(prompts[i].text, /*add_special_tokens=*/true);
      if (prompt_ids[i].empty()) {
        return invalid_argument("prompt " + std::to_string(i) + " encodes to no tokens");
      }
    }
  }
  std::vector<CompletionOutput> outs(n_outputs);
  std::unordered_map<RequestId, Pending> pending;
  auto abort_all = [&] {
    for (auto& [id, p] : pending) (void)engine_->abort_request(id);
  };
  size_t first_output = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int n = params[i].n();
    std::vector<RequestId> ids;
    for (int j = 0; j < n; ++j) ids.push_back(next_id_++);
    Status s = engine_->add_request(ids[0], prompt_ids[i], options[i],
                                    std::span<const RequestId>(ids).subspan(1));
    if (!s.ok()) {
      abort_all();
      return Status(s.code(), "prompt " + std::to_string(i) + ": " + s.message());
    }
    for (int j = 0; j < n; ++j) {
      Pending p;
      p.index = first_output + static_cast<size_t>(j);
      outs[p.index].prompt_ids = prompt_ids[i];
      if (tokenizer_) p.text = std::make_unique<OutputText>(*tokenizer_, options[i]);
      pending.emplace(ids[j], std::move(p));
    }
    first_output += static_cast<size_t>(n);
  }

  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  std::optional<Clock::time_point> decode_start;
  int64_t n_tokens = 0, tokens_at_decode_start = 0;
  size_t n_started = 0;  // sequences with a token
  while (!pending.empty()) {
    Result<std::vector<EngineOutput>> step = engine_->step();
    if (!step.ok()) {
      abort_all();
      return step.status();
    }
    for (const EngineOutput& e : *step) {
      auto it = pending.find(e.id);
      if (it == pending.end() || e.new_token_ids.empty()) continue;
      n_tokens += static_cast<int64_t>(e.new_token_ids.size());
      if (outs[it->second.index].token_ids.empty()) ++n_started;
    }
    if (!decode_start && n_started == outs.size()) {
      decode_start = Clock::now();
      tokens_at_decode_start = n_tokens;
    }
    for (EngineOutput& e : *step) {
      auto it = pending.find(e.id);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      CompletionOutput& out = outs[p.index];
      // Tokens after one that completes a stop string are dropped (a step that
      // verified drafts can emit several), as if the request had ended there.
      bool stopped = false;
      size_t n_kept = 0;
      for (; n_kept < e.new_token_ids.size() && !stopped; ++n_kept) {
        out.token_ids.push_back(e.new_token_ids[n_kept]);
        const bool stop_token = e.ends_with_stop_token && n_kept + 1 == e.new_token_ids.size();
        if (p.text) out.text += p.text->add(e.new_token_ids[n_kept], &stopped, stop_token);
      }
      for (size_t k = 0; k < e.logprobs.size() && k < n_kept; ++k)
        out.logprobs.push_back(std::move(e.logprobs[k]));
      std::optional<sched::FinishReason> reason = e.finish_reason;
      if (n_kept < e.new_token_ids.size()) reason.reset();  // cut short by a stop string
      if (stopped && !reason) {
        if (!e.finish_reason) {
          DS_RETURN_IF_ERROR(engine_->finish_request(e.id, sched::FinishReason::kStop));
        }
        reason = sched::FinishReason::kStop;
      }
      if (!reason) continue;
      if (p.text) out.text += p.text->finish();
      out.finish_reason = sched::finish_reason_name(*reason);
      pending.erase(it);
    }
  }
  const Clock::time_point end = Clock::now();
  last_timing_.seconds = std::chrono::duration<double>(end - t0).count();
  last_timing_.decode_seconds =
      decode_start ? std::chrono::duration<double>(end - *decode_start).count() : 0.0;
  last_timing_.decode_tokens = decode_start ? n_tokens - tokens_at_decode_start : 0;
  return outs;
}

}  // namespace dserve
