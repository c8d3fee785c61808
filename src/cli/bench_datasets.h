// Benchmark prompts, shared by `dserve bench throughput` and `dserve bench serve`, sampled
// as vLLM's benchmarks/datasets.py samples them:
//   random             random tokens decoded to text whose re-encoding has the asked
//                      length (+- --random-range-ratio), after an optional shared prefix;
//   sharegpt           the first two turns of ShareGPT conversations (prompt, reply), the
//                      reply's token count as the output length, too short / too long
//                      pairs dropped, order shuffled with the seed;
//   prefix-repetition  --num-prefixes random prefixes, each shared by an equal share of
//                      the prompts, followed by a random suffix.
// Token counts use dserve's own Tokenizer, so they are what a dserve server counts.
//
// Thread-safety: pure functions of their arguments (the Tokenizer is immutable).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace dserve {
class Tokenizer;
}

namespace dserve::cli {

struct SampleRequest {
  std::string prompt;               // the text to send (empty for raw-id random prompts)
  std::vector<int32_t> prompt_ids;  // the prompt as the server tokenizes it (with BOS etc.)
  int prompt_len = 0;               // == prompt_ids.size()
  int expected_output_len = 0;      // max_tokens to ask for
};

struct RandomDatasetOptions {
  int num_prompts = 1000;
  int input_len = 1024;  // tokens per prompt including the prefix and special tokens
  int output_len = 128;
  double range_ratio = 0;  // lengths uniform in [len * (1 - r), len * (1 + r)], 0 <= r < 1
  int prefix_len = 0;      // random tokens shared by every prompt, before its own
  uint64_t seed = 0;
};

// Text prompts of random non-special tokens. InvalidArgument for impossible options.
Result<std::vector<SampleRequest>> sample_random(const Tokenizer& tokenizer,
                                                 const RandomDatasetOptions& options);
// Without a tokenizer: prompts of uniformly random ids in [0, vocab_size), no text.
Result<std::vector<SampleRequest>> sample_random_ids(int64_t vocab_size,
                                                     const RandomDatasetOptions& options);

struct ShareGptOptions {
  std::string path;  // a JSON list of {"conversations": [{"from", "value"}, ...]}
  int num_prompts = 1000;
  int output_len = 0;  // > 0: this output length for every prompt (no minimum check)
  uint64_t seed = 0;
  // Fewer usable conversations than num_prompts: repeat random ones to make up the
  // count (vLLM's oversampling); otherwise return what there is.
  bool oversample = true;
};

// vLLM's is_valid_sequence: prompt >= 4 and <= 1024 tokens, output >= 4 tokens (unless
// the output length was given), prompt + output <= 2048.
bool sharegpt_pair_is_valid(int prompt_len, int output_len, bool skip_min_output_check);

Result<std::vector<SampleRequest>> sample_sharegpt(const Tokenizer& tokenizer,
                                                   const ShareGptOptions& options);
// The same over an already parsed file; `source` names it in errors.
Result<std::vector<SampleRequest>> sample_sharegpt_json(const Tokenizer& tokenizer,
                                                        const nlohmann::json& data,
                                                        const ShareGptOptions& options,
                                                        const std::string& source);

struct PrefixRepetitionOptions {
  int num_prompts = 1000;  // rounded down to a multiple of num_prefixes
  int prefix_len = 256;
  int suffix_len = 256;
  int num_prefixes = 10;
  int output_len = 128;
  uint64_t seed = 0;
};

Result<std::vector<SampleRequest>> sample_prefix_repetition(const Tokenizer& tokenizer,
                                                            const PrefixRepetitionOptions& options);

}  // namespace dserve::cli
