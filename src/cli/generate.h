// `dserve generate`: run a prompt through a model and stream the continuation to
// stdout, then report prompt and decode speed on stderr.
#pragma once

#include <cstdint>
#include <string>

#include "cli/cli_common.h"
#include "cli/tensor_parallel.h"
#include "sampling/sampling_params.h"

namespace dserve::cli {

struct GenerateOptions {
  CommonOptions common;
  TensorParallelOptions tp;
  std::string prompt;      // text, tokenised with the model's tokenizer
  std::string prompt_ids;  // or token ids directly ("1,2,3"), for developers and tests
  int max_tokens = 128;
  uint64_t seed = 0;
  // temperature, top_k, top_p, min_p, penalties, stop strings, min_tokens; max_tokens,
  // seed and ignore_eos are taken from the fields here.
  SamplingOptions sampling;
  bool ignore_eos = false;  // keep going past end-of-sequence tokens
  bool print_ids = false;   // print generated ids (one line, comma-separated) instead of text
};

// Returns the process exit code; errors are reported as one line on stderr.
int run_generate(const GenerateOptions& options);

}  // namespace dserve::cli
