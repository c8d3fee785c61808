// Test double for the model runner: a "model" whose next token is a hash of every token
// it reads back from a paged store, so a wrong block table, a block reused while still
// owned, a bad prefix hit or a lost / repeated token all change the output.
//
// The store is the KV cache in miniature: one int32 per token slot, [n_blocks *
// block_size], addressed exactly as a real runner addresses keys and values. execute()
// follows the SchedulerOutput contract (scheduler_output.h): it drops finished and
// preempted requests, keeps its own copy of each block table from new_block_ids,
// performs block copies, writes every scheduled token into its slot, then (as attention would)
// reads each sampling request's whole context back through its block table.
//
// Thread-safety: none; test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "sched/request.h"
#include "sched/scheduler.h"
#include "sched/scheduler_output.h"

namespace dserve::sched::testing {

// The deterministic "model": next token after `context`, for a request whose sampler is
// seeded with `seed` (the request id, so that n > 1 sequences diverge).
inline int32_t next_token(std::span<const int32_t> context, int vocab, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9e3779b97f4a7c15ull);
  for (int32_t t : context) {
    h ^= uint32_t(t);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  return int32_t(h % uint64_t(vocab));
}

// prompt + outputs of the request generated alone (fork_ids ignored), with the scheduler's stop
// rules.
inline std::vector<int32_t> run_alone(const RequestSpec& spec, int max_model_len, int vocab) {
  std::vector<int32_t> seq = spec.prompt;
  for (int n_out = 1;; ++n_out) {
    const int32_t t = next_token(seq, vocab, spec.id);
    seq.push_back(t);
    const auto& stops = spec.stop_token_ids;
    if (n_out >= spec.min_tokens && std::find(stops.begin(), stops.end(), t) != stops.end()) break;
    if (n_out >= spec.max_tokens || int(seq.size()) >= max_model_len) break;
  }
  return seq;
}

class FakeRunner {
 public:
  FakeRunner(int n_blocks, int block_size, int vocab)
      : block_size_(block_size), vocab_(vocab), slots_(size_t(n_blocks) * block_size, -1) {}

  // `truth(id)` is the request's expected prompt + outputs (from run_alone), used to
  // check what is read back. Returns the sampled tokens aligned with out.requests.
  std::vector<int32_t> execute(const SchedulerOutput& out,
                               const std::function<const std::vector<int32_t>&(RequestId)>& truth) {
    for (RequestId id : out.finished) tables_.erase(id);
    for (RequestId id : out.preempted) tables_.erase(id);
    for (const kvcache::BlockCopy& c : out.block_copies) {
      EXPECT_NE(c.src, c.dst);
      for (int i = 0; i < c.n_tokens; ++i) {
        slots_.at(size_t(c.dst) * block_size_ + i) = slots_.at(size_t(c.src) * block_size_ + i);
      }
    }
    for (const ScheduledRequest& s : out.requests) {
      if (s.is_new || s.is_resumed) {
        EXPECT_EQ(tables_.count(s.id), 0u) << "request " << s.id << " started twice";
        tables_[s.id] = s.new_block_ids;
      } else {
        EXPECT_EQ(tables_.count(s.id), 1u) << "request " << s.id << " continues without state";
        auto& t = tables_[s.id];
        t.insert(t.end(), s.new_block_ids.begin(), s.new_block_ids.end());
      }
      const std::vector<int32_t>& tr = truth(s.id);
      EXPECT_GE(tables_[s.id].size() * block_size_, size_t(s.start_pos + s.n_tokens));
      for (int i = 0; i < s.n_tokens; ++i) {
        const int pos = s.start_pos + i;
        EXPECT_EQ(s.token_ids[i], tr[pos]) << "request " << s.id << " position " << pos;
        slot(s.id, pos) = s.token_ids[i];  // "write keys and values"
      }
    }
    std::vector<int32_t> sampled(out.requests.size(), -1);
    for (size_t r = 0; r < out.requests.size(); ++r) {
      const ScheduledRequest& s = out.requests[r];
      if (!s.sample) continue;
      const std::vector<int32_t>& tr = truth(s.id);
      const int n = s.start_pos + s.n_tokens;
      context_.resize(n);
      for (int pos = 0; pos < n; ++pos) {  // "attention over the block table"
        context_[pos] = slot(s.id, pos);
        if (context_[pos] != tr[pos] && n_bad_reads_++ == 0) {
          ADD_FAILURE() << "request " << s.id << " reads " << context_[pos] << " at position "
                        << pos << ", expected " << tr[pos];
        }
      }
      sampled[r] = next_token(context_, vocab_, s.id);
    }
    return sampled;
  }

  size_t n_tables() const { return tables_.size(); }

  // The runner's tables, built only from new_block_ids, must equal the cache's: block
  // tables are append-only and every new block is announced.
  bool tables_match(const SchedulerOutput& out, const Scheduler& sched) const {
    for (const ScheduledRequest& s : out.requests) {
      std::span<const kvcache::BlockId> want = sched.kv_cache().block_table(s.id);
      const auto& have = tables_.at(s.id);
      if (!std::equal(have.begin(), have.end(), want.begin(), want.end())) {
        ADD_FAILURE() << "request " << s.id << ": runner's block table differs from the cache's";
        return false;
      }
    }
    return true;
  }

 private:
  int32_t& slot(RequestId id, int pos) {
    const auto& t = tables_.at(id);
    return slots_.at(size_t(t.at(pos / block_size_)) * block_size_ + pos % block_size_);
  }

  int block_size_;
  int vocab_;
  std::vector<int32_t> slots_;
  std::unordered_map<RequestId, std::vector<kvcache::BlockId>> tables_;
  std::vector<int32_t> context_;
  int n_bad_reads_ = 0;
};

// Checks one plan against the configuration and the cache; returns false on the first
// violation (reported through gtest).
inline bool check_plan(const SchedulerOutput& out, const Scheduler& sched) {
  const SchedulerConfig& c = sched.config();
  int sum = 0;
  std::vector<RequestId> ids;
  for (const ScheduledRequest& s : out.requests) {
    if (s.n_tokens <= 0 || int(s.token_ids.size()) != s.n_tokens) {
      ADD_FAILURE() << "request " << s.id << " scheduled with " << s.n_tokens << " tokens";
      return false;
    }
    const int table = int(sched.kv_cache().block_table(s.id).size());
    if (table < sched.kv_cache().blocks_for(s.start_pos + s.n_tokens)) {
      ADD_FAILURE() << "request " << s.id << " has " << table << " blocks for "
                    << s.start_pos + s.n_tokens << " tokens";
      return false;
    }
    if (s.start_pos + s.n_tokens > c.max_model_len) {
      ADD_FAILURE() << "request " << s.id << " runs past max_model_len";
      return false;
    }
    sum += s.n_tokens;
    ids.push_back(s.id);
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
    ADD_FAILURE() << "a request is scheduled twice in one step";
    return false;
  }
  if (sum != out.n_scheduled_tokens || sum > c.max_num_batched_tokens) {
    ADD_FAILURE() << "step schedules " << sum << " tokens (reported " << out.n_scheduled_tokens
                  << ", budget " << c.max_num_batched_tokens << ")";
    return false;
  }
  if (int(out.requests.size()) > c.max_num_seqs || sched.stats().n_running > c.max_num_seqs) {
    ADD_FAILURE() << "more than max_num_seqs requests";
    return false;
  }
  Status st = sched.check_invariants();
  if (!st.ok()) {
    ADD_FAILURE() << st.to_string();
    return false;
  }
  return true;
}

}  // namespace dserve::sched::testing
