#include "sampling/sampling_params.h"

#include <cmath>
#include <sstream>

namespace dserve {
namespace {

std::string str(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

}  // namespace

Result<SamplingParams> SamplingParams::create(SamplingOptions o) {
  if (o.n < 1) return invalid_argument("n must be at least 1, got " + std::to_string(o.n));
  if (!(o.temperature >= 0.0f) || std::isinf(o.temperature)) {
    return invalid_argument("temperature must be a finite number >= 0, got " + str(o.temperature));
  }
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) {
    return invalid_argument("top_p must be in (0, 1], got " + str(o.top_p));
  }
  if (o.top_k < -1) {
    return invalid_argument("top_k must be -1 or 0 (off) or at least 1, got " +
                            std::to_string(o.top_k));
  }
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f)) {
    return invalid_argument("min_p must be in [0, 1], got " + str(o.min_p));
  }
  if (!(o.repetition_penalty > 0.0f) || std::isinf(o.repetition_penalty)) {
    return invalid_argument("repetition_penalty must be a finite number > 0, got " +
                            str(o.repetition_penalty));
  }
  if (!(o.frequency_penalty >= -2.0f && o.frequency_penalty <= 2.0f)) {
    return invalid_argument("frequency_penalty must be in [-2, 2], got " +
                            str(o.frequency_penalty));
  }
  if (!(o.presence_penalty >= -2.0f && o.presence_penalty <= 2.0f)) {
    return invalid_argument("presence_penalty must be in [-2, 2], got " + str(o.presence_penalty));
  }
  for (const auto& [id, bias] : o.logit_bias) {
    if (id < 0) {
      return invalid_argument("logit_bias keys must be token ids >= 0, got " + std::to_string(id));
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return invalid_argument("logit_bias values must be in [-100, 100], got " + str(bias) +
                              " for token " + std::to_string(id));
    }
  }
  if (o.max_tokens < 1) {
    return invalid_argument("max_tokens must be at least 1, got " + std::to_string(o.max_tokens));
  }
  if (o.min_tokens < 0 || o.min_tokens > o.max_tokens) {
    return invalid_argument("min_tokens must be in [0, max_tokens=" + std::to_string(o.max_tokens) +
                            "], got " + std::to_string(o.min_tokens));
  }
  if (o.prompt_logprobs && (*o.prompt_logprobs < 0 || *o.prompt_logprobs > kMaxLogprobs)) {
    return invalid_argument("prompt_logprobs must be in [0, " + std::to_string(kMaxLogprobs) +
                            "], got " + std::to_string(*o.prompt_logprobs));
  }
  if (o.logprobs && (*o.logprobs < 0 || *o.logprobs > kMaxLogprobs)) {
    return invalid_argument("logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "], got " +
                            std::to_string(*o.logprobs));
  }
  for (int32_t id : o.stop_token_ids) {
    if (id < 0) return invalid_argument("stop_token_ids must be >= 0, got " + std::to_string(id));
  }
  for (const std::string& s : o.stop) {
    if (s.empty()) return invalid_argument("stop strings must not be empty");
  }
  return SamplingParams(std::move(o));
}

}  // namespace dserve
