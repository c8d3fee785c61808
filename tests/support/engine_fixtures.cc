#include "test_support/engine_fixtures.h"

namespace dserve::test {

LlmOptions small_engine_options() {
  LlmOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  o.block_size = 4;
  o.kv_cache_memory = 4 << 20;
  o.max_model_len = 200;
  o.n_threads = 1;
  return o;
}

SamplingOptions greedy(int max_tokens, int n) {
  SamplingOptions o;
  o.temperature = 0.0f;
  o.ignore_eos = true;
  o.max_tokens = max_tokens;
  o.n = n;
  return o;
}

std::vector<int32_t> prompt_of(int i, int length_spread, int vocab) {
  std::vector<int32_t> p(3 + (i * 7) % length_spread);
  for (size_t k = 0; k < p.size(); ++k) p[k] = static_cast<int32_t>((i * 13 + k * 5) % vocab);
  return p;
}

}  // namespace dserve::test
