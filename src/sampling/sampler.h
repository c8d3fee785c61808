// Sampler: picks the next token from a row of logits, the way transformers'
// generate() does with its logits warpers: temperature, then top-k, then top-p
// (nucleus, over the distribution renormalised after top-k), then a draw from what is
// left. Temperature 0 is greedy (argmax). Each request owns a Sampler, so its random
// stream depends only on its seed.
//
// No full sort of the vocabulary: top-k is a partial selection, and top-p sorts a
// growing prefix of the best candidates until it holds probability mass top_p.
//
// Thread-safety: not thread-safe (owns an RNG and scratch); one per request.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dserve {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;

  // InvalidArgument naming the bad value (negative temperature, top_p outside (0, 1], ...).
  Status validate() const;
  bool greedy() const { return temperature == 0.0f; }
};

class Sampler {
 public:
  // params must have passed validate().
  explicit Sampler(const SamplingParams& params);
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // logits [vocab]. Returns a token id in [0, vocab).
  int32_t sample(std::span<const float> logits);

  const SamplingParams& params() const { return params_; }

 private:
  // Fills candidates_ with the `k` best (scaled logit, id) pairs in descending order.
  void select_top(std::span<const float> logits, size_t k);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch: (logit / T, id)
  std::vector<double> probs_;                          // scratch
};

}  // namespace dserve
