#include "dserve/llm.h"

#include <optional>

#include "backend/backend.h"
#include "base/log.h"
#include "loader/model_files.h"
#include "sampling/stop_string_matcher.h"
#include "tokenizer/tokenizer.h"

namespace dserve {

LLM::~LLM() = default;

int64_t LLM::vocab_size() const { return model_->info().vocab_size; }

Result<std::unique_ptr<LLM>> LLM::create(const std::string& model_path, const LlmOptions& o) {
  std::unique_ptr<LLM> llm(new LLM());
  DS_ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> files, ModelFiles::open(model_path));
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
  CpuBackendOptions cpu;
  cpu.n_threads = o.n_threads;
  cpu.isa = o.isa;
  llm->backend_ = make_cpu_backend(cpu);
  DS_ASSIGN_OR_RETURN(llm->model_, load_causal_lm(std::move(files), *llm->backend_, context));

  EngineConfig ec;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.block_size = o.block_size;
  ec.kv_cache_memory = o.kv_cache_memory;
  ec.max_model_len = static_cast<int>(context);
  ec.enable_prefix_caching = o.enable_prefix_caching;
  if (llm->tokenizer_) ec.extra_eos_ids = llm->tokenizer_->stop_ids();
  DS_ASSIGN_OR_RETURN(llm->engine_, LlmEngine::create(*llm->model_, ec));
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
  // Per request: the output so far and, with a tokenizer, its detokenizer and stop matcher.
  struct Pending {
    size_t index = 0;
    std::unique_ptr<IncrementalDecoder> decoder;
    std::unique_ptr<StopStringMatcher> stops;
  };
  std::vector<CompletionOutput> outs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!prompts[i].ids.empty()) {
      outs[i].prompt_ids = prompts[i].ids;
    } else {
      if (!tokenizer_) return invalid_argument("text prompts need the model's tokenizer");
      outs[i].prompt_ids = tokenizer_->encode(prompts[i].text, /*add_special_tokens=*/true);
      if (outs[i].prompt_ids.empty()) {
        return invalid_argument("prompt " + std::to_string(i) + " encodes to no tokens");
      }
    }
  }
  std::unordered_map<RequestId, Pending> pending;
  auto abort_all = [&] {
    for (auto& [id, p] : pending) (void)engine_->abort_request(id);
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestId id = next_id_++;
    Status s = engine_->add_request(id, outs[i].prompt_ids, options[i]);
    if (!s.ok()) {
      abort_all();
      return Status(s.code(), "prompt " + std::to_string(i) + ": " + s.message());
    }
    Pending p;
    p.index = i;
    if (tokenizer_) {
      p.decoder = std::make_unique<IncrementalDecoder>(*tokenizer_);
      p.stops = std::make_unique<StopStringMatcher>(params[i].stop(),
                                                    params[i].include_stop_str_in_output());
    }
    pending.emplace(id, std::move(p));
  }

  while (!pending.empty()) {
    Result<std::vector<EngineOutput>> step = engine_->step();
    if (!step.ok()) {
      abort_all();
      return step.status();
    }
    for (EngineOutput& e : *step) {
      auto it = pending.find(e.id);
      if (it == pending.end()) continue;
      Pending& p = it->second;
      CompletionOutput& out = outs[p.index];
      bool stopped = false;
      for (size_t k = 0; k < e.new_token_ids.size(); ++k) {
        out.token_ids.push_back(e.new_token_ids[k]);
        if (p.decoder) {
          const StopStringMatcher::Output so = p.stops->add(p.decoder->add(e.new_token_ids[k]));
          out.text += so.text;
          stopped = stopped || so.stopped;
        }
      }
      for (SampleResult& r : e.logprobs) out.logprobs.push_back(std::move(r));
      std::optional<sched::FinishReason> reason = e.finish_reason;
      if (stopped && !reason) {
        DS_RETURN_IF_ERROR(engine_->finish_request(e.id, sched::FinishReason::kStop));
        reason = sched::FinishReason::kStop;
      }
      if (!reason) continue;
      if (p.decoder && !stopped) {
        const StopStringMatcher::Output so = p.stops->add(p.decoder->flush());
        out.text += so.text;
        if (!so.stopped) out.text += p.stops->flush();
      }
      out.finish_reason = sched::finish_reason_name(*reason);
      pending.erase(it);
    }
  }
  return outs;
}

}  // namespace dserve
