// SpeculativeSampler: one engine step's sampling when sequences bring drafts
// (speculative decoding), lossless by construction.
//
// Every draft is one proposed token: the n-gram and MTP proposers both give greedy
// drafts, as vLLM's do, so the proposal distribution q is one-hot at the draft d. The
// rejection rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023),
// accept d with probability min(1, p(d) / q(d)) = p(d) and otherwise draw from
// norm(max(0, p - q)) = p without d, is then exactly: draw x from the target's
// distribution p at that position; accept d when x == d, else x is the correction.
// Drawing x with the sequence's own counter-based random stream at that output index
// (counter_rng.h) makes every emitted token the one the sequence would have produced
// without drafts, greedy or sampled, seeded or not, with penalties, logit_bias and
// structured-output masks: each position is sampled from the SamplingState as
// advanced by the tokens accepted before it.
//
// Sequence s owns the logits rows first_row[s] .. first_row[s] + drafts[s].size():
// row j gives the distribution after its j-th draft (row 0: after its last known
// token). Round j samples row j of every sequence still verifying, in parallel over
// sequences (BatchSampler). A sequence stops at its first rejected draft, after its
// bonus token (every draft accepted), or at a token that ends it (SamplingState::accept).
//
// Thread-safety: as BatchSampler (one calling thread); the states are advanced.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "sampling/batch_sampler.h"

namespace dserve {

class SpeculativeSampler {
 public:
  // pool: borrowed, may be null (sample serially on the calling thread).
  explicit SpeculativeSampler(ThreadPool* pool = nullptr) : batch_(pool) {}

  // logits: [rows, vocab]. out[s]: the tokens emitted for states[s] (its accepted
  // drafts, then one more, unless a token ended it), each with its SampleResult; every
  // one has been accept()ed into states[s]. Sequences without drafts get one token.
  void sample(std::span<const float> logits, int64_t vocab, std::span<SamplingState* const> states,
              std::span<const int32_t> first_row,
              std::span<const std::span<const int32_t>> drafts,
              std::span<std::vector<SampleResult>> out);

 private:
  BatchSampler batch_;
  std::vector<float> rows_;  // the round's rows, gathered when not already in place
  std::vector<const SamplingState*> round_states_;
  std::vector<SampleResult> round_results_;
};

}  // namespace dserve
