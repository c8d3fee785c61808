// Grammar: a context-free grammar over bytes, the common target of every structured
// output form (JSON schema, regex, choice list, GBNF text). Front ends build rules
// from Expr trees (literals, Unicode character classes, rule references, sequences,
// alternatives, bounded repetition); GrammarBuilder::build lowers them into a flat
// form the matcher walks:
//
//   elements: one array; each alternative of each rule is a run of elements ending in
//             kEnd. An element is a terminal (a set of bytes), or a reference to a rule.
//   rules:    per rule, the positions where its alternatives start.
//
// Non-ASCII character classes become rules of UTF-8 byte sequences, so one token may
// end inside a character and the next one finish it. Repetition becomes right-
// recursive helper rules. build() refuses undefined rules and left recursion (which
// the matcher could not expand), naming the rule.
//
// Thread-safety: Expr trees and a built Grammar are immutable and may be shared.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dserve::grammar {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

// Unicode code point ranges, inclusive.
using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

struct Expr {
  enum class Kind { kBytes, kClass, kRef, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kBytes;
  std::string text;             // kBytes: the literal bytes (empty: matches nothing, "")
                                // kRef: the rule name
  CodepointRanges ranges;       // kClass: code points matched (negation already applied)
  std::vector<ExprPtr> items;   // kSeq, kAlt; kRepeat: items[0]
  int min = 0, max = -1;        // kRepeat: count bounds; max -1: unbounded
};

ExprPtr literal(std::string bytes);
// ranges may overlap and be unsorted; negated: every scalar value (no surrogates) not in them.
ExprPtr char_class(CodepointRanges ranges, bool negated = false);
ExprPtr rule_ref(std::string name);
ExprPtr sequence(std::vector<ExprPtr> items);
ExprPtr alternatives(std::vector<ExprPtr> items);
ExprPtr repeat(ExprPtr item, int min, int max);
// Largest repetition bound accepted (each repetition is expanded into helper rules).
inline constexpr int kMaxRepeat = 4096;

// Sorted, merged, surrogates removed; negated: the complement within [0, kMaxCodepoint].
CodepointRanges normalize_ranges(CodepointRanges ranges, bool negated);

class Grammar {
 public:
  enum class ElementKind : uint8_t { kTerminal, kRule, kEnd };
  struct Element {
    ElementKind kind;
    int32_t value;  // kTerminal: index into terminals; kRule: rule id
  };
  using ByteSet = std::array<uint64_t, 4>;

  const std::vector<Element>& elements() const { return elements_; }
  bool terminal_has(int32_t terminal, uint8_t byte) const {
    return (terminals_[terminal][byte >> 6] >> (byte & 63)) & 1;
  }
  const std::vector<int32_t>& alternatives_of(int32_t rule) const { return rule_alts_[rule]; }
  int32_t root() const { return root_; }
  size_t n_rules() const { return rule_alts_.size(); }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  // The flat form as GBNF-like text, for debugging and error messages.
  std::string to_string() const;

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<ByteSet> terminals_;
  std::vector<std::vector<int32_t>> rule_alts_;  // per rule: start positions in elements_
  std::vector<std::string> rule_names_;
  int32_t root_ = 0;
};

// Collects named rules, then lowers them. Not thread-safe; use once.
class GrammarBuilder {
 public:
  // InvalidArgument if `name` is already defined.
  Status add_rule(const std::string& name, ExprPtr body);
  bool has_rule(const std::string& name) const { return rules_.count(name) != 0; }
  // InvalidArgument naming an undefined rule, a left-recursive rule, a missing root or
  // a repetition bound above kMaxRepeat.
  Result<std::shared_ptr<const Grammar>> build(const std::string& root = "root");

 private:
  std::map<std::string, ExprPtr> rules_;
  std::vector<std::string> order_;  // definition order, for stable rule ids
};

}  // namespace dserve::grammar
