// Scheduler: continuous batching over the paged KV cache, in the manner of vLLM v1:
// no separate prefill and decode phases, only "each request's n_computed_tokens chases
// its known tokens" under one token budget per step.
//
// schedule() plans one step:
//  1. Running requests, oldest first, each get min(remaining, budget) tokens: 1 for a
//     decode, a chunk for a long prefill. When the KV cache cannot hold them, the newest
//     running request (one not yet scheduled this step, possibly the current one) is
//     preempted by recompute: its blocks are freed and it goes back to the front of the
//     waiting queue.
//  2. If nobody was preempted, waiting requests are admitted first-come first-served
//     while budget, max_num_seqs and blocks last; each starts after its cached prefix
//     (get_computed_blocks) and may get only a chunk. The queue's head is never skipped.
//
// Where mutation happens ("planning is pure; one place mutates"): schedule() changes
// only the scheduler's own bookkeeping — the queues, block allocation and preemption,
// which the plan depends on — and records the plan. It advances no request beyond what
// the cache already holds (an admitted request starts at its prefix hit).
// update_from_output() is the one place that applies a step: n_computed_tokens moves
// forward, sampled tokens are appended, stop conditions finish requests. A step must be
// applied before the next schedule() (checked).
//
// Speculative decoding: set_draft_tokens() gives a decoding request guesses at its next
// tokens; the next schedule() runs them after its last known token when the budget,
// max_model_len, max_tokens and the cache allow (as many as fit, or none), and
// update_from_output() applies as many tokens as the runner emits, each checked for
// stop conditions in turn (a stop mid-way drops the rest). n_computed_tokens moves past
// the accepted drafts only: a rejected draft's slot is simply written again later.
//
// n > 1 (RequestSpec::fork_ids): the extra sequences wait (kForkPending) until the
// parent's prompt is computed; update_from_output() then forks them into the batch over
// the parent's prompt blocks (full blocks shared, the partial one copied: the plan's
// block_copies). One that cannot join (max_num_seqs, no free block) or whose parent ends
// first queues as an ordinary request instead, recomputing its prompt.
//
// add_request() validates before anything is queued: a prompt that does not leave room
// for one generated token within max_model_len, or a request whose tokens could not fit
// in the whole KV cache even alone, is refused with a Status and changes nothing.
//
// Thread-safety: not thread-safe. The engine thread owns the Scheduler (and through it
// the KvCacheManager); other threads hand requests and aborts to the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kvcache/kv_cache_manager.h"
#include "sched/request.h"
#include "sched/scheduler_output.h"

namespace dserve::sched {

struct SchedulerConfig {
  int max_num_batched_tokens = 2048;  // token budget per step (decodes + prefill chunks)
  int max_num_seqs = 256;             // running requests at most
  int max_model_len = 4096;           // prompt + generated tokens at most
  // Cache slots a decoding request gets beyond its drafts, for a proposer that writes
  // ahead of them (MTP's chained drafts: N - 1); dropped, with the drafts, when the
  // cache is short.
  int lookahead_slots = 0;

  // InvalidArgument for values < 1 (max_model_len < 2).
  Status validate() const;
};

struct SchedulerStats {
  int64_t n_steps = 0;
  int64_t n_preemptions = 0;
  int n_waiting = 0;  // includes preempted requests
  int n_running = 0;
  kvcache::KvCacheStats kv;
};

class Scheduler {
 public:
  // Validates both configs and that one max_model_len-long request fits in the cache
  // (ResourceExhausted with the smallest block count that would do, otherwise).
  static Result<std::unique_ptr<Scheduler>> create(const SchedulerConfig& config,
                                                   const kvcache::KvCacheConfig& kv_config);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (FCFS). InvalidArgument for a bad spec, a duplicate id or a prompt
  // too long for max_model_len; ResourceExhausted if it can never fit in the cache.
  Status add_request(RequestSpec spec);
  // Ends a waiting or running request now (during a step: when the step is applied);
  // its blocks return to the pool and its id appears in the next plan's `finished`.
  // reason kAbort for a client's cancel, kStop for a stop string the engine detected.
  // NotFound for an unknown or already finished id.
  Status finish_request(RequestId id, FinishReason reason);
  Status abort_request(RequestId id) { return finish_request(id, FinishReason::kAbort); }

  // Drafts for a running request's next step (replacing any it had). Ignored for an
  // unknown request or one that is not running.
  void set_draft_tokens(RequestId id, std::vector<int32_t> drafts);

  // Plans the next step (see the header comment).
  [[nodiscard]] SchedulerOutput schedule();
  // Applies a planned step: emitted[i] are the tokens the step produced for
  // output.requests[i] (ignored where !sample): the accepted drafts, in order, then one
  // more. Returns one RequestOutput per token applied.
  std::vector<RequestOutput> update_from_output(const SchedulerOutput& output,
                                                std::span<const std::vector<int32_t>> emitted);
  // Without drafts: sampled[i] is the one token sampled for output.requests[i].
  std::vector<RequestOutput> update_from_output(const SchedulerOutput& output,
                                                std::span<const int32_t> sampled);

  bool has_unfinished_requests() const { return !requests_.empty(); }
  // nullptr for unknown or finished ids.
  const Request* find(RequestId id) const;
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }
  const kvcache::KvCacheManager& kv_cache() const { return kv_; }

  // Internal error naming the first broken invariant (the cache's own; waiting requests
  // hold no blocks; running ones hold enough for their computed tokens; counts).
  Status check_invariants() const;

 private:
  Scheduler(const SchedulerConfig& config, const kvcache::KvCacheConfig& kv_config);
  // Frees the newest running request's blocks and requeues it at the waiting front.
  void preempt_newest(SchedulerOutput& out);
  void finish(Request& r);
  // Moves the parent's pending forks into the batch (share == true, after its prompt is
  // computed) or to the front of the waiting queue.
  void release_forks(Request& parent, bool share);
  // Blocks a request needs at its longest: every token but the last sampled one.
  int64_t max_kv_tokens(const RequestSpec& spec) const;
  // How many of r's drafts a step reaching its last known token may run, given `budget`
  // tokens left after the known ones.
  int n_drafts_to_run(const Request& r, int budget) const;

  SchedulerConfig config_;
  kvcache::KvCacheManager kv_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;  // unfinished only
  std::deque<Request*> waiting_;   // FCFS; preempted requests go back to the front
  std::vector<Request*> running_;  // in admission order: back() is the newest
  std::vector<RequestId> finished_since_last_step_;
  std::unordered_map<RequestId, FinishReason> pending_finish_;
  std::vector<std::pair<RequestId, kvcache::BlockCopy>>
      pending_copies_;  // for the next plan  // finish_request() during a step
  bool step_in_flight_ = false;
  int64_t n_steps_ = 0;
  int64_t n_preemptions_ = 0;
};

}  // namespace dserve::sched
