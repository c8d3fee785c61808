// LlmEngine: the serving loop, in the manner of vLLM v1's EngineCore. One step():
//   schedule  the Scheduler plans which request gets how many tokens (plain data);
//   execute   block copies, then ONE forward pass over the ragged batch of every
//             scheduled token of every request, through the model's paged KV cache;
//   sample    one token for each request whose known tokens are all computed;
//   update    Scheduler::update_from_output applies the step (stop ids, max_tokens).
//
// Speculative decoding (EngineConfig::speculative): after a step, each decoding request
// gets drafts (prompt lookup: spec/ngram_proposer.h), which the next step runs as extra
// query positions of the same forward pass, beside requests without drafts and prefill
// chunks. The SpeculativeSampler verifies them losslessly (the emitted tokens are those
// the request would produce without drafts); rejected positions' keys and values are
// left to be overwritten, and the scheduler hashes no block before its tokens are
// accepted.
// The engine owns the Scheduler (and through it the KvCacheManager), the paged cache,
// the per-request SamplingStates and block tables (the model runner's view of the
// plan), and a BatchSampler. The model and its backend are borrowed.
//
// add_request() validates everything before the request can touch the batch:
// sampling options (SamplingParams::create), token ids, the prompt against
// max_model_len, and whether the request could ever fit in the KV cache.
// Stop strings and detokenisation belong to the caller (IncrementalDecoder +
// StopStringMatcher), which ends a request with finish_request(id, kStop).
//
// Thread-safety: not thread-safe. One thread (the engine thread) owns the engine and
// calls every method; other threads hand it requests through their own queue.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/engine_output.h"
#include "engine/mtp_proposer.h"
#include "grammar/structured_output.h"
#include "model/causal_lm.h"
#include "sampling/sampler.h"
#include "sampling/sampling_params.h"
#include "sampling/sampling_state.h"
#include "sampling/speculative_sampler.h"
#include "sched/scheduler.h"
#include "spec/draft_throttle.h"
#include "spec/speculative_config.h"

namespace dserve {

static_assert(std::is_same_v<RequestId, sched::RequestId>);

struct EngineConfig {
  int max_num_seqs = 256;                      // running requests at most
  int max_num_batched_tokens = 2048;           // scheduled tokens per step at most
  int block_size = 16;                         // tokens per KV block
  int64_t kv_cache_memory = int64_t{1} << 30;  // bytes for the paged KV cache
  // Element type of the paged KV cache: F16 (--kv-cache-dtype auto on the CPU: half the
  // bytes, so twice the tokens in kv_cache_memory and half the attention's memory
  // traffic) or F32. Arithmetic is FP32 either way.
  DType kv_cache_dtype = DType::kF16;
  // Prompt + output tokens at most; 0: the model's max_position_embeddings. The model
  // must have been loaded with a context of at least this many tokens.
  int max_model_len = 0;
  bool enable_prefix_caching = true;
  // Seeds the seeds of requests that bring none (vLLM's --seed); none: random.
  std::optional<uint64_t> seed;
  // End-of-sequence ids besides the model's own (e.g. the tokenizer's stop ids).
  std::vector<int32_t> extra_eos_ids;
  // Speculative decoding (--speculative-config); off by default.
  spec::SpeculativeConfig speculative;
};

class LlmEngine {
 public:
  // Sizes the KV cache from config.kv_cache_memory (logs blocks and tokens) and fails
  // with a suggested value when one max_model_len-long request cannot fit. `model`
  // (and its backend) must outlive the engine. sampling_pool (borrowed, may be null):
  // threads to sample a step's sequences in parallel, normally the backend's own
  // (Backend::host_thread_pool), idle while the engine samples; it must outlive the
  // engine and be used only from the engine thread.
  // tokenizer (borrowed, may be null; must outlive the engine): the model's, needed
  // for structured output (SamplingOptions::structured_outputs).
  static Result<std::unique_ptr<LlmEngine>> create(CausalLm& model, const EngineConfig& config,
                                                   ThreadPool* sampling_pool = nullptr,
                                                   const Tokenizer* tokenizer = nullptr);
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  // Queues a request. InvalidArgument for bad sampling options or token ids, a
  // duplicate id, a prompt too long for max_model_len, or structured output that does
  // not compile (or without a tokenizer); ResourceExhausted when it
  // could never fit in the KV cache. Nothing changes on error.
  // n > 1 (options.n): `fork_ids` names the n - 1 further sequences; each is a request
  // of its own for outputs, finishing and aborting, sharing the prompt's KV blocks once
  // the prompt is computed (computed once). With a seed, sequence j samples with
  // seed + j, as vLLM's parallel sampling does.
  Status add_request(RequestId id, std::vector<int32_t> prompt, const SamplingOptions& options,
                     std::span<const RequestId> fork_ids = {});
  // Cancels a waiting or running request; its blocks return to the pool now.
  Status abort_request(RequestId id) { return finish_request(id, sched::FinishReason::kAbort); }
  // Ends a request (kStop: the caller found a stop string; kAbort: cancelled).
  Status finish_request(RequestId id, sched::FinishReason reason);

  // One schedule -> execute -> sample -> update step. Returns one output per request
  // that got a token or finished. An error (from the model) leaves the engine unusable.
  Result<std::vector<EngineOutput>> step();

  bool has_unfinished_requests() const { return scheduler_->has_unfinished_requests(); }
  // Forward passes step() has run (a step with nothing to compute runs none).
  int64_t n_forward_passes() const { return n_forward_passes_; }
  // The model's part of one forward with no tokens of this engine's own (expert
  // parallelism's dummy batch, DpLockstep); no request or cache changes.
  Status forward_idle() { return model_.forward_idle(); }
  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }
  const sched::Scheduler& scheduler() const { return *scheduler_; }

 private:
  LlmEngine(CausalLm& model, const EngineConfig& config, std::unique_ptr<sched::Scheduler> s,
            std::unique_ptr<PagedCache> cache, ThreadPool* sampling_pool,
            const Tokenizer* tokenizer);

  // The model runner: the plan as one ModelBatch, block tables updated from the plan.
  void build_batch(const sched::SchedulerOutput& plan);
  // Scores the step's prompt-logprob rows into prompt_scores_.
  void score_prompt_rows();
  // Samples (verifying drafts) every request of the plan that reached its last known
  // token. emitted[i] / results[i]: the tokens and their results for plan.requests[i].
  void sample_step(const sched::SchedulerOutput& plan, std::vector<std::vector<int32_t>>& emitted,
                   std::vector<std::vector<SampleResult>>& results);
  // Counts drafts and accepted drafts for the speculative-decoding metrics and the
  // request's throttle.
  void count_acceptance(RequestId id, std::span<const int32_t> drafts,
                        std::span<const int32_t> emitted);
  // The MTP layer's drafts (drafts by plan index) after the step's sampling, before
  // the scheduler applies it.
  Status propose_mtp(const sched::SchedulerOutput& plan,
                     std::span<const std::vector<int32_t>> emitted,
                     std::vector<std::vector<int32_t>>* drafts);
  // Hands each request this step sampled that still runs its drafts for the next step
  // (mtp_drafts by plan index, or prompt lookup's).
  void propose_drafts(const sched::SchedulerOutput& plan,
                      std::vector<std::vector<int32_t>>& mtp_drafts);

  CausalLm& model_;
  const EngineConfig config_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::unique_ptr<PagedCache> cache_;
  SpeculativeSampler sampler_;
  std::vector<int32_t> eos_ids_;
  std::mt19937_64 entropy_;  // seeds of unseeded requests
  const Tokenizer* tokenizer_;
  // Built at the first structured-output request (the vocabulary trie), then reused.
  std::unique_ptr<grammar::StructuredOutputCompiler> structured_;

  std::unordered_map<RequestId, std::unique_ptr<SamplingState>> states_;  // unfinished
  std::unordered_map<RequestId, std::vector<int32_t>> block_tables_;      // as planned so far
  // Requests scoring their prompt, until their first output delivers the scores.
  struct PromptScores {
    std::vector<int32_t> prompt;
    int n_top = 0;
    std::vector<SampleResult> scores;  // [P - 1]: position p + 1 scored by row p
  };
  std::unordered_map<RequestId, PromptScores> prompt_scores_;
  Sampler prompt_scorer_;

  // The step's batch (reused across steps).
  struct Batch {
    std::vector<int32_t> tokens, positions, seq_of_token, block_tables, logits_rows;
    std::vector<int64_t> block_table_offsets;
    std::vector<int32_t> prompt_lens;  // per plan request
    // Per logits row: the prompt position it scores (prompt_logprobs), or -1 for a
    // sampling row; and the request it belongs to.
    std::vector<int32_t> row_prompt_pos;
    std::vector<RequestId> row_request;
    // Per plan request: its first sampling row (then one per draft), or -1; and the
    // index of its first token.
    std::vector<int32_t> first_sample_row, first_token;
  } batch_;
  std::vector<float> logits_;
  int64_t n_computed_tokens_ = 0;
  int64_t n_forward_passes_ = 0;
  int64_t n_generated_tokens_ = 0;
  SpecDecodeStats spec_stats_;
  std::unique_ptr<MtpProposer> mtp_;  // speculative method deepseek_mtp
  spec::DraftThrottle throttle_;
};

}  // namespace dserve
