// SamplingState: what one sequence carries from step to step for sampling: its
// validated parameters, the prompt's distinct tokens (repetition penalty), counts of
// its output tokens (all three penalties), the number of tokens generated so far (the
// RNG counter and min_tokens / max_tokens), and its effective seed.
//
// Sampling reads a state (const); only accept() changes it, once per generated
// token. Memory is O(distinct prompt tokens + distinct output tokens), never O(vocab).
//
// Thread-safety: not thread-safe to mutate; concurrent const use (sampling many
// states on a thread pool) is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "sampling/sampling_params.h"
#include "sampling/token_constraint.h"

namespace dserve {

enum class FinishReason {
  kStop,    // an end-of-sequence id or one of stop_token_ids (or a stop string, by the caller)
  kLength,  // max_tokens reached
};

class SamplingState {
 public:
  // prompt: the request's prompt ids. eos_ids: the model's end-of-sequence ids (ignored
  // when params.ignore_eos()). unseeded_seed: the seed used when params.seed() is
  // unset (the engine draws it from its entropy source). sample_index: which of the
  // params.n() sequences this is, so that siblings with one seed differ.
  SamplingState(SamplingParams params, std::span<const int32_t> prompt,
                std::span<const int32_t> eos_ids, uint64_t unseeded_seed = 0, int sample_index = 0);
  SamplingState(const SamplingState&) = delete;
  SamplingState& operator=(const SamplingState&) = delete;
  SamplingState(SamplingState&&) = default;

  // Records a generated token and says whether the sequence ends with it, in vLLM's
  // order: nothing stops before min_tokens; then a stop id (kStop); then max_tokens
  // (kLength). A kStop token is not part of the visible output. A constraint advances
  // past every token but stop ids.
  std::optional<FinishReason> accept(int32_t token);

  // Structured output: the tokens allowed next (owned; set once, before sampling).
  void set_constraint(std::unique_ptr<TokenConstraint> c) { constraint_ = std::move(c); }
  // Null when unconstrained. Non-const through a const state: sampling (which reads the
  // state) fills the constraint's caches; only the thread sampling this state uses it.
  TokenConstraint* constraint() const { return constraint_.get(); }
  // A token the constraint refused was accepted (only possible when it allowed nothing
  // and the sequence had no stop id to end with); the constraint no longer applies.
  bool constraint_broken() const { return constraint_broken_; }

  const SamplingParams& params() const { return params_; }
  int64_t n_output() const { return n_output_; }
  uint64_t seed() const { return seed_; }
  int sample_index() const { return sample_index_; }

  // Ids that end the sequence: the model's eos ids (unless ignore_eos) and stop_token_ids.
  std::span<const int32_t> stop_ids() const { return stop_ids_; }
  // While fewer than min_tokens have been generated, stop_ids() must not be sampled.
  bool stop_ids_masked() const { return n_output_ < params_.min_tokens(); }

  // The prompt's distinct ids, ascending.
  std::span<const int32_t> prompt_ids() const { return prompt_unique_; }
  bool in_prompt(int32_t id) const;
  // id -> times generated so far.
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }

 private:
  SamplingParams params_;
  std::vector<int32_t> prompt_unique_;
  std::vector<int32_t> stop_ids_;
  std::unordered_map<int32_t, int32_t> output_counts_;
  int64_t n_output_ = 0;
  uint64_t seed_;
  int sample_index_;
  std::unique_ptr<TokenConstraint> constraint_;
  bool constraint_broken_ = false;
};

}  // namespace dserve
