// GrammarMatcher: the state of one sequence's constrained decoding, as a set of parse
// stacks of a Grammar (a pushdown automaton run over bytes, all alternatives at once).
//
// A stack is an immutable linked list of grammar positions (the top is always a
// terminal); stacks are interned, so equal stacks are one node and a state (a set of
// stacks, plus whether the input so far is a complete match) is a sorted list of node
// ids, itself interned. Transitions (state, byte) -> state are computed once and kept
// in a hash table, so the mask of a state is a walk of the vocabulary trie doing one
// table lookup per trie node, skipping whole subtrees at the first byte that fails;
// masks are cached per state (inside a JSON string the state repeats each step).
// A reference to a rule at the end of an alternative reuses the caller's frame, so
// right recursion (x*, strings) does not grow the stack.
//
// Memory grows with the number of distinct states visited, which the vocabulary and
// the grammar bound; one matcher serves one sequence.
//
// Thread-safety: not thread-safe (fill_allowed updates caches); one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_vocabulary.h"
#include "sampling/token_constraint.h"

namespace dserve::grammar {

class GrammarMatcher final : public TokenConstraint {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                 std::shared_ptr<const TokenVocabulary> vocab);
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  void fill_allowed(std::span<uint64_t> allowed) override;
  bool accept(int32_t token) override;
  bool is_complete() const override { return sets_[current_].accepting; }

  // Advances past raw bytes; false, and nothing changes, if they cannot continue a match.
  bool accept_bytes(std::string_view bytes);
  // Whether more bytes could follow (false once only the end is possible).
  bool can_continue() const { return !sets_[current_].stacks.empty(); }
  // Distinct states created so far (for tests and memory accounting).
  size_t n_states() const { return sets_.size(); }

 private:
  struct Node {
    int32_t pos;     // position in grammar elements of the next thing to match
    int32_t parent;  // node to return to when this rule's alternative ends; -1: none
  };
  struct StateSet {
    std::vector<int32_t> stacks;  // sorted node ids whose top is a terminal
    bool accepting = false;       // some stack is empty: the input is a complete match
    std::vector<uint64_t> mask;   // cached allowed-token bits, empty until computed
  };

  int32_t intern_node(int32_t pos, int32_t parent);
  // Adds the terminal-topped stacks reachable from (pos, parent) without input.
  void expand(int32_t pos, int32_t parent);
  // The state after `byte` from state `set`; -1 when no stack accepts the byte.
  int32_t step(int32_t set, uint8_t byte);
  int32_t compute_step(int32_t set, uint8_t byte);
  int32_t intern_set();  // from scratch_ / scratch_accepting_

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<StateSet> sets_;
  std::unordered_map<std::string, int32_t> set_ids_;
  // Open addressing: key (set << 8 | byte) + 1 (0: empty slot) -> state (or -1).
  std::vector<uint64_t> trans_keys_;
  std::vector<int32_t> trans_values_;
  size_t n_trans_ = 0;
  int32_t current_ = 0;

  // Scratch of expand(): the stacks found and the (pos, parent) pairs already visited.
  std::vector<int32_t> scratch_;
  bool scratch_accepting_ = false;
  std::unordered_set<uint64_t> visited_;
  std::vector<int32_t> walk_;  // [max_depth + 1] states along the trie path
};

}  // namespace dserve::grammar
