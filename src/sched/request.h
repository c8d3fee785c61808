// Request: one generation request as the scheduler tracks it: the prompt, the tokens
// generated so far, how many of those tokens have keys and values in the cache, and its
// state:
//
//   kWaiting --schedule--> kRunning --update (stop token, length)--> kFinished
//   kRunning --preempt--> kPreempted --schedule--> kRunning
//   any unfinished state --finish_request (abort, stop string)--> kFinished
//   kForkPending --parent's prompt computed--> kRunning (sharing the parent's blocks),
//                or kWaiting if it cannot join the batch or the parent ends first
//
// A preempted request loses its blocks and its n_computed_tokens drops to 0; its prompt
// and outputs stay, so resuming recomputes prompt + outputs and then samples the next
// token: no token is lost or repeated.
//
// Thread-safety: plain data; the Scheduler owns every Request and is the only writer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "kvcache/kv_cache_manager.h"
#include "sched/finish_reason.h"

namespace dserve::sched {

using kvcache::RequestId;

enum class RequestState {
  kWaiting,
  kRunning,
  kPreempted,    // waiting again, after losing its blocks
  kForkPending,  // one of n > 1 sequences, waiting for its parent's prompt
  kFinished,
};
const char* request_state_name(RequestState s);

// What the engine hands the scheduler; sampling parameters stay with the engine.
struct RequestSpec {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  int max_tokens = 16;                  // >= 1
  int min_tokens = 0;                   // stop tokens are ignored before this many outputs
  std::vector<int32_t> stop_token_ids;  // the engine adds EOS here unless ignore_eos
  // n > 1 sampling: ids of the n - 1 further sequences over the same prompt. Each is a
  // request of its own (outputs, finish, abort); once this request's prompt is computed
  // they take its prompt blocks (KvCacheManager::fork) and recompute only the last
  // prompt token, to sample their own first token.
  std::vector<RequestId> fork_ids;
  // Compute every prompt position (no prefix-cache hit), e.g. to score the prompt.
  bool skip_prefix_cache = false;

  // InvalidArgument for an empty prompt, max_tokens < 1, min_tokens < 0.
  Status validate() const;
};

struct Request {
  explicit Request(RequestSpec s);

  std::span<const int32_t> tokens() const { return all_tokens; }  // prompt, then outputs
  int n_tokens() const { return static_cast<int>(all_tokens.size()); }
  int n_output_tokens() const { return n_tokens() - n_prompt_tokens; }
  std::span<const int32_t> output_tokens() const {
    return std::span<const int32_t>(all_tokens).subspan(n_prompt_tokens);
  }
  // Why generation ends after the last appended token, or nullopt to go on.
  std::optional<FinishReason> stop_reason(int max_model_len) const;

  RequestSpec spec;
  int n_prompt_tokens = 0;
  std::vector<int32_t> all_tokens;
  int n_computed_tokens = 0;  // leading tokens whose keys and values are in the cache
  RequestState state = RequestState::kWaiting;
  int n_preemptions = 0;
  // n > 1: the sequences waiting for this prompt, or the request this one waits for.
  std::vector<Request*> pending_forks;
  Request* fork_parent = nullptr;
  // Forked into the batch: the next plan announces it as new, with its whole block table.
  bool announce_table = false;
  // Speculative decoding: guesses at the tokens after the last known one, verified by
  // the next step that schedules this request (then dropped, accepted or not).
  std::vector<int32_t> draft_tokens;
};

}  // namespace dserve::sched
