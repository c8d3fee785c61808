#include "sampling/batch_sampler.h"

#include "base/check.h"

namespace dserve {

BatchSampler::BatchSampler(ThreadPool* pool) : pool_(pool) {
  const int n_threads = pool_ ? pool_->n_threads() : 1;
  for (int i = 0; i < n_threads; ++i) samplers_.push_back(std::make_unique<Sampler>());
}

void BatchSampler::sample(std::span<const float> logits, int64_t vocab,
                          std::span<const SamplingState* const> states,
                          std::span<SampleResult> out) {
  const auto n_seqs = static_cast<int64_t>(states.size());
  DS_CHECK(vocab > 0);
  DS_CHECK(static_cast<int64_t>(logits.size()) == n_seqs * vocab);
  DS_CHECK(out.size() == states.size());
  auto one = [&](int64_t i, int thread) {
    out[i] = samplers_[thread]->sample(*states[i], logits.subspan(i * vocab, vocab));
  };
  if (pool_ == nullptr || n_seqs <= 1) {
    for (int64_t i = 0; i < n_seqs; ++i) one(i, 0);
    return;
  }
  pool_->run(n_seqs, one);
}

}  // namespace dserve
