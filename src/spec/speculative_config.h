// SpeculativeConfig: what --speculative-config asks for, in vLLM's JSON keys:
//   {"method": "ngram", "num_speculative_tokens": K,
//    "prompt_lookup_min": a, "prompt_lookup_max": b}
//   {"method": "deepseek_mtp" (or "mtp"), "num_speculative_tokens": N}
// "ngram" drafts by prompt lookup (ngram_proposer.h) and works for every model;
// "deepseek_mtp" runs DeepSeek-V3/R1's multi-token-prediction layer N times, which the
// model must have (checked when the engine is built).
//
// Thread-safety: plain data.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"

namespace dserve::spec {

enum class SpeculativeMethod { kNone, kNgram, kMtp };

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int num_speculative_tokens = 0;  // drafts per step and sequence at most
  int prompt_lookup_min = 0;       // ngram: the shortest suffix matched
  int prompt_lookup_max = 0;       // ngram: the longest suffix matched

  bool enabled() const { return method != SpeculativeMethod::kNone; }
  // "ngram", "deepseek_mtp" or "none".
  const char* method_name() const;

  // Parses and validates the JSON object (vLLM's defaults: with neither lookup bound
  // given both are 5; with one, the other equals it). InvalidArgument naming the
  // problem for bad JSON, an unknown key or method, or a value out of range.
  static Result<SpeculativeConfig> parse(std::string_view json);
};

}  // namespace dserve::spec
