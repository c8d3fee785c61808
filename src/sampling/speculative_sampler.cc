#include "sampling/speculative_sampler.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"

namespace dserve {

void SpeculativeSampler::sample(std::span<const float> logits, int64_t vocab,
                                std::span<SamplingState* const> states,
                                std::span<const int32_t> first_row,
                                std::span<const std::span<const int32_t>> drafts,
                                std::span<std::vector<SampleResult>> out) {
  const size_t n = states.size();
  DS_CHECK(first_row.size() == n && drafts.size() == n && out.size() == n);
  const int64_t n_rows = static_cast<int64_t>(logits.size()) / vocab;
  for (size_t s = 0; s < n; ++s) {
    DS_CHECK(first_row[s] >= 0 &&
             first_row[s] + static_cast<int64_t>(drafts[s].size()) < n_rows);
    out[s].clear();
  }
  std::vector<size_t> active(n), still;
  std::iota(active.begin(), active.end(), size_t{0});
  for (size_t round = 0; !active.empty(); ++round) {
    round_states_.clear();
    bool in_place = round == 0 && static_cast<int64_t>(active.size()) == n_rows;
    for (size_t i = 0; i < active.size(); ++i) {
      round_states_.push_back(states[active[i]]);
      in_place = in_place && first_row[active[i]] == static_cast<int32_t>(i);
    }
    std::span<const float> round_logits = logits;
    if (!in_place) {  // gather row `round` of each active sequence
      rows_.resize(active.size() * static_cast<size_t>(vocab));
      for (size_t i = 0; i < active.size(); ++i) {
        const float* row = logits.data() + (first_row[active[i]] + round) * vocab;
        std::copy(row, row + vocab, rows_.begin() + static_cast<int64_t>(i) * vocab);
      }
      round_logits = rows_;
    }
    round_results_.assign(active.size(), SampleResult{});
    batch_.sample(round_logits, vocab, round_states_, round_results_);
    still.clear();
    for (size_t i = 0; i < active.size(); ++i) {
      const size_t s = active[i];
      const int32_t token = round_results_[i].token;
      out[s].push_back(std::move(round_results_[i]));
      const bool ended = states[s]->accept(token).has_value();
      if (!ended && round < drafts[s].size() && token == drafts[s][round]) still.push_back(s);
    }
    active.swap(still);
  }
}

}  // namespace dserve
