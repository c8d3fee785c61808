// SampleResult: what sampling one position gives: the token and, when asked for, its
// log-probability, rank and the best alternatives. A leaf header, so that the public
// API (include/dserve) can name it without the sampler.
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>
#include <vector>

namespace dserve {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  // Set only when the request asked for logprobs (params().logprobs()).
  float logprob = 0.0f;                    // raw log-prob of `token`
  int32_t rank = 0;                        // 1 + #tokens with a higher raw log-prob (ties counted)
  std::vector<TokenLogprob> top_logprobs;  // the best logprobs() ids, best first (ties: lower id)
};

}  // namespace dserve
