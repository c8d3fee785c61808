// GrammarMatcher: one sequence's position in constrained decoding: a state of a
// GrammarAutomaton (shared by all sequences under the same grammar and vocabulary,
// which caches states, transitions and masks). This is the TokenConstraint the
// sampler applies.
//
// Thread-safety: a matcher belongs to one sequence and is used by one thread at a
// time; the automaton behind it is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "grammar/grammar_automaton.h"
#include "sampling/token_constraint.h"

namespace dserve::grammar {

class GrammarMatcher final : public TokenConstraint {
 public:
  explicit GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton)
      : automaton_(std::move(automaton)), state_(automaton_->initial()) {}
  // With an automaton of its own.
  GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                 std::shared_ptr<const TokenVocabulary> vocab)
      : GrammarMatcher(std::make_shared<GrammarAutomaton>(std::move(grammar), std::move(vocab))) {}
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  void fill_allowed(std::span<uint64_t> allowed) override {
    automaton_->fill_allowed(state_.id, allowed);
  }
  bool accept(int32_t token) override {
    const TokenVocabulary& v = automaton_->vocabulary();
    if (token < 0 || token >= v.size() || v.bytes(token).empty()) return false;
    return accept_bytes(v.bytes(token));
  }
  bool is_complete() const override { return state_.accepting; }

  // Advances past raw bytes; false, and nothing changes, if they cannot continue a match.
  bool accept_bytes(std::string_view bytes) {
    const GrammarAutomaton::StateInfo next = automaton_->advance(state_.id, bytes);
    if (next.id < 0) return false;
    state_ = next;
    return true;
  }
  // Whether more bytes could follow (false once only the end is possible).
  bool can_continue() const { return state_.has_stacks; }
  const GrammarAutomaton& automaton() const { return *automaton_; }

 private:
  std::shared_ptr<GrammarAutomaton> automaton_;
  GrammarAutomaton::StateInfo state_;
};

}  // namespace dserve::grammar
