// MtpProposer: speculative decoding's drafts from DeepSeek's multi-token-prediction
// layer (vLLM's deepseek_mtp), run right after a step's target forward and sampling.
//
// The MTP layer at position p reads the token at p + 1 and the main model's hidden
// state at p, and predicts the token at p + 2. After each step it runs once over every
// position of the step whose next token is now known (a prefill chunk's positions; a
// decode's last known position and its accepted drafts, the next token being the one
// the step emitted), which also keeps its own cache layer filled; its logits at each
// decoding request's last such position give the first draft (greedy, as vLLM's). For
// N > 1 drafts it runs N - 1 more times, one token per request, on its own output
// hidden state and the draft before, as vLLM runs the one layer N times. A chained
// position needs a cache slot: the chain stops where the request's block table ends
// (the scheduler allocates the drafts' slots plus N - 1 ahead) or max_model_len does.
// Draft quality never changes an answer (verification is lossless); it changes only
// how many drafts are accepted.
//
// Thread-safety: as the engine (its thread only).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/causal_lm.h"
#include "sched/scheduler_output.h"

namespace dserve {

// The step as the engine ran it: its ModelBatch arrays and, per plan request, the
// index of its first token in them.
struct StepView {
  std::span<const int32_t> tokens, positions, seq_of_token, block_tables;
  std::span<const int64_t> block_table_offsets;
  std::span<const int32_t> first_token;  // [plan.requests.size()]
};

class MtpProposer {
 public:
  MtpProposer(CausalLm& model, int n_drafts, int block_size, int max_model_len);

  // emitted[i]: the tokens the step produced for plan.requests[i] (empty unless it
  // sampled); next_prompt_token[i]: for a prefill chunk that does not reach the
  // prompt's end, the prompt token after the chunk (else unused). Fills drafts[i] for
  // every request that sampled (possibly empty).
  Status propose(const sched::SchedulerOutput& plan, const StepView& step,
                 std::span<const std::vector<int32_t>> emitted,
                 std::span<const int32_t> next_prompt_token, PagedCache& cache,
                 std::vector<std::vector<int32_t>>* drafts);

 private:
  // Argmax of each row of logits_ [rows, vocab].
  void argmax_rows(size_t n_rows, std::vector<int32_t>* out) const;

  CausalLm& model_;
  const int n_drafts_, block_size_, max_model_len_;
  // The passes' inputs (reused).
  std::vector<int32_t> tokens_, positions_, seq_, rows_, logits_rows_, tables_;
  std::vector<int64_t> offsets_;
  std::vector<float> logits_;
};

}  // namespace dserve
