// SamplingParams: how one request turns logits into tokens, with vLLM's names and
// meanings. A request fills a plain SamplingOptions (from the CLI or the HTTP body);
// SamplingParams::create validates it once and the result is immutable, so nothing
// downstream re-checks ranges.
//
// Order of processing per step (vLLM v1's sampler): min_tokens masking of stop ids ->
// logit_bias -> repetition / frequency / presence penalties -> greedy argmax if
// temperature ~ 0, otherwise temperature -> min_p -> top_k -> top_p (over what top_k
// left, renormalised) -> one draw from the per-request RNG. Logprobs are vLLM's default
// "raw_logprobs": from the model's logits before any of this processing (so a
// logit_bias changes which token is chosen, not the logprobs reported for it).
//
// One deliberate difference: top_k keeps exactly k tokens, breaking a tie at the k-th
// logit by the lower id; vLLM and transformers keep every token tied with the k-th.
//
// Thread-safety: plain immutable values, safe to share between threads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dserve {

// The most log-probability alternatives a request may ask for (vLLM's max_logprobs).
inline constexpr int kMaxLogprobs = 20;
// Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;
// A logit_bias value lies in [-kMaxLogitBias, kMaxLogitBias] (OpenAI's range).
inline constexpr float kMaxLogitBias = 100.0f;

// Constrained decoding (structured output, vLLM's StructuredOutputsParams): the output
// must match this. Plain data: the engine compiles it against the model's tokenizer
// (src/grammar/structured_output.h), so it crosses process boundaries as it is.
struct StructuredOutputs {
  enum class Kind { kJson, kJsonObject, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kJsonObject;
  // kJson: the JSON schema as JSON text; kRegex: the pattern; kGrammar: GBNF text.
  std::string text;
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these
  // kGrammar: rules the grammar text may use, each defined as JSON valid under a schema:
  // (rule name, schema as JSON text). Tool calling writes e.g.
  //   root ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " args "}\n</tool_call>"
  // with schema_rules {{"args", <the function's parameters schema>}}.
  std::vector<std::pair<std::string, std::string>> schema_rules;
  bool operator==(const StructuredOutputs&) const = default;
};

// What a request asks for, unvalidated. Defaults are vLLM's.
struct SamplingOptions {
  int n = 1;                           // sequences per prompt, >= 1
  float temperature = 1.0f;            // >= 0; below kGreedyTemperature: greedy
  float top_p = 1.0f;                  // (0, 1]; 1: off
  int top_k = 0;                       // -1 or 0: off; else >= 1
  float min_p = 0.0f;                  // [0, 1]; 0: off
  float repetition_penalty = 1.0f;     // > 0; 1: off. Over prompt and output tokens
  float frequency_penalty = 0.0f;      // [-2, 2]; 0: off. Over output tokens
  float presence_penalty = 0.0f;       // [-2, 2]; 0: off. Over output tokens
  // token id -> added to its logit every step, [-kMaxLogitBias, kMaxLogitBias] (OpenAI's
  // logit_bias). Ids must lie in the vocabulary, which the engine checks.
  std::map<int32_t, float> logit_bias = {};
  std::optional<uint64_t> seed = {};   // none: the engine's entropy
  std::vector<std::string> stop = {};  // stop strings, not returned in the output
  std::vector<int32_t> stop_token_ids = {};
  bool include_stop_str_in_output = false;  // return the matched stop string too
  bool ignore_eos = false;                  // do not stop at the model's end-of-sequence ids
  bool skip_special_tokens = true;          // leave special tokens out of the output text
  int max_tokens = 16;                      // >= 1
  int min_tokens = 0;                       // [0, max_tokens]; stop ids masked until reached
  std::optional<int> logprobs = {};         // [0, kMaxLogprobs] alternatives; none: no logprobs
  // [0, kMaxLogprobs]: also the log-probability of every prompt token after the first
  // (and this many alternatives), as evaluation harnesses score text; none: off. Such
  // a request bypasses the prefix cache, since cached positions have no logits.
  std::optional<int> prompt_logprobs = {};
  // none: unconstrained. Validated (compiled) by the engine, not by SamplingParams.
  std::optional<StructuredOutputs> structured_outputs = {};
};

class SamplingParams {
 public:
  // InvalidArgument naming the field and the bad value; the vLLM ranges above.
  static Result<SamplingParams> create(SamplingOptions options);

  int n() const { return o_.n; }
  float temperature() const { return o_.temperature; }
  float top_p() const { return o_.top_p; }
  // 0 when off (both -1 and 0 given).
  int top_k() const { return o_.top_k > 0 ? o_.top_k : 0; }
  float min_p() const { return o_.min_p; }
  float repetition_penalty() const { return o_.repetition_penalty; }
  float frequency_penalty() const { return o_.frequency_penalty; }
  float presence_penalty() const { return o_.presence_penalty; }
  const std::map<int32_t, float>& logit_bias() const { return o_.logit_bias; }
  const std::optional<uint64_t>& seed() const { return o_.seed; }
  const std::vector<std::string>& stop() const { return o_.stop; }
  const std::vector<int32_t>& stop_token_ids() const { return o_.stop_token_ids; }
  bool include_stop_str_in_output() const { return o_.include_stop_str_in_output; }
  bool ignore_eos() const { return o_.ignore_eos; }
  int max_tokens() const { return o_.max_tokens; }
  int min_tokens() const { return o_.min_tokens; }
  const std::optional<int>& logprobs() const { return o_.logprobs; }
  const std::optional<int>& prompt_logprobs() const { return o_.prompt_logprobs; }
  const std::optional<StructuredOutputs>& structured_outputs() const {
    return o_.structured_outputs;
  }

  bool greedy() const { return o_.temperature < kGreedyTemperature; }
  bool has_penalties() const {
    return o_.repetition_penalty != 1.0f || o_.frequency_penalty != 0.0f ||
           o_.presence_penalty != 0.0f;
  }

 private:
  explicit SamplingParams(SamplingOptions options) : o_(std::move(options)) {}
  SamplingOptions o_;
};

}  // namespace dserve
