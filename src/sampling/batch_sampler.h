// BatchSampler: samples the next token of every sequence in one engine step from
// the step's logits matrix, in parallel over sequences when given a ThreadPool.
//
// Each sequence's result depends only on its own logits row and SamplingState (see
// counter_rng.h), so it is the same whatever else is in the batch, in whatever order,
// and on however many threads.
//
// Thread-safety: sample() must be called from one thread at a time (the engine
// thread); it spreads the work over the pool, one Sampler (scratch) per pool thread.
// The states are only read.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "sampling/sampler.h"

namespace dserve {

class BatchSampler {
 public:
  // pool: borrowed, may be null (sample serially on the calling thread).
  explicit BatchSampler(ThreadPool* pool = nullptr);
  BatchSampler(const BatchSampler&) = delete;
  BatchSampler& operator=(const BatchSampler&) = delete;

  // logits: [n_seqs, vocab] row-major, row i for states[i]; out: [n_seqs].
  // Does not advance the states: the caller accept()s each token it keeps.
  void sample(std::span<const float> logits, int64_t vocab,
              std::span<const SamplingState* const> states, std::span<SampleResult> out);

 private:
  ThreadPool* pool_;
  std::vector<std::unique_ptr<Sampler>> samplers_;  // one per pool thread
};

}  // namespace dserve
