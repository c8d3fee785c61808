#include "grammar/grammar_automaton.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace dserve::grammar {
namespace {

using EK = Grammar::ElementKind;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

}  // namespace

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar,
                                   std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  trans_keys_.assign(1024, 0);
  trans_values_.assign(1024, 0);
  scratch_.clear();
  scratch_accepting_ = false;
  visited_.clear();
  for (int32_t alt : grammar_->alternatives_of(grammar_->root())) expand(alt, -1);
  int32_t first = intern_set();
  if (first < 0) {
    // A root that matches nothing: an empty, non-accepting state (no token allowed).
    sets_.push_back(StateSet{});
    first = static_cast<int32_t>(sets_.size()) - 1;
  }
  initial_ = info(first);
  walk_.resize(static_cast<size_t>(vocab_->max_depth()) + 1);
}

GrammarAutomaton::StateInfo GrammarAutomaton::info(int32_t id) const {
  StateInfo s;
  if (id < 0) return s;
  s.id = id;
  s.accepting = sets_[id].accepting;
  s.has_stacks = !sets_[id].stacks.empty();
  return s;
}

bool GrammarAutomaton::full() const {
  std::lock_guard<std::mutex> lock(mu_);
  // 16 MiB of cached masks (~1,000 states at a 129k vocabulary), or a million states.
  return n_masks_ * static_cast<size_t>(vocab_->size()) / 8 > (size_t{16} << 20) ||
         sets_.size() > (size_t{1} << 20);
}

bool GrammarAutomaton::too_complex() const {
  std::lock_guard<std::mutex> lock(mu_);
  return too_complex_;
}

size_t GrammarAutomaton::n_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sets_.size();
}

int32_t GrammarAutomaton::intern_node(int32_t pos, int32_t parent) {
  const uint64_t key = pair_key(pos, parent);
  auto [it, inserted] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void GrammarAutomaton::expand(int32_t start_pos, int32_t start_parent) {
  const auto& el = grammar_->elements();
  // The (pos, parent) pairs still to expand, on a stack of our own rather than C++'s: a
  // path that matches nothing can run through as many rules as the grammar has (a
  // thousand optional items in a row), deeper than the call stack allows.
  todo_.clear();
  todo_.emplace_back(start_pos, start_parent);
  while (!todo_.empty()) {
    auto [pos, parent] = todo_.back();
    todo_.pop_back();
    for (;;) {
      if (!visited_.insert(pair_key(pos, parent)).second) break;
      ++work_;
      if (visited_.size() > kMaxExpansion) {
        too_complex_ = true;  // the state keeps the stacks found so far
        todo_.clear();
        return;
      }
      const Grammar::Element e = el[pos];
      switch (e.kind) {
        case EK::kTerminal:
          scratch_.push_back(intern_node(pos, parent));
          break;
        case EK::kEnd:
          if (parent < 0) {
            scratch_accepting_ = true;
            break;
          }
          pos = nodes_[parent].pos;
          parent = nodes_[parent].parent;
          continue;  // return to the caller's frame
        case EK::kRule: {
          // A reference last in its alternative returns straight to our caller. The
          // alternatives go on the stack last first, so they expand in order.
          const int32_t ret = el[pos + 1].kind == EK::kEnd ? parent : intern_node(pos + 1, parent);
          const std::vector<int32_t>& alts = grammar_->alternatives_of(e.value);
          for (auto alt = alts.rbegin(); alt != alts.rend(); ++alt) todo_.emplace_back(*alt, ret);
          break;
        }
      }
      break;
    }
  }
}

int32_t GrammarAutomaton::intern_set() {
  std::sort(scratch_.begin(), scratch_.end());
  scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
  if (scratch_.empty() && !scratch_accepting_) return -1;
  std::string key(reinterpret_cast<const char*>(scratch_.data()), scratch_.size() * sizeof(int32_t));
  key.push_back(scratch_accepting_ ? '\1' : '\0');
  auto [it, inserted] = set_ids_.emplace(std::move(key), static_cast<int32_t>(sets_.size()));
  if (inserted) {
    StateSet s;
    s.stacks = scratch_;
    s.accepting = scratch_accepting_;
    sets_.push_back(std::move(s));
  }
  return it->second;
}

int32_t GrammarAutomaton::compute_step(int32_t set, uint8_t byte) {
  scratch_.clear();
  scratch_accepting_ = false;
  visited_.clear();
  // Copy: expand() may intern nodes, but sets_ does not change until intern_set().
  work_ += sets_[set].stacks.size();
  for (int32_t id : sets_[set].stacks) {
    const Node n = nodes_[id];
    const Grammar::Element e = grammar_->elements()[n.pos];
    if (grammar_->terminal_has(e.value, byte)) expand(n.pos + 1, n.parent);
  }
  return intern_set();
}

int32_t GrammarAutomaton::step(int32_t set, uint8_t byte) {
  const uint64_t key = ((static_cast<uint64_t>(set) << 8) | byte) + 1;
  size_t mask = trans_keys_.size() - 1;
  size_t i = mix(key) & mask;
  while (trans_keys_[i] != 0) {
    if (trans_keys_[i] == key) return trans_values_[i];
    i = (i + 1) & mask;
  }
  const int32_t next = compute_step(set, byte);
  if (2 * (n_trans_ + 1) > trans_keys_.size()) {
    std::vector<uint64_t> keys(trans_keys_.size() * 2, 0);
    std::vector<int32_t> values(keys.size(), 0);
    mask = keys.size() - 1;
    for (size_t j = 0; j < trans_keys_.size(); ++j) {
      if (trans_keys_[j] == 0) continue;
      size_t k = mix(trans_keys_[j]) & mask;
      while (keys[k] != 0) k = (k + 1) & mask;
      keys[k] = trans_keys_[j];
      values[k] = trans_values_[j];
    }
    trans_keys_ = std::move(keys);
    trans_values_ = std::move(values);
    i = mix(key) & mask;
    while (trans_keys_[i] != 0) i = (i + 1) & mask;
  }
  trans_keys_[i] = key;
  trans_values_[i] = next;
  ++n_trans_;
  return next;
}

void GrammarAutomaton::fill_allowed(int32_t state, std::span<uint64_t> allowed) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n_words = (static_cast<size_t>(vocab_->size()) + 63) / 64;
  DS_CHECK(allowed.size() >= n_words);
  if (sets_[state].mask.empty()) {
    std::vector<uint64_t> mask(n_words, 0);
    const TokenVocabulary& v = *vocab_;
    if (!sets_[state].stacks.empty()) {
      walk_[0] = state;
      const int32_t n = v.n_nodes();
      const size_t work_limit = work_ + kMaskWorkPerTrieNode * static_cast<size_t>(n);
      for (int32_t i = 0; i < n;) {
        if (work_ > work_limit) {
          too_complex_ = true;  // the tokens not reached yet stay refused
          break;
        }
        const int32_t d = v.node_depth(i);
        const int32_t next = step(walk_[d - 1], v.node_byte(i));
        if (next < 0) {
          i = v.subtree_end(i);
          continue;
        }
        walk_[d] = next;
        for (int32_t id : v.node_tokens(i)) mask[id >> 6] |= uint64_t{1} << (id & 63);
        ++i;
      }
    }
    sets_[state].mask = std::move(mask);
    ++n_masks_;
  }
  const std::vector<uint64_t>& mask = sets_[state].mask;
  for (size_t w = 0; w < n_words; ++w) allowed[w] |= mask[w];
}

GrammarAutomaton::StateInfo GrammarAutomaton::advance(int32_t state, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  int32_t s = state;
  for (char c : bytes) {
    s = step(s, static_cast<uint8_t>(c));
    if (s < 0) return StateInfo{};
  }
  return info(s);
}

}  // namespace dserve::grammar
