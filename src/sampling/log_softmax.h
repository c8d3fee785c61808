// Log-softmax helpers over one row of logits, accumulated in double so that the
// log-probabilities of a 100k-entry vocabulary are exact to float precision.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

namespace dserve {

// log(sum(exp(logits))), computed stably (max subtracted first).
double log_sum_exp(std::span<const float> logits);

// out[i] = logits[i] - log_sum_exp(logits); out may alias logits.
void log_softmax(std::span<const float> logits, std::span<float> out);

// The log-probability of `id` under softmax(logits).
double log_prob(std::span<const float> logits, int32_t id);

// The index of the largest logit (the lowest index among equal maxima, as torch.argmax).
int32_t argmax(std::span<const float> logits);

}  // namespace dserve
