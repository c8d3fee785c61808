#include "engine/llm_engine.h"

#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/log.h"
#include "spec/ngram_proposer.h"

namespace dserve {

Result<std::unique_ptr<LlmEngine>> LlmEngine::create(CausalLm& model,
                                                     const EngineConfig& config_in,
                                                     ThreadPool* sampling_pool,
                                                     const Tokenizer* tokenizer) {
  EngineConfig config = config_in;
  const ModelInfo& info = model.info();
  if (config.max_model_len == 0) {
    config.max_model_len =
        static_cast<int>(std::min<int64_t>(info.max_position_embeddings, 1 << 30));
  }
  if (config.max_model_len < 2) {
    return invalid_argument("max_model_len must be >= 2, got " +
                            std::to_string(config.max_model_len));
  }
  if (config.max_model_len > info.max_position_embeddings) {
    return invalid_argument("max_model_len " + std::to_string(config.max_model_len) +
                            " exceeds the model's context of " +
                            std::to_string(info.max_position_embeddings));
  }
  if (config.block_size < 1) {
    return invalid_argument("block_size must be >= 1, got " + std::to_string(config.block_size));
  }
  if (!is_kv_cache_dtype(config.kv_cache_dtype)) {
    return invalid_argument("kv_cache_dtype " + std::string(dtype_name(config.kv_cache_dtype)) +
                            " is not supported: use f32, f16 or f8_e4m3");
  }
  if (config.speculative.method == spec::SpeculativeMethod::kMtp) {
    if (!model.has_mtp_layer()) {
      return invalid_argument("--speculative-config: method deepseek_mtp needs a model with a "
                              "multi-token-prediction layer; " + info.architecture +
                              " as loaded has none");
    }
    DS_RETURN_IF_ERROR(model.enable_mtp());  // before the cache is sized: one more layer
  }
  const size_t bytes_per_token = model.paged_bytes_per_token(config.kv_cache_dtype);
  if (bytes_per_token == 0) {
    return unimplemented(info.architecture +
                         ": the serving engine needs a paged KV cache, "
                         "which this architecture does not have yet");
  }
  const int64_t bytes_per_block =
      int64_t{config.block_size} * static_cast<int64_t>(bytes_per_token);
  const int64_t n_blocks64 = config.kv_cache_memory / bytes_per_block;
  // One request of max_model_len keeps max_model_len - 1 tokens in the cache.
  const int64_t need_blocks =
      (int64_t{config.max_model_len} - 1 + config.block_size - 1) / config.block_size;
  if (n_blocks64 < need_blocks) {
    const int64_t fits = n_blocks64 * config.block_size + 1;
    return Status(
        StatusCode::kResourceExhausted,
        "kv_cache_memory " + std::to_string(config.kv_cache_memory) + " bytes holds " +
            std::to_string(n_blocks64) + " blocks of " + std::to_string(config.block_size) +
            " tokens (" + std::to_string(bytes_per_token) + " bytes/token), but max_model_len " +
            std::to_string(config.max_model_len) + " needs " + std::to_string(need_blocks) +
            " blocks: use --kv-cache-memory " + std::to_string(need_blocks * bytes_per_block) +
            " or more" +
            (fits >= 2 ? ", or --max-model-len " + std::to_string(fits) + " or less" : ""));
  }
  const int n_blocks =
      static_cast<int>(std::min<int64_t>(n_blocks64, INT32_MAX / config.block_size));

  sched::SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_num_seqs = config.max_num_seqs;
  sc.max_model_len = config.max_model_len;
  if (config.speculative.method == spec::SpeculativeMethod::kMtp) {
    sc.lookahead_slots = config.speculative.num_speculative_tokens - 1;  // the chain's slots
  }
  kvcache::KvCacheConfig kc;
  kc.n_blocks = n_blocks;
  kc.block_size = config.block_size;
  kc.enable_prefix_caching = config.enable_prefix_caching;
  kc.extra_key = kvcache::hash_string(info.architecture);
  DS_ASSIGN_OR_RETURN(std::unique_ptr<sched::Scheduler> scheduler,
                      sched::Scheduler::create(sc, kc));
  DS_ASSIGN_OR_RETURN(std::unique_ptr<PagedCache> cache,
                      model.new_paged_cache(n_blocks, config.block_size, config.kv_cache_dtype));
  DS_LOG_INFO(
      "KV cache: {} blocks of {} tokens = {} tokens, {:.1f} MiB ({} bytes/token, {}); "
      "max_model_len {}, max_num_seqs {}, max_num_batched_tokens {}, prefix caching {}",
      n_blocks, config.block_size, int64_t{n_blocks} * config.block_size,
      cache->total_bytes() / (1024.0 * 1024.0), bytes_per_token,
      dtype_name(config.kv_cache_dtype), config.max_model_len,
      config.max_num_seqs, config.max_num_batched_tokens,
      config.enable_prefix_caching ? "on" : "off");
  if (config.speculative.enabled()) {
    DS_LOG_INFO("speculative decoding: {}, {} draft tokens per step{}",
                config.speculative.method_name(), config.speculative.num_speculative_tokens,
                config.speculative.method == spec::SpeculativeMethod::kNgram
                    ? fmt::format(", prompt lookup {}-{} tokens",
                                  config.speculative.prompt_lookup_min,
                                  config.speculative.prompt_lookup_max)
                    : std::string());
  }
  return std::unique_ptr<LlmEngine>(
      new LlmEngine(model, config, std::move(scheduler), std::move(cache), sampling_pool,
                    tokenizer));
}

LlmEngine::LlmEngine(CausalLm& model, const EngineConfig& config,
                     std::unique_ptr<sched::Scheduler> s, std::unique_ptr<PagedCache> cache,
                     ThreadPool* sampling_pool, const Tokenizer* tokenizer)
    : model_(model),
      config_(config),
      scheduler_(std::move(s)),
      cache_(std::move(cache)),
      sampler_(sampling_pool),
      entropy_(config.seed ? *config.seed : std::random_device{}()),
      tokenizer_(tokenizer) {
  eos_ids_ = model.info().eos_ids;
  if (config.speculative.method == spec::SpeculativeMethod::kMtp) {
    mtp_ = std::make_unique<MtpProposer>(model, config.speculative.num_speculative_tokens,
                                         config.block_size, config.max_model_len);
  }
  for (int32_t id : config.extra_eos_ids) {
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  }
}

Status LlmEngine::add_request(RequestId id, std::vector<int32_t> prompt,
                              const SamplingOptions& options,
                              std::span<const RequestId> fork_ids) {
  const std::string who = "request " + std::to_string(id) + ": ";
  DS_ASSIGN_OR_RETURN(SamplingParams params, SamplingParams::create(options));
  if (static_cast<size_t>(params.n()) != 1 + fork_ids.size()) {
    return invalid_argument(who + "n = " + std::to_string(params.n()) + " needs " +
                            std::to_string(params.n() - 1) + " fork ids, got " +
                            std::to_string(fork_ids.size()));
  }
  const int64_t vocab = model_.info().vocab_size;
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab) {
      return invalid_argument(who + "token id " + std::to_string(t) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  for (const auto& [t, bias] : params.logit_bias()) {
    if (t >= vocab) {
      return invalid_argument(who + "logit_bias token id " + std::to_string(t) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  std::vector<RequestId> ids = {id};
  ids.insert(ids.end(), fork_ids.begin(), fork_ids.end());
  for (size_t j = 0; j < ids.size(); ++j) {
    if (states_.count(ids[j]) != 0 ||
        std::find(ids.begin(), ids.begin() + j, ids[j]) != ids.begin() + j) {
      return invalid_argument("request " + std::to_string(ids[j]) + ": duplicate request id");
    }
  }
  // One sampling state per sequence: sequence j draws with seed + j.
  std::vector<std::unique_ptr<SamplingState>> states;
  for (size_t j = 0; j < ids.size(); ++j) {
    SamplingOptions o = options;
    o.n = 1;
    if (o.seed) o.seed = *o.seed + j;
    DS_ASSIGN_OR_RETURN(SamplingParams pj, SamplingParams::create(o));
    states.push_back(std::make_unique<SamplingState>(pj, prompt, eos_ids_, entropy_()));
    if (options.structured_outputs) {
      if (tokenizer_ == nullptr) {
        return invalid_argument(who + "structured output needs the model's tokenizer");
      }
      if (!structured_) {
        structured_ = std::make_unique<grammar::StructuredOutputCompiler>(
            grammar::TokenVocabulary::from_tokenizer(*tokenizer_,
                                                     static_cast<int32_t>(vocab)));
      }
      Result<std::unique_ptr<grammar::GrammarMatcher>> m =
          structured_->matcher(*options.structured_outputs);
      if (!m.ok()) return invalid_argument(who + m.status().message());
      states.back()->set_constraint(std::move(m).value());
    }
  }
  sched::RequestSpec spec;
  spec.id = id;
  spec.prompt = std::move(prompt);
  spec.max_tokens = params.max_tokens();
  spec.min_tokens = params.min_tokens();
  spec.stop_token_ids.assign(states[0]->stop_ids().begin(), states[0]->stop_ids().end());
  spec.fork_ids.assign(fork_ids.begin(), fork_ids.end());
  spec.skip_prefix_cache = params.prompt_logprobs().has_value();
  std::vector<int32_t> prompt_copy = params.prompt_logprobs() ? spec.prompt : std::vector<int32_t>();
  DS_RETURN_IF_ERROR(scheduler_->add_request(std::move(spec)));
  if (params.prompt_logprobs()) {
    PromptScores ps;
    ps.n_top = *params.prompt_logprobs();
    ps.scores.resize(prompt_copy.size() - 1);
    ps.prompt = std::move(prompt_copy);
    prompt_scores_.emplace(id, std::move(ps));
  }
  for (size_t j = 0; j < ids.size(); ++j) states_.emplace(ids[j], std::move(states[j]));
  return Status::Ok();
}

Status LlmEngine::finish_request(RequestId id, sched::FinishReason reason) {
  DS_RETURN_IF_ERROR(scheduler_->finish_request(id, reason));
  throttle_.forget(id);
  states_.erase(id);
  prompt_scores_.erase(id);
  // Its block table goes when the next plan lists it as finished.
  return Status::Ok();
}

void LlmEngine::build_batch(const sched::SchedulerOutput& plan) {
  for (RequestId id : plan.finished) block_tables_.erase(id);
  for (RequestId id : plan.preempted) block_tables_.erase(id);
  Batch& b = batch_;
  b.tokens.clear();
  b.positions.clear();
  b.seq_of_token.clear();
  b.block_tables.clear();
  b.logits_rows.clear();
  b.row_prompt_pos.clear();
  b.row_request.clear();
  b.first_sample_row.assign(plan.requests.size(), -1);
  b.first_token.assign(plan.requests.size(), 0);
  b.block_table_offsets.assign(1, 0);
  b.prompt_lens.clear();
  for (size_t s = 0; s < plan.requests.size(); ++s) {
    const sched::ScheduledRequest& r = plan.requests[s];
    const sched::Request* req = scheduler_->find(r.id);
    DS_CHECK(req != nullptr);
    b.prompt_lens.push_back(req->n_prompt_tokens);
    std::vector<int32_t>& table = block_tables_[r.id];
    if (r.is_new || r.is_resumed) table.clear();
    table.insert(table.end(), r.new_block_ids.begin(), r.new_block_ids.end());
    b.block_tables.insert(b.block_tables.end(), table.begin(), table.end());
    b.block_table_offsets.push_back(static_cast<int64_t>(b.block_tables.size()));
    b.first_token[s] = static_cast<int32_t>(b.tokens.size());
    auto scoring = prompt_scores_.find(r.id);
    const int n_scored = scoring == prompt_scores_.end()
                             ? 0
                             : static_cast<int>(scoring->second.scores.size());
    auto add_token = [&](int32_t token, int pos) {
      b.tokens.push_back(token);
      b.positions.push_back(pos);
      b.seq_of_token.push_back(static_cast<int32_t>(s));
    };
    for (int i = 0; i < r.n_tokens; ++i) {
      const int pos = r.start_pos + i;
      if (pos < n_scored) {  // this row's logits score the next prompt token
        b.logits_rows.push_back(static_cast<int32_t>(b.tokens.size()));
        b.row_prompt_pos.push_back(pos);
        b.row_request.push_back(r.id);
      }
      add_token(r.token_ids[i], pos);
    }
    if (!r.sample) continue;
    // The last known token's row, then one row after each draft.
    b.first_sample_row[s] = static_cast<int32_t>(b.logits_rows.size());
    for (size_t d = 0; d <= r.draft_token_ids.size(); ++d) {
      if (d > 0) add_token(r.draft_token_ids[d - 1], r.start_pos + r.n_tokens - 1 + static_cast<int>(d));
      b.logits_rows.push_back(static_cast<int32_t>(b.tokens.size()) - 1);
      b.row_prompt_pos.push_back(-1);
      b.row_request.push_back(r.id);
    }
  }
}

void LlmEngine::score_prompt_rows() {
  const int64_t vocab = model_.info().vocab_size;
  for (size_t row = 0; row < batch_.logits_rows.size(); ++row) {
    const int pos = batch_.row_prompt_pos[row];
    if (pos < 0) continue;
    std::span<const float> logits(logits_.data() + row * vocab, static_cast<size_t>(vocab));
    PromptScores& ps = prompt_scores_.at(batch_.row_request[row]);
    ps.scores[pos] = prompt_scorer_.score(logits, ps.prompt[pos + 1], ps.n_top);
  }
}

void LlmEngine::sample_step(const sched::SchedulerOutput& plan,
                            std::vector<std::vector<int32_t>>& emitted,
                            std::vector<std::vector<SampleResult>>& results) {
  std::vector<SamplingState*> states;
  std::vector<int32_t> first_row;
  std::vector<std::span<const int32_t>> drafts;
  std::vector<size_t> plan_index;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    if (!plan.requests[i].sample) continue;
    auto it = states_.find(plan.requests[i].id);
    DS_CHECK_MSG(it != states_.end(), "no sampling state for a planned request");
    states.push_back(it->second.get());
    first_row.push_back(batch_.first_sample_row[i]);
    drafts.push_back(plan.requests[i].draft_token_ids);
    plan_index.push_back(i);
  }
  emitted.assign(plan.requests.size(), {});
  results.assign(plan.requests.size(), {});
  if (states.empty()) return;
  std::vector<std::vector<SampleResult>> out(states.size());
  sampler_.sample(logits_, model_.info().vocab_size, states, first_row, drafts, out);
  for (size_t j = 0; j < out.size(); ++j) {
    std::vector<int32_t>& tokens = emitted[plan_index[j]];
    for (const SampleResult& r : out[j]) tokens.push_back(r.token);
    if (!drafts[j].empty()) count_acceptance(plan.requests[plan_index[j]].id, drafts[j], tokens);
    n_generated_tokens_ += static_cast<int64_t>(tokens.size());
    results[plan_index[j]] = std::move(out[j]);
  }
}

void LlmEngine::count_acceptance(RequestId id, std::span<const int32_t> drafts,
                                 std::span<const int32_t> emitted) {
  size_t accepted = 0;
  while (accepted < drafts.size() && accepted < emitted.size() &&
         emitted[accepted] == drafts[accepted]) {
    ++accepted;
  }
  SpecDecodeStats& s = spec_stats_;
  ++s.n_drafts;
  s.n_draft_tokens += static_cast<int64_t>(drafts.size());
  s.n_accepted_tokens += static_cast<int64_t>(accepted);
  if (s.n_accepted_per_pos.size() < drafts.size()) s.n_accepted_per_pos.resize(drafts.size(), 0);
  for (size_t k = 0; k < accepted; ++k) ++s.n_accepted_per_pos[k];
  throttle_.record(id, static_cast<int>(accepted));
}

Status LlmEngine::propose_mtp(const sched::SchedulerOutput& plan,
                              std::span<const std::vector<int32_t>> emitted,
                              std::vector<std::vector<int32_t>>* drafts) {
  if (!mtp_) return Status::Ok();
  // A prefill chunk short of the prompt's end: the MTP layer's last position there
  // pairs with the next prompt token.
  std::vector<int32_t> next_prompt_token(plan.requests.size(), 0);
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const sched::ScheduledRequest& r = plan.requests[i];
    if (r.sample) continue;
    const sched::Request* req = scheduler_->find(r.id);
    DS_CHECK(req != nullptr && r.start_pos + r.n_tokens < req->n_tokens());
    next_prompt_token[i] = req->tokens()[r.start_pos + r.n_tokens];
  }
  const Batch& b = batch_;
  const StepView view{b.tokens, b.positions, b.seq_of_token, b.block_tables,
                      b.block_table_offsets, b.first_token};
  return mtp_->propose(plan, view, emitted, next_prompt_token, *cache_, drafts);
}

void LlmEngine::propose_drafts(const sched::SchedulerOutput& plan,
                               std::vector<std::vector<int32_t>>& mtp_drafts) {
  const spec::SpeculativeConfig& sc = config_.speculative;
  if (!sc.enabled()) return;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const sched::ScheduledRequest& r = plan.requests[i];
    if (!r.sample) continue;
    const sched::Request* req = scheduler_->find(r.id);
    if (req == nullptr || req->state != sched::RequestState::kRunning) {
      throttle_.forget(r.id);
      continue;
    }
    if (!throttle_.should_draft(r.id)) continue;
    std::vector<int32_t> drafts =
        sc.method == spec::SpeculativeMethod::kMtp
            ? std::move(mtp_drafts[i])
            : spec::propose_ngram(req->tokens(), sc.prompt_lookup_min, sc.prompt_lookup_max,
                                  sc.num_speculative_tokens);
    if (!drafts.empty()) scheduler_->set_draft_tokens(r.id, std::move(drafts));
  }
}

Result<std::vector<EngineOutput>> LlmEngine::step() {
  std::vector<EngineOutput> outputs;
  if (!scheduler_->has_unfinished_requests()) return outputs;

  // 1. schedule
  const sched::SchedulerOutput plan = scheduler_->schedule();

  // 2. execute: block copies before anything is written, then one forward pass.
  for (const kvcache::BlockCopy& c : plan.block_copies)
    cache_->copy_block(c.src, c.dst, c.n_tokens);
  build_batch(plan);
  if (!batch_.tokens.empty()) {
    ModelBatch mb;
    mb.tokens = batch_.tokens;
    mb.positions = batch_.positions;
    mb.seq_of_token = batch_.seq_of_token;
    mb.block_tables = batch_.block_tables;
    mb.block_table_offsets = batch_.block_table_offsets;
    mb.logits_rows = batch_.logits_rows;
    mb.prompt_lens = batch_.prompt_lens;
    ++n_forward_passes_;
    DS_RETURN_IF_ERROR(model_.forward_batch(mb, *cache_, &logits_));
    n_computed_tokens_ += mb.n_tokens();
  }

  // 3. sample: only requests whose known tokens are all computed; drafts verified.
  score_prompt_rows();
  std::vector<std::vector<int32_t>> emitted;
  std::vector<std::vector<SampleResult>> results;
  sample_step(plan, emitted, results);
  std::vector<std::vector<int32_t>> mtp_drafts;
  if (!batch_.tokens.empty()) DS_RETURN_IF_ERROR(propose_mtp(plan, emitted, &mtp_drafts));

  // 4. update: one applied token per RequestOutput, a request's tokens consecutive.
  std::vector<sched::RequestOutput> applied = scheduler_->update_from_output(plan, emitted);
  size_t i = 0;  // plan index of the current request
  for (size_t a = 0; a < applied.size();) {
    const RequestId id = applied[a].id;
    while (i < plan.requests.size() && plan.requests[i].id != id) ++i;
    DS_CHECK(i < plan.requests.size());
    auto it = states_.find(id);
    DS_CHECK(it != states_.end());
    EngineOutput o;
    o.id = id;
    const bool with_logprobs = it->second->params().logprobs().has_value();
    for (size_t k = 0; a < applied.size() && applied[a].id == id; ++a, ++k) {
      // A stop token (eos or one of stop_token_ids) stays in the output with its
      // logprob, as vLLM keeps it: clients that score the last token (lm-eval's
      // loglikelihood) and usage counts depend on it. Only its text is left out, by the
      // detokenising caller.
      o.new_token_ids.push_back(applied[a].token);
      if (with_logprobs) o.logprobs.push_back(std::move(results[i][k]));
      o.finish_reason = applied[a].finish_reason;
    }
    o.ends_with_stop_token = o.finish_reason == sched::FinishReason::kStop;
    if (auto ps = prompt_scores_.find(id); ps != prompt_scores_.end()) {
      o.prompt_logprobs = std::move(ps->second.scores);
      prompt_scores_.erase(ps);
    }
    if (o.finish_reason) states_.erase(it);
    outputs.push_back(std::move(o));
    ++i;
  }
  propose_drafts(plan, mtp_drafts);
  return outputs;
}

EngineStats LlmEngine::stats() const {
  const sched::SchedulerStats s = scheduler_->stats();
  EngineStats e;
  e.n_steps = s.n_steps;
  e.n_preemptions = s.n_preemptions;
  e.n_prefix_queried_tokens = s.kv.n_queried_tokens;
  e.n_prefix_hit_tokens = s.kv.n_hit_tokens;
  e.n_computed_tokens = n_computed_tokens_;
  e.n_generated_tokens = n_generated_tokens_;
  e.n_running = s.n_running;
  e.n_waiting = s.n_waiting;
  e.n_blocks = s.kv.n_blocks;
  e.n_free_blocks = s.kv.n_free_blocks;
  e.spec = spec_stats_;
  return e;
}

}  // namespace dserve
