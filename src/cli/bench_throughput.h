// `dserve bench throughput`: offline throughput as vLLM's `vllm bench throughput`
// measures it: N prompts (random token ids, or ShareGPT conversations) submitted at
// once to the engine through the public LLM API, ignore_eos on, timed from the first
// step to the last output; prints requests/s, input, output and total tokens/s.
#pragma once

#include <cstdint>
#include <string>

#include "cli/cli_common.h"

namespace dserve::cli {

struct BenchThroughputOptions {
  CommonOptions common;
  std::string dataset_name = "random";  // "random" or "sharegpt"
  std::string dataset_path;             // ShareGPT JSON (sharegpt only)
  int num_prompts = 100;
  int input_len = 1024;  // random: prompt tokens
  int output_len = 0;  // generated tokens; 0: 128 (random) or the reply's length (sharegpt)
  uint64_t seed = 0;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int block_size = 16;
  int64_t kv_cache_memory = 0;  // 0: 1 GiB, or less under a tight memory limit
  std::string kv_cache_dtype = "auto";  // auto (float16), float16 or float32
  int max_model_len = 0;
  bool no_enable_prefix_caching = false;
  // Every request the first one's prompt, sampled with one seed: the streams stay the
  // same token for token (the engine is batch invariant), as llama-batched-bench's
  // parallel sequences of one prompt, so that a MoE model's batch routes to the experts
  // of one sequence. For like-for-like comparisons; real traffic is --identical-requests off.
  bool identical_requests = false;
  // Run requests of the same shapes (other random prompts, so that no cached prefix
  // is reused) once before the timed run, as llama-bench's warm-up pass: the first
  // touches of the mapped weights' pages and the buffers' growth are then not timed.
  bool warmup = false;
  std::string output_json;  // also write the results here
};

// Returns the process exit code; errors are reported as one line on stderr.
int run_bench_throughput(const BenchThroughputOptions& options);

}  // namespace dserve::cli
