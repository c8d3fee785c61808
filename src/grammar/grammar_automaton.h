// GrammarAutomaton: the lazily built automaton of one Grammar over one vocabulary,
// shared by every sequence constrained by that grammar (GrammarMatcher holds a state id
// in it), so a state's mask is computed once for all of them. Its states are sets of
// parse stacks of the grammar (a pushdown automaton run over bytes, all alternatives
// at once).
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
// Memory grows with the number of distinct states visited (StructuredOutputCompiler
// starts a new automaton when one grows past a limit).
//
// Thread-safety: thread-safe; one mutex guards everything (a first-time mask walk
// holds it for its duration; a cached mask is a copy).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_vocabulary.h"


namespace dserve::grammar {

class GrammarAutomaton {
 public:
  GrammarAutomaton(std::shared_ptr<const Grammar> grammar,
                   std::shared_ptr<const TokenVocabulary> vocab);
  GrammarAutomaton(const GrammarAutomaton&) = delete;
  GrammarAutomaton& operator=(const GrammarAutomaton&) = delete;

  // What a state knows without the lock (fixed when the state is created).
  struct StateInfo {
    int32_t id = -1;         // -1: no state (the input cannot continue a match)
    bool accepting = false;  // the input so far is a complete match
    bool has_stacks = false;  // more bytes may follow
  };
  StateInfo initial() const { return initial_; }
  // The state after `bytes` from `state`; id -1 if they cannot continue a match.
  StateInfo advance(int32_t state, std::string_view bytes);
  // ORs the ids allowed after `state` into allowed ([ceil(vocab / 64)] words).
  void fill_allowed(int32_t state, std::span<uint64_t> allowed);
  // Distinct states created so far (memory accounting).
  size_t n_states() const;
  // Past its memory budget (states, cached masks): give new sequences a new automaton.
  bool full() const;
  // Whether the automaton had to cut work short somewhere: a state whose expansion took
  // more than kMaxExpansion steps (a grammar whose ways to go on multiply with its
  // nesting, such as ((a?){2}){2}..., or with the input, as nested x+ over any
  // character) keeps only the parse stacks found within that budget; a mask whose walk
  // of the vocabulary took more than kMaskWorkPerTrieNode steps per trie node leaves
  // the rest of the vocabulary refused. Either way the output
  // still matches the grammar, but may be refused some of what it allows (an empty mask
  // leaves the stop tokens). compile_grammar() refuses a grammar whose first state is cut.
  bool too_complex() const;
  static constexpr size_t kMaxExpansion = size_t{1} << 15;
  static constexpr size_t kMaskWorkPerTrieNode = 64;
  const TokenVocabulary& vocabulary() const { return *vocab_; }

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

  StateInfo info(int32_t id) const;
  int32_t intern_node(int32_t pos, int32_t parent);
  // Adds the terminal-topped stacks reachable from (pos, parent) without input.
  void expand(int32_t pos, int32_t parent);
  // The state after `byte` from state `set`; -1 when no stack accepts the byte.
  int32_t step(int32_t set, uint8_t byte);
  int32_t compute_step(int32_t set, uint8_t byte);
  int32_t intern_set();  // from scratch_ / scratch_accepting_

  const std::shared_ptr<const Grammar> grammar_;
  const std::shared_ptr<const TokenVocabulary> vocab_;
  StateInfo initial_;  // set by the constructor, then constant

  mutable std::mutex mu_;  // guards every member below
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<StateSet> sets_;
  std::unordered_map<std::string, int32_t> set_ids_;
  // Open addressing: key (set << 8 | byte) + 1 (0: empty slot) -> state (or -1).
  std::vector<uint64_t> trans_keys_;
  std::vector<int32_t> trans_values_;
  size_t n_trans_ = 0;
  size_t n_masks_ = 0;

  // Scratch of expand(): the stacks found, the (pos, parent) pairs already visited and
  // those still to expand.
  std::vector<int32_t> scratch_;
  bool scratch_accepting_ = false;
  std::unordered_set<uint64_t> visited_;
  std::vector<std::pair<int32_t, int32_t>> todo_;
  bool too_complex_ = false;
  size_t work_ = 0;  // stacks stepped and pairs expanded, ever: what budgets count
  std::vector<int32_t> walk_;  // [max_depth + 1] states along the trie path
};

}  // namespace dserve::grammar
