#include "sampling/sampling_state.h"

#include <algorithm>

namespace dserve {

SamplingState::SamplingState(SamplingParams params, std::span<const int32_t> prompt,
                             std::span<const int32_t> eos_ids, uint64_t unseeded_seed,
                             int sample_index)
    : params_(std::move(params)),
      prompt_unique_(prompt.begin(), prompt.end()),
      seed_(params_.seed().value_or(unseeded_seed)),
      sample_index_(sample_index) {
  std::sort(prompt_unique_.begin(), prompt_unique_.end());
  prompt_unique_.erase(std::unique(prompt_unique_.begin(), prompt_unique_.end()),
                       prompt_unique_.end());
  if (!params_.ignore_eos()) stop_ids_.assign(eos_ids.begin(), eos_ids.end());
  for (int32_t id : params_.stop_token_ids()) stop_ids_.push_back(id);
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
}

bool SamplingState::in_prompt(int32_t id) const {
  return std::binary_search(prompt_unique_.begin(), prompt_unique_.end(), id);
}

std::optional<FinishReason> SamplingState::accept(int32_t token) {
  ++output_counts_[token];
  ++n_output_;
  const bool is_stop = std::binary_search(stop_ids_.begin(), stop_ids_.end(), token);
  if (constraint_ && !constraint_broken_ && !is_stop && !constraint_->accept(token)) {
    constraint_broken_ = true;
  }
  if (n_output_ < params_.min_tokens()) return std::nullopt;
  if (is_stop) return FinishReason::kStop;
  if (n_output_ >= params_.max_tokens()) return FinishReason::kLength;
  return std::nullopt;
}

}  // namespace dserve
