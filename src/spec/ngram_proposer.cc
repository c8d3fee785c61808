#include "spec/ngram_proposer.h"

#include <algorithm>

namespace dserve::spec {

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int n_min, int n_max,
                                   int k) {
  const int64_t t = static_cast<int64_t>(tokens.size());
  if (k <= 0 || n_min < 1 || t < n_min + 1) return {};
  // Scan candidate end positions e < t - 1 from the latest back, measuring how many
  // tokens before and at e agree with the sequence's ending (at most n_max).
  int64_t best_end = -1;
  int best_len = n_min - 1;
  for (int64_t e = t - 2; e >= 0; --e) {
    int len = 0;
    while (len < n_max && len <= e && tokens[e - len] == tokens[t - 1 - len]) ++len;
    if (len > best_len) {
      best_len = len;
      best_end = e;
      if (len == n_max) break;  // nothing longer can be found
    }
  }
  if (best_end < 0) return {};
  const int64_t from = best_end + 1;
  const int64_t to = std::min<int64_t>(from + k, t);
  return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
}

}  // namespace dserve::spec
