// `dserve perplexity`: score a text (or a list of token ids) with a model and print
// its perplexity; optionally write every position's log-probability as JSON.
#pragma once

#include <cstdint>
#include <string>

#include "cli/cli_common.h"
#include "cli/tensor_parallel.h"

namespace dserve::cli {

struct PerplexityOptions {
  CommonOptions common;
  TensorParallelOptions tp;
  std::string file;            // text file, tokenised with the model's tokenizer
  std::string token_ids_file;  // or a file of token ids ("1,2,3" / whitespace / JSON list)
  int64_t ctx = 0;             // window length; 0: min(all tokens, max_position_embeddings)
  int64_t batch = 512;         // tokens per forward() call inside a window
  std::string logprobs_out;    // JSON output path, empty: none
};

int run_perplexity(const PerplexityOptions& options);

}  // namespace dserve::cli
