#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/check.h"
#include "sampling/log_softmax.h"

namespace dserve {

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || std::isinf(temperature)) {
    return invalid_argument("temperature must be a finite number >= 0, got " +
                            std::to_string(temperature));
  }
  if (top_k < 0)
    return invalid_argument("top_k must be >= 0 (0: off), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return invalid_argument("top_p must be in (0, 1], got " + std::to_string(top_p));
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  DS_CHECK(params.validate().ok());
}

void Sampler::select_top(std::span<const float> logits, size_t k) {
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) candidates_[i] = {logits[i], static_cast<int32_t>(i)};
  // Best first; equal logits by lower id, so the order never depends on the library.
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(), better);
  candidates_.resize(k);
}

int32_t Sampler::sample(std::span<const float> logits) {
  DS_CHECK(!logits.empty());
  if (params_.greedy()) return argmax(logits);

  const size_t vocab = logits.size();
  const double inv_t = 1.0 / params_.temperature;
  float max_logit = logits[0];
  for (float x : logits) max_logit = std::max(max_logit, x);
  auto weight = [&](float logit) {
    return std::exp((static_cast<double>(logit) - max_logit) * inv_t);
  };

  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const bool use_top_p = params_.top_p < 1.0f;
  if (params_.top_k == 0 && !use_top_p) {
    // Plain sampling from softmax(logits / T): inverse CDF in vocabulary order.
    double total = 0.0;
    for (float x : logits) total += weight(x);
    double u = uniform(rng_) * total;
    for (size_t i = 0; i < vocab; ++i) {
      u -= weight(logits[i]);
      if (u <= 0.0) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(vocab - 1);
  }

  // The candidates, best first, and the mass they are measured against: the top-k
  // set renormalised (top-k given), else the whole vocabulary.
  double normaliser = 0.0;
  if (params_.top_k > 0) {
    select_top(logits, std::min<size_t>(params_.top_k, vocab));
    for (const auto& c : candidates_) normaliser += weight(c.first);
  } else {
    for (float x : logits) normaliser += weight(x);
    // Grow the sorted prefix until it holds top_p of the mass.
    for (size_t k = std::min<size_t>(64, vocab);; k = std::min(k * 4, vocab)) {
      select_top(logits, k);
      double mass = 0.0;
      for (const auto& c : candidates_) mass += weight(c.first);
      if (mass >= params_.top_p * normaliser || k == vocab) break;
    }
  }

  probs_.resize(candidates_.size());
  size_t n_keep = candidates_.size();
  double cumulative = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    probs_[i] = weight(candidates_[i].first) / normaliser;
    cumulative += probs_[i];
    if (use_top_p && cumulative >= params_.top_p) {
      n_keep = i + 1;
      break;
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < n_keep; ++i) kept += probs_[i];
  double u = uniform(rng_) * kept;
  for (size_t i = 0; i < n_keep; ++i) {
    u -= probs_[i];
    if (u <= 0.0) return candidates_[i].second;
  }
  return candidates_[n_keep - 1].second;
}

}  // namespace dserve
