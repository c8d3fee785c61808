#include "grammar/gbnf_parser.h"

#include <string>

#include "grammar/utf8_reader.h"

namespace dserve::grammar {
namespace {

bool is_name_char(uint32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

class GbnfParser {
 public:
  GbnfParser(std::string_view text, GrammarBuilder* builder) : text_(text), r_(text), b_(builder) {}

  Status parse() {
    skip_space();
    if (r_.done()) return invalid_argument("grammar: the grammar is empty");
    while (!r_.done()) {
      const size_t at = r_.offset();
      std::string name = read_name();
      if (name.empty()) return error("expected a rule name");
      skip_space();
      if (!consume("::=")) return error("expected '::=' after rule name '" + name + "'");
      DS_ASSIGN_OR_RETURN(ExprPtr body, alternation(0));
      skip_space();
      if (!r_.done() && r_.peek() == ')') return error("unbalanced ')'");
      Status s = b_->add_rule(name, std::move(body));
      if (!s.ok()) {
        r_.seek(at);
        return error(s.message());
      }
    }
    return Status::Ok();
  }

 private:
  Status error(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < r_.offset() && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return invalid_argument("grammar: " + what + " at line " + std::to_string(line) +
                            ", column " + std::to_string(col));
  }

  void skip_space() {
    while (!r_.done()) {
      const uint32_t c = r_.peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        r_.next();
      } else if (c == '#') {
        while (!r_.done() && r_.peek() != '\n') r_.next();
      } else {
        break;
      }
    }
  }

  bool consume(std::string_view s) {
    if (text_.substr(r_.offset(), s.size()) != s) return false;
    r_.seek(r_.offset() + s.size());
    return true;
  }

  std::string read_name() {
    std::string name;
    while (!r_.done() && is_name_char(r_.peek())) name.push_back(static_cast<char>(r_.next()));
    return name;
  }

  // At a rule definition `name ::=`? (Then the current rule has ended.)
  bool at_rule_start() {
    const size_t save = r_.offset();
    const std::string name = read_name();
    skip_space();
    const bool yes = !name.empty() && text_.substr(r_.offset(), 3) == "::=";
    r_.seek(save);
    return yes;
  }

  Result<ExprPtr> alternation(int depth) {
    if (depth > 200) return error("groups nested too deeply");
    std::vector<ExprPtr> alts;
    for (;;) {
      std::vector<ExprPtr> seq;
      for (;;) {
        skip_space();
        if (r_.done()) break;
        const uint32_t c = r_.peek();
        if (c == '|' || c == ')') break;
        if (is_name_char(c) && at_rule_start()) break;
        DS_ASSIGN_OR_RETURN(ExprPtr a, atom(depth));
        DS_ASSIGN_OR_RETURN(ExprPtr q, quantified(std::move(a), depth));
        seq.push_back(std::move(q));
      }
      alts.push_back(seq.empty() ? literal("") : sequence(std::move(seq)));
      if (r_.done() || r_.peek() != '|') break;
      r_.next();
    }
    return alternatives(std::move(alts));
  }

  Result<int> number() {
    skip_space();
    int n = 0;
    bool any = false;
    while (!r_.done() && r_.peek() >= '0' && r_.peek() <= '9') {
      n = n * 10 + static_cast<int>(r_.next() - '0');
      if (n > 1000000) return error("repetition count too large");
      any = true;
    }
    skip_space();
    return any ? n : -1;
  }

  // Quantifiers may follow one another (x+? is an optional x+); each nests the item one
  // level deeper, so they count against the same depth limit as groups.
  Result<ExprPtr> quantified(ExprPtr e, int depth) {
    for (;; ++depth) {
      if (r_.done()) return e;
      if (depth > 200) return error("quantifiers nested too deeply");
      const uint32_t c = r_.peek();
      int min = 0, max = -1;
      if (c == '*') {
        r_.next();
      } else if (c == '+') {
        r_.next();
        min = 1;
      } else if (c == '?') {
        r_.next();
        max = 1;
      } else if (c == '{') {
        r_.next();
        DS_ASSIGN_OR_RETURN(int lo, number());
        if (lo < 0) return error("expected a number after '{'");
        int hi = lo;
        if (!r_.done() && r_.peek() == ',') {
          r_.next();
          DS_ASSIGN_OR_RETURN(hi, number());
        }
        if (r_.done() || r_.next() != '}') return error("expected '}'");
        if (hi >= 0 && hi < lo) return error("repetition {m,n} with n < m");
        min = lo;
        max = hi;
      } else {
        return e;
      }
      e = repeat(std::move(e), min, max);
    }
  }

  Result<uint32_t> escape() {
    if (r_.done()) return error("unterminated escape");
    const uint32_t c = r_.next();
    switch (c) {
      case 'n': return uint32_t{'\n'};
      case 'r': return uint32_t{'\r'};
      case 't': return uint32_t{'\t'};
      case '0': return uint32_t{0};
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
        return c;
      case 'x': case 'u': case 'U': {
        const int n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int i = 0; i < n; ++i) {
          if (r_.done()) return error("incomplete escape");
          const uint32_t h = r_.next();
          int v = h >= '0' && h <= '9' ? int(h - '0') : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
                  : h >= 'A' && h <= 'F' ? int(h - 'A' + 10) : -1;
          if (v < 0) return error("bad hex digit in escape");
          cp = cp * 16 + static_cast<uint32_t>(v);
        }
        if (cp > kMaxCodepoint) return error("code point out of range");
        return cp;
      }
      default:
        return error("unknown escape \\" + std::string(1, static_cast<char>(c < 0x80 ? c : '?')));
    }
  }

  Result<ExprPtr> atom(int depth) {
    const uint32_t c = r_.peek();
    if (c == '"' || c == '\'') {
      r_.next();
      std::string bytes;
      for (;;) {
        if (r_.done()) return error("unterminated string literal");
        uint32_t x = r_.next();
        if (x == c) break;
        if (x == '\\') {
          DS_ASSIGN_OR_RETURN(x, escape());
        }
        utf8::append(&bytes, x);
      }
      return literal(std::move(bytes));
    }
    if (c == '[') {
      r_.next();
      bool negated = false;
      if (!r_.done() && r_.peek() == '^') {
        r_.next();
        negated = true;
      }
      CodepointRanges ranges;
      for (;;) {
        if (r_.done()) return error("unterminated character class");
        uint32_t lo = r_.next();
        if (lo == ']') break;
        if (lo == '\\') {
          DS_ASSIGN_OR_RETURN(lo, escape());
        }
        uint32_t hi = lo;
        if (!r_.done() && r_.peek() == '-') {
          const size_t save = r_.offset();
          r_.next();
          if (!r_.done() && r_.peek() != ']') {
            hi = r_.next();
            if (hi == '\\') {
              DS_ASSIGN_OR_RETURN(hi, escape());
            }
            if (hi < lo) return error("bad character range");
          } else {
            r_.seek(save);
          }
        }
        ranges.emplace_back(lo, hi);
      }
      return char_class(std::move(ranges), negated);
    }
    if (c == '.') {
      r_.next();
      return char_class({}, /*negated=*/true);
    }
    if (c == '(') {
      r_.next();
      DS_ASSIGN_OR_RETURN(ExprPtr e, alternation(depth + 1));
      skip_space();
      if (r_.done() || r_.next() != ')') return error("missing ')'");
      return e;
    }
    if (is_name_char(c)) return rule_ref(read_name());
    return error("unexpected character '" + std::string(1, static_cast<char>(c < 0x80 ? c : '?')) +
                 "'");
  }

  std::string_view text_;
  Utf8Reader r_;
  GrammarBuilder* b_;
};

}  // namespace

Status parse_gbnf_into(std::string_view text, GrammarBuilder* builder) {
  if (!Utf8Reader(text).valid()) return invalid_argument("grammar: the text is not valid UTF-8");
  GbnfParser p(text, builder);
  return p.parse();
}

Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text) {
  GrammarBuilder builder;
  DS_RETURN_IF_ERROR(parse_gbnf_into(text, &builder));
  Result<std::shared_ptr<const Grammar>> g = builder.build("root");
  if (!g.ok()) return invalid_argument("grammar: " + g.status().message());
  return g;
}

}  // namespace dserve::grammar
