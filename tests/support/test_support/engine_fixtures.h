// The small engine configuration, greedy sampling and synthetic prompts that the
// engine tests (single, async, data-parallel, lockstep) run the tiny Llama with.
#pragma once

#include <cstdint>
#include <vector>

#include "dserve/async_llm.h"

namespace dserve::test {

// 8 sequences, 64 tokens a step, blocks of 4 tokens in 4 MiB of KV cache, 200 tokens
// a sequence, one thread.
LlmOptions small_engine_options();

// Greedy decoding of exactly max_tokens tokens (EOS ignored), n sequences.
SamplingOptions greedy(int max_tokens, int n = 1);

// Prompt i: 3 + (i * 7) % length_spread token ids below vocab, all prompts different.
std::vector<int32_t> prompt_of(int i, int length_spread, int vocab);

}  // namespace dserve::test
