// What the engine reports: one EngineOutput per request and step, EngineStats for the
// whole engine. Leaf types, so that the public API (include/dserve) can name them
// without the engine, model or scheduler.
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "sampling/sample_result.h"
#include "sched/finish_reason.h"

namespace dserve {

using RequestId = uint64_t;

// What one step produced for one request.
struct EngineOutput {
  RequestId id = 0;
  // The token sampled this step, a stop id included (as vLLM); empty when a request was
  // aborted.
  std::vector<int32_t> new_token_ids;
  // The last of new_token_ids ended the request as a stop id (eos or stop_token_ids):
  // it counts as output, but its text is not shown unless include_stop_str_in_output.
  bool ends_with_stop_token = false;
  std::optional<sched::FinishReason> finish_reason;  // set when the request ended this step
  // With SamplingOptions::logprobs: one entry per new token (raw logprob, rank and the
  // best alternatives).
  std::vector<SampleResult> logprobs;
  // With SamplingOptions::prompt_logprobs, on the request's first output: one entry per
  // prompt position 1..P-1 (the first prompt token has no log-probability).
  std::vector<SampleResult> prompt_logprobs;
};

// Speculative decoding's counters, as vLLM's spec_decode metrics count them.
struct SpecDecodeStats {
  int64_t n_drafts = 0;           // request-steps that verified at least one draft
  int64_t n_draft_tokens = 0;     // drafts verified
  int64_t n_accepted_tokens = 0;  // drafts accepted
  // [num_speculative_tokens]: how often the draft at each position was accepted.
  std::vector<int64_t> n_accepted_per_pos;
};

struct EngineStats {
  int64_t n_steps = 0;
  int64_t n_preemptions = 0;
  int64_t n_prefix_queried_tokens = 0;
  int64_t n_prefix_hit_tokens = 0;
  int64_t n_computed_tokens = 0;   // tokens run through the model (prefill and decode)
  int64_t n_generated_tokens = 0;  // tokens sampled
  int n_running = 0;
  int n_waiting = 0;
  int n_blocks = 0;
  int n_free_blocks = 0;
  SpecDecodeStats spec;
};

}  // namespace dserve
