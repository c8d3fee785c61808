#include "grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <set>

namespace dserve::grammar {
namespace {

ExprPtr make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }

// One UTF-8 byte sequence pattern: per byte, an inclusive byte range.
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;

int encode_utf8(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

// The code points [lo, hi] as UTF-8 byte-range sequences: split at encoded-length
// boundaries, then until every continuation byte spans a full or aligned range, so
// the byte ranges of one sequence combine freely.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>* out) {
  if (lo > hi) return;
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= b && hi > b) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  }
  if (hi >= 0x80) {
    for (int i = 1; i < 4; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_sequences(lo, lo | m, out);
          utf8_sequences((lo | m) + 1, hi, out);
          return;
        }
        if ((hi & m) != m) {
          utf8_sequences(lo, (hi & ~m) - 1, out);
          utf8_sequences(hi & ~m, hi, out);
          return;
        }
      }
    }
  }
  uint8_t a[4], b[4];
  const int n = encode_utf8(lo, a);
  encode_utf8(hi, b);
  ByteRangeSeq seq;
  for (int k = 0; k < n; ++k) seq.emplace_back(a[k], b[k]);
  out->push_back(std::move(seq));
}

Grammar::ByteSet byte_range_set(uint8_t lo, uint8_t hi) {
  Grammar::ByteSet s = {0, 0, 0, 0};
  for (int c = lo; c <= hi; ++c) s[c >> 6] |= uint64_t{1} << (c & 63);
  return s;
}

}  // namespace

ExprPtr literal(std::string bytes) {
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.text = std::move(bytes);
  return make(std::move(e));
}

ExprPtr char_class(CodepointRanges ranges, bool negated) {
  Expr e;
  e.kind = Expr::Kind::kClass;
  e.ranges = normalize_ranges(std::move(ranges), negated);
  return make(std::move(e));
}

ExprPtr rule_ref(std::string name) {
  Expr e;
  e.kind = Expr::Kind::kRef;
  e.text = std::move(name);
  return make(std::move(e));
}

ExprPtr sequence(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.items = std::move(items);
  return make(std::move(e));
}

ExprPtr alternatives(std::vector<ExprPtr> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Expr::Kind::kAlt;
  e.items = std::move(items);
  return make(std::move(e));
}

ExprPtr repeat(ExprPtr item, int min, int max) {
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.items = {std::move(item)};
  e.min = min;
  e.max = max;
  return make(std::move(e));
}

CodepointRanges normalize_ranges(CodepointRanges ranges, bool negated) {
  for (auto& r : ranges) {
    if (r.first > r.second) std::swap(r.first, r.second);
    r.second = std::min(r.second, kMaxCodepoint);
  }
  std::sort(ranges.begin(), ranges.end());
  CodepointRanges merged;
  for (const auto& r : ranges) {
    if (r.first > kMaxCodepoint) continue;
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  if (negated) {
    CodepointRanges complement;
    uint32_t next = 0;
    for (const auto& r : merged) {
      if (r.first > next) complement.emplace_back(next, r.first - 1);
      next = r.second + 1;
    }
    if (next <= kMaxCodepoint) complement.emplace_back(next, kMaxCodepoint);
    merged = std::move(complement);
  }
  // Surrogates are not scalar values: UTF-8 cannot carry them.
  CodepointRanges out;
  for (const auto& r : merged) {
    if (r.second < 0xD800 || r.first > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.first < 0xD800) out.emplace_back(r.first, 0xD7FF);
    if (r.second > 0xDFFF) out.emplace_back(0xE000, r.second);
  }
  return out;
}

namespace {

using Element = Grammar::Element;
using EK = Grammar::ElementKind;

// Lowers Expr rules into per-rule alternative lists of elements.
class Lowerer {
 public:
  explicit Lowerer(const std::map<std::string, ExprPtr>& rules, const std::vector<std::string>& order)
      : rules_(rules) {
    for (const std::string& name : order) new_rule(name);
  }

  Status lower_all(const std::vector<std::string>& order) {
    for (const std::string& name : order) {
      const int32_t id = ids_.at(name);
      const Expr& body = *rules_.at(name);
      if (body.kind == Expr::Kind::kAlt) {
        for (const ExprPtr& item : body.items) {
          std::vector<Element> seq;
          DS_RETURN_IF_ERROR(lower_into(*item, name, &seq));
          alts_[id].push_back(std::move(seq));
        }
      } else {
        std::vector<Element> seq;
        DS_RETURN_IF_ERROR(lower_into(body, name, &seq));
        alts_[id].push_back(std::move(seq));
      }
    }
    return Status::Ok();
  }

  int32_t new_rule(const std::string& name) {
    const auto id = static_cast<int32_t>(alts_.size());
    alts_.emplace_back();
    names_.push_back(name);
    ids_.emplace(name, id);
    return id;
  }

  int32_t new_aux(const std::string& base) {
    std::string name;
    do {
      name = base + "_" + std::to_string(++aux_counter_);
    } while (ids_.count(name) != 0 || rules_.count(name) != 0);
    return new_rule(name);
  }

  Element terminal(const Grammar::ByteSet& set) {
    auto it = terminal_ids_.find(set);
    if (it == terminal_ids_.end()) {
      it = terminal_ids_.emplace(set, static_cast<int32_t>(terminals_.size())).first;
      terminals_.push_back(set);
    }
    return {EK::kTerminal, it->second};
  }

  Element class_rule(const CodepointRanges& ranges, const std::string& base) {
    auto it = class_rules_.find(ranges);
    if (it != class_rules_.end()) return {EK::kRule, it->second};
    const int32_t id = new_aux(base + "_char");
    std::vector<ByteRangeSeq> seqs;
    for (const auto& r : ranges) utf8_sequences(r.first, r.second, &seqs);
    // Single-byte sequences share one terminal.
    Grammar::ByteSet ascii = {0, 0, 0, 0};
    bool any_ascii = false;
    for (const ByteRangeSeq& s : seqs) {
      if (s.size() == 1) {
        const auto set = byte_range_set(s[0].first, s[0].second);
        for (int w = 0; w < 4; ++w) ascii[w] |= set[w];
        any_ascii = true;
        continue;
      }
      std::vector<Element> alt;
      for (const auto& [lo, hi] : s) alt.push_back(terminal(byte_range_set(lo, hi)));
      alts_[id].push_back(std::move(alt));
    }
    if (any_ascii) alts_[id].push_back({terminal(ascii)});
    class_rules_.emplace(ranges, id);
    return {EK::kRule, id};
  }

  Status lower_into(const Expr& e, const std::string& base, std::vector<Element>* seq) {
    switch (e.kind) {
      case Expr::Kind::kBytes:
        for (char c : e.text) {
          const auto b = static_cast<uint8_t>(c);
          seq->push_back(terminal(byte_range_set(b, b)));
        }
        return Status::Ok();
      case Expr::Kind::kClass: {
        if (e.ranges.empty()) {
          // Matches nothing: a rule without alternatives.
          auto it = ids_.find("$never");
          const int32_t id = it != ids_.end() ? it->second : new_rule("$never");
          seq->push_back({EK::kRule, id});
          return Status::Ok();
        }
        if (e.ranges.back().second < 0x80) {
          Grammar::ByteSet set = {0, 0, 0, 0};
          for (const auto& [lo, hi] : e.ranges) {
            const auto s = byte_range_set(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
            for (int w = 0; w < 4; ++w) set[w] |= s[w];
          }
          seq->push_back(terminal(set));
        } else {
          seq->push_back(class_rule(e.ranges, base));
        }
        return Status::Ok();
      }
      case Expr::Kind::kRef: {
        auto it = ids_.find(e.text);
        if (it == ids_.end() || rules_.count(e.text) == 0) {
          return invalid_argument("rule '" + e.text + "' is referenced but not defined");
        }
        seq->push_back({EK::kRule, it->second});
        return Status::Ok();
      }
      case Expr::Kind::kSeq:
        for (const ExprPtr& item : e.items) DS_RETURN_IF_ERROR(lower_into(*item, base, seq));
        return Status::Ok();
      case Expr::Kind::kAlt: {
        if (e.items.size() == 1) return lower_into(*e.items[0], base, seq);
        const int32_t id = new_aux(base);
        for (const ExprPtr& item : e.items) {
          std::vector<Element> alt;
          DS_RETURN_IF_ERROR(lower_into(*item, base, &alt));
          alts_[id].push_back(std::move(alt));
        }
        seq->push_back({EK::kRule, id});
        return Status::Ok();
      }
      case Expr::Kind::kRepeat: {
        if (e.min < 0 || e.max < -1 || (e.max >= 0 && e.max < e.min)) {
          return invalid_argument("repetition bounds {" + std::to_string(e.min) + "," +
                                  std::to_string(e.max) + "} are invalid");
        }
        if (e.min > kMaxRepeat || e.max > kMaxRepeat) {
          return invalid_argument("repetition bound " + std::to_string(std::max(e.min, e.max)) +
                                  " is above the limit of " + std::to_string(kMaxRepeat));
        }
        std::vector<Element> body;
        DS_RETURN_IF_ERROR(lower_into(*e.items[0], base, &body));
        // An item that can match nothing needs no mandatory copies: x+ and x* (x{2,5}
        // and x{0,5}) then match the same strings. Written out, each copy would be one
        // more way for the matcher to pass over x, and nested (((ws)+)+)+ would double
        // the ways at every level.
        const int min = nullable(*e.items[0]) ? 0 : e.min;
        Element unit;
        if (body.size() == 1) {
          unit = body[0];
        } else {
          const int32_t id = new_aux(base);
          alts_[id].push_back(std::move(body));
          unit = {EK::kRule, id};
        }
        for (int i = 0; i < min; ++i) seq->push_back(unit);
        if (e.max == -1) {
          const int32_t star = new_aux(base);
          alts_[star].push_back({unit, {EK::kRule, star}});
          alts_[star].push_back({});
          seq->push_back({EK::kRule, star});
        } else if (e.max > min) {
          int32_t prev = -1;
          for (int k = 0; k < e.max - min; ++k) {
            const int32_t opt = new_aux(base);
            std::vector<Element> alt = {unit};
            if (prev >= 0) alt.push_back({EK::kRule, prev});
            alts_[opt].push_back(std::move(alt));
            alts_[opt].push_back({});
            prev = opt;
          }
          seq->push_back({EK::kRule, prev});
        }
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  // Whether `e` matches the empty string. A rule still being decided counts as not
  // (its other alternatives may still say yes): an answer of no is only ever cautious.
  bool nullable(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kBytes:
        return e.text.empty();
      case Expr::Kind::kClass:
        return false;
      case Expr::Kind::kRef: {
        const auto rule = rules_.find(e.text);
        if (rule == rules_.end()) return false;
        const auto [it, inserted] = nullable_rules_.emplace(e.text, false);
        if (inserted) it->second = nullable(*rule->second);
        return it->second;
      }
      case Expr::Kind::kSeq:
        for (const ExprPtr& item : e.items) {
          if (!nullable(*item)) return false;
        }
        return true;
      case Expr::Kind::kAlt:
        for (const ExprPtr& item : e.items) {
          if (nullable(*item)) return true;
        }
        return false;
      case Expr::Kind::kRepeat:
        return e.min == 0 || nullable(*e.items[0]);
    }
    return false;
  }

  // Left recursion that grows the stack: a cycle of "may start with" edges holding an
  // edge whose reference is not last in its alternative. (A cycle of last-position
  // references, such as a star over a nullable item, expands to a repeated state.)
  Status check_left_recursion() const {
    const size_t n = alts_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : alts_[r]) {
          bool all = true;
          for (const Element& el : alt) {
            if (el.kind != EK::kRule || !nullable[el.value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<int32_t>> edges(n);
    std::vector<std::pair<int32_t, int32_t>> growing;  // non-last edges
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : alts_[r]) {
        for (size_t i = 0; i < alt.size(); ++i) {
          const Element& el = alt[i];
          if (el.kind != EK::kRule) break;
          edges[r].push_back(el.value);
          if (i + 1 < alt.size()) growing.emplace_back(static_cast<int32_t>(r), el.value);
          if (!nullable[el.value]) break;
        }
      }
    }
    for (const auto& [from, to] : growing) {
      // Is `from` reachable from `to`?
      std::vector<bool> seen(n, false);
      std::vector<int32_t> todo = {to};
      seen[to] = true;
      while (!todo.empty()) {
        const int32_t r = todo.back();
        todo.pop_back();
        if (r == from) {
          return invalid_argument("rule '" + names_[from] +
                                  "' is left-recursive (it can begin with itself)");
        }
        for (int32_t s : edges[r]) {
          if (!seen[s]) {
            seen[s] = true;
            todo.push_back(s);
          }
        }
      }
    }
    return Status::Ok();
  }

  struct Flat {
    std::vector<Element> elements;
    std::vector<Grammar::ByteSet> terminals;
    std::vector<std::vector<int32_t>> rule_alts;
    std::vector<std::string> names;
  };
  Flat flatten() const {
    Flat f;
    f.terminals = terminals_;
    f.names = names_;
    f.rule_alts.assign(alts_.size(), {});
    for (size_t r = 0; r < alts_.size(); ++r) {
      for (const auto& alt : alts_[r]) {
        f.rule_alts[r].push_back(static_cast<int32_t>(f.elements.size()));
        f.elements.insert(f.elements.end(), alt.begin(), alt.end());
        f.elements.push_back({EK::kEnd, 0});
      }
    }
    return f;
  }

  int32_t id_of(const std::string& name) const { return ids_.at(name); }

  // Whether `rule` derives at least one finite string.
  bool productive(int32_t rule) const {
    std::vector<bool> p(alts_.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < alts_.size(); ++r) {
        if (p[r]) continue;
        for (const auto& alt : alts_[r]) {
          bool all = true;
          for (const Element& el : alt) {
            if (el.kind == EK::kRule && !p[el.value]) {
              all = false;
              break;
            }
          }
          if (all) {
            p[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    return p[rule];
  }

 private:
  const std::map<std::string, ExprPtr>& rules_;
  std::map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<std::vector<std::vector<Element>>> alts_;
  std::vector<Grammar::ByteSet> terminals_;
  std::map<Grammar::ByteSet, int32_t> terminal_ids_;
  std::map<CodepointRanges, int32_t> class_rules_;
  std::map<std::string, bool> nullable_rules_;  // nullable() of each rule asked about
  int aux_counter_ = 0;
};

}  // namespace

Status GrammarBuilder::add_rule(const std::string& name, ExprPtr body) {
  if (rules_.count(name) != 0) return invalid_argument("rule '" + name + "' is defined twice");
  rules_.emplace(name, std::move(body));
  order_.push_back(name);
  return Status::Ok();
}

Result<std::shared_ptr<const Grammar>> GrammarBuilder::build(const std::string& root) {
  if (rules_.count(root) == 0) return invalid_argument("the grammar has no '" + root + "' rule");
  Lowerer lowerer(rules_, order_);
  DS_RETURN_IF_ERROR(lowerer.lower_all(order_));
  DS_RETURN_IF_ERROR(lowerer.check_left_recursion());
  if (!lowerer.productive(lowerer.id_of(root))) {
    return invalid_argument("rule '" + root + "' matches no finite string");
  }
  auto g = std::shared_ptr<Grammar>(new Grammar());
  Lowerer::Flat f = lowerer.flatten();
  g->elements_ = std::move(f.elements);
  g->terminals_ = std::move(f.terminals);
  g->rule_alts_ = std::move(f.rule_alts);
  g->rule_names_ = std::move(f.names);
  g->root_ = lowerer.id_of(root);
  return std::shared_ptr<const Grammar>(std::move(g));
}

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < rule_alts_.size(); ++r) {
    out += rule_names_[r] + " ::=";
    for (size_t a = 0; a < rule_alts_[r].size(); ++a) {
      if (a > 0) out += " |";
      for (int32_t p = rule_alts_[r][a]; elements_[p].kind != ElementKind::kEnd; ++p) {
        const Element& el = elements_[p];
        if (el.kind == ElementKind::kRule) {
          out += " " + rule_names_[el.value];
          continue;
        }
        out += " [";
        for (int c = 0; c < 256; ++c) {
          if (!terminal_has(el.value, static_cast<uint8_t>(c))) continue;
          int d = c;
          while (d + 1 < 256 && terminal_has(el.value, static_cast<uint8_t>(d + 1))) ++d;
          auto show = [](int b) {
            if (b >= 0x21 && b < 0x7F && b != '\\' && b != ']' && b != '-') return std::string(1, char(b));
            char buf[8];
            snprintf(buf, sizeof buf, "\\x%02X", b);
            return std::string(buf);
          };
          out += show(c);
          if (d > c) {
            out += '-';
            out += show(d);
          }
          c = d;
        }
        out += "]";
      }
      if (elements_[rule_alts_[r][a]].kind == ElementKind::kEnd) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

}  // namespace dserve::grammar
