#include "grammar/regex_parser.h"

#include <string>

#include "grammar/utf8_reader.h"

namespace dserve::grammar {
namespace {

const CodepointRanges kDigit = {{'0', '9'}};
const CodepointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodepointRanges kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  explicit RegexParser(std::string_view s) : r_(s) {}

  Result<ExprPtr> parse() {
    if (r_.peek() == '^') r_.next();
    DS_ASSIGN_OR_RETURN(ExprPtr e, alternation(0));
    if (!r_.done()) return error("unbalanced ')'");
    return e;
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument("regex: " + what + " at offset " + std::to_string(r_.offset()));
  }

  Result<ExprPtr> alternation(int depth) {
    if (depth > 200) return error("groups nested too deeply");
    std::vector<ExprPtr> alts;
    for (;;) {
      std::vector<ExprPtr> seq;
      while (!r_.done() && r_.peek() != '|' && r_.peek() != ')') {
        if (r_.peek() == '$') {
          r_.next();
          if (!r_.done() && r_.peek() != '|' && r_.peek() != ')') {
            return error("'$' is only supported at the end");
          }
          continue;
        }
        DS_ASSIGN_OR_RETURN(ExprPtr atom_expr, atom(depth));
        DS_ASSIGN_OR_RETURN(ExprPtr q, quantified(std::move(atom_expr)));
        seq.push_back(std::move(q));
      }
      alts.push_back(seq.empty() ? literal("") : sequence(std::move(seq)));
      if (r_.done() || r_.peek() == ')') break;
      r_.next();  // '|'
    }
    return alternatives(std::move(alts));
  }

  Result<int> number() {
    int n = 0;
    bool any = false;
    while (!r_.done() && r_.peek() >= '0' && r_.peek() <= '9') {
      n = n * 10 + static_cast<int>(r_.next() - '0');
      if (n > 1000000) return error("repetition count too large");
      any = true;
    }
    return any ? n : -1;
  }

  // One quantifier at most, as Python's re: a second one (a{2}{3}, a*{2}) is a "multiple
  // repeat" error; the lazy and possessive forms (a*?, a*+) are one quantifier.
  Result<ExprPtr> quantified(ExprPtr e) {
    for (bool repeated = false;; repeated = true) {
      if (r_.done()) return e;
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
        const size_t save = r_.offset();
        r_.next();
        DS_ASSIGN_OR_RETURN(int lo, number());
        int hi = lo;
        if (!r_.done() && r_.peek() == ',') {
          r_.next();
          DS_ASSIGN_OR_RETURN(hi, number());
        }
        if (r_.done() || r_.peek() != '}' || (lo < 0 && hi < 0)) {
          // Python treats a malformed {...} as literal text; do the same.
          r_.seek(save);
          return e;
        }
        r_.next();
        min = lo < 0 ? 0 : lo;
        max = hi;
        if (max >= 0 && max < min) return error("repetition {m,n} with n < m");
      } else {
        return e;
      }
      if (repeated) return error("multiple repeat");
      if (!r_.done() && (r_.peek() == '?' || r_.peek() == '+')) r_.next();  // lazy/possessive
      if (!r_.done() && (r_.peek() == '*' || r_.peek() == '+' || r_.peek() == '?')) {
        return error("multiple repeat");
      }
      e = repeat(std::move(e), min, max);
    }
  }

  // An escape after '\' outside or inside a class: a code point, or a class.
  Result<CodepointRanges> escape(bool* is_class, bool in_class) {
    if (r_.done()) return error("a pattern cannot end with '\\'");
    const uint32_t c = r_.next();
    *is_class = true;
    switch (c) {
      case 'd': return kDigit;
      case 'w': return kWord;
      case 's': return kSpace;
      case 'D': return normalize_ranges(kDigit, true);
      case 'W': return normalize_ranges(kWord, true);
      case 'S': return normalize_ranges(kSpace, true);
      default: break;
    }
    *is_class = false;
    uint32_t cp = c;
    switch (c) {
      case 'n': cp = '\n'; break;
      case 't': cp = '\t'; break;
      case 'r': cp = '\r'; break;
      case 'f': cp = '\f'; break;
      case 'v': cp = '\v'; break;
      case 'a': cp = '\a'; break;
      case '0': cp = 0; break;
      case 'x': case 'u': case 'U': {
        const int n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        cp = 0;
        for (int i = 0; i < n; ++i) {
          if (r_.done()) return error("incomplete \\" + std::string(1, char(c)) + " escape");
          const uint32_t h = r_.next();
          int v = h >= '0' && h <= '9' ? int(h - '0') : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
                  : h >= 'A' && h <= 'F' ? int(h - 'A' + 10) : -1;
          if (v < 0) return error("bad hex digit in \\" + std::string(1, char(c)) + " escape");
          cp = cp * 16 + static_cast<uint32_t>(v);
        }
        if (cp > kMaxCodepoint) return error("code point out of range");
        break;
      }
      case 'b':
        if (in_class) {
          cp = '\b';
          break;
        }
        return error("\\b (word boundary) is not supported");
      default:
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '1' && c <= '9')) {
          return error("unsupported escape \\" + std::string(1, char(c)));
        }
        break;  // an escaped punctuation character stands for itself
    }
    return CodepointRanges{{cp, cp}};
  }

  Result<ExprPtr> bracket() {
    bool negated = false;
    if (!r_.done() && r_.peek() == '^') {
      r_.next();
      negated = true;
    }
    CodepointRanges ranges;
    bool first = true;
    for (;;) {
      if (r_.done()) return error("unterminated character class");
      uint32_t c = r_.peek();
      if (c == ']' && !first) {
        r_.next();
        break;
      }
      first = false;
      r_.next();
      uint32_t lo = c;
      if (c == '\\') {
        bool is_class = false;
        DS_ASSIGN_OR_RETURN(CodepointRanges e, escape(&is_class, true));
        if (is_class) {
          ranges.insert(ranges.end(), e.begin(), e.end());
          continue;
        }
        lo = e[0].first;
      } else if (c == '[' && !r_.done() && r_.peek() == ':') {
        return error("POSIX classes [:...:] are not supported");
      }
      if (!r_.done() && r_.peek() == '-') {
        const size_t save = r_.offset();
        r_.next();
        if (!r_.done() && r_.peek() != ']') {
          uint32_t hi = r_.next();
          if (hi == '\\') {
            bool is_class = false;
            DS_ASSIGN_OR_RETURN(CodepointRanges e, escape(&is_class, true));
            if (is_class) return error("bad character range");
            hi = e[0].first;
          }
          if (hi < lo) return error("bad character range");
          ranges.emplace_back(lo, hi);
          continue;
        }
        r_.seek(save);
      }
      ranges.emplace_back(lo, lo);
    }
    return char_class(std::move(ranges), negated);
  }

  Result<ExprPtr> atom(int depth) {
    const uint32_t c = r_.next();
    switch (c) {
      case '(': {
        if (!r_.done() && r_.peek() == '?') {
          r_.next();
          if (r_.done()) return error("unterminated group");
          const uint32_t k = r_.next();
          if (k == 'P' && !r_.done() && r_.peek() == '<') {
            while (!r_.done() && r_.peek() != '>') r_.next();
            if (r_.done()) return error("unterminated group name");
            r_.next();
          } else if (k != ':') {
            return error("group construct (?" + std::string(1, char(k)) +
                         " (lookaround, flags, backreference) is not supported");
          }
        }
        DS_ASSIGN_OR_RETURN(ExprPtr e, alternation(depth + 1));
        if (r_.done() || r_.next() != ')') return error("missing ')'");
        return e;
      }
      case ')': return error("unbalanced ')'");
      case '[': return bracket();
      case '.': return char_class({{'\n', '\n'}}, /*negated=*/true);
      case '*': case '+': case '?': return error("nothing to repeat");
      case '^': return error("'^' is only supported at the start");
      case '\\': {
        if (!r_.done() && (r_.peek() == 'A' || r_.peek() == 'Z' || r_.peek() == 'B' ||
                           r_.peek() == 'b' || r_.peek() == 'z')) {
          return error("anchors and word boundaries (\\" + std::string(1, char(r_.peek())) +
                       ") are not supported");
        }
        bool is_class = false;
        DS_ASSIGN_OR_RETURN(CodepointRanges e, escape(&is_class, false));
        return char_class(std::move(e));
      }
      default: {
        std::string bytes;
        utf8::append(&bytes, c);
        return literal(std::move(bytes));
      }
    }
  }

  Utf8Reader r_;
};

}  // namespace

Result<ExprPtr> parse_regex(std::string_view pattern) {
  Utf8Reader check(pattern);
  if (!check.valid()) return invalid_argument("regex: the pattern is not valid UTF-8");
  RegexParser p(pattern);
  return p.parse();
}

}  // namespace dserve::grammar
