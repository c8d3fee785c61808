// Prompt-lookup drafts (vLLM's "ngram" method): the tokens that followed the latest
// earlier occurrence of the sequence's own ending. Code edits, rewrites, quotes and
// structured answers repeat their prompt, so the continuation is often a copy.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dserve::spec {

// tokens: the sequence so far (prompt and output). Finds the longest suffix of
// length n in [n_min, n_max] that also ends earlier in tokens (the latest such place
// among those of that length) and returns up to k tokens that followed it there.
// Empty when no suffix of n_min tokens recurs. O(tokens.size() x n_max) at worst.
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int n_min, int n_max, int k);

}  // namespace dserve::spec
