// SchedulerOutput: the plan for one engine step, as plain data. The model runner
// consumes it without calling back into the scheduler:
//
//  1. Drop its per-request state for `finished` and `preempted` ids (an id it has not
//     seen is fine: a fork can be preempted before it first runs).
//  2. Perform `block_copies` (n > 1 forks: the parent's partial last prompt block) before
//     the forward pass writes anything.
//  3. For each ScheduledRequest: create state if is_new or is_resumed (block table =
//     new_block_ids), else append new_block_ids to the block table it keeps. Then run
//     token_ids at positions [start_pos, start_pos + n_tokens) — all requests of the
//     step in one ragged forward pass. Every layer writes the step's keys and values
//     into the cache slots (block_table[pos / block_size], pos % block_size) before its
//     attention reads them: a request may reuse, through the prefix cache, a block that
//     another request of the same step fills.
//  4. Sample one token for each request with `sample` set (from the logits of its last
//     position) and pass them, aligned with `requests`, to
//     Scheduler::update_from_output().
//
// Speculative decoding: a request may come with draft_token_ids, run at the positions
// right after its n_tokens (their slots are allocated; prefix caching hashes none of
// them). The runner samples the last known position and each draft position in turn,
// and hands back the tokens it emits: every draft it accepted, then one more token
// (the correction at the first rejected draft, or the bonus after the last).
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvcache/kv_cache_manager.h"
#include "sched/request.h"

namespace dserve::sched {

struct ScheduledRequest {
  kvcache::RequestId id = 0;
  int start_pos = 0;               // == the request's n_computed_tokens before the step
  int n_tokens = 0;                // > 0
  std::vector<int32_t> token_ids;  // [n_tokens]: the tokens at those positions
  bool is_new = false;             // first time scheduled (a fork: with the parent's prompt blocks)
  bool is_resumed = false;         // scheduled again after a preemption; recomputes from start_pos
  bool sample = false;             // the step reaches the last known token: sample the next one
  std::vector<kvcache::BlockId> new_block_ids;  // appended to the request's block table
  // Drafts to verify (only with `sample`): tokens at positions start_pos + n_tokens, ...
  std::vector<int32_t> draft_token_ids;
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> requests;     // running first (oldest first), then newly admitted
  int n_scheduled_tokens = 0;                 // sum of n_tokens and draft tokens
  std::vector<kvcache::RequestId> preempted;  // this step; not in `requests`
  std::vector<kvcache::RequestId> finished;   // since the previous step (incl. aborted)
  std::vector<kvcache::BlockCopy> block_copies;  // to perform before the forward pass
};

// One emitted token as applied by update_from_output(): a request that verified drafts
// gets one per token it kept, in order.
struct RequestOutput {
  kvcache::RequestId id = 0;
  int32_t token = 0;
  std::optional<FinishReason> finish_reason;  // set when this token ends the request
};

}  // namespace dserve::sched
