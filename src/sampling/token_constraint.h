// TokenConstraint: what the sampler needs from constrained decoding (structured output):
// the set of token ids allowed next, and a way to advance after a token is chosen. The
// grammar engine (src/grammar/) implements it; sampling knows nothing about JSON,
// regexes or grammars.
//
// Stop ids (eos, stop_token_ids) are the sampler's business: a constraint speaks only
// of text tokens, and says through is_complete() whether the sequence may end here.
//
// Thread-safety: one constraint belongs to one sequence; fill_allowed() may update
// caches, so a constraint is used by one thread at a time (the thread sampling its
// sequence in a step, then the engine thread accepting the token).
#pragma once

#include <cstdint>
#include <span>

namespace dserve {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // allowed: [ceil(vocab / 64)] words, zeroed by the caller; sets bit i (word i / 64,
  // bit i % 64) iff token i may come next.
  virtual void fill_allowed(std::span<uint64_t> allowed) = 0;
  // Advances past a generated token; false, and nothing changes, if it was not allowed.
  virtual bool accept(int32_t token) = 0;
  // Whether the output so far is complete, so that a stop id may end it.
  virtual bool is_complete() const = 0;
};

}  // namespace dserve
