#include "jinja/lexer.h"

#include <cctype>
#include <charconv>
#include <cstdlib>

#include "jinja/py_str.h"

namespace dserve::jinja {
namespace {

// Jinja's operators, longest first so "**" wins over "*".
constexpr std::string_view kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};

// Template text with \r\n and \r turned into \n and one trailing newline dropped,
// as Jinja does before lexing (keep_trailing_newline=False).
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      const size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit_data(s_.substr(pos_), pos_);
        pos_ = s_.size();
        break;
      }
      const char kind = s_[tag + 1];
      const char sign =
          tag + 2 < s_.size() && (s_[tag + 2] == '-' || s_[tag + 2] == '+') ? s_[tag + 2] : '\0';
      std::string text = s_.substr(pos_, tag - pos_);
      const size_t text_pos = pos_;
      strip_before_tag(&text, sign, kind != '{', line_starting);
      emit_data(std::move(text), text_pos);
      pos_ = tag + 2 + (sign ? 1 : 0);
      size_t raw_body = 0;
      if (kind == '#') {
        line_starting = lex_comment(tag);
      } else if (kind == '%' && match_raw_begin(pos_, &raw_body)) {
        pos_ = raw_body;
        line_starting = lex_raw(tag, pos_ > 0 && s_[pos_ - 1] == '\n');
      } else {
        line_starting = lex_tag(kind == '%', tag);
      }
    }
    Token eof;
    eof.type = TokenType::kEof;
    set_position(&eof, s_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& message, size_t at) {
    int line = 1, column = 1;
    position_of(at, &line, &column);
    throw SyntaxError(message, line, column);
  }

  void position_of(size_t at, int* line, int* column) {
    // Incremental: positions are asked for in increasing order almost always.
    if (at < line_cache_pos_) {
      line_cache_pos_ = 0;
      line_cache_line_ = 1;
      line_cache_start_ = 0;
    }
    for (size_t i = line_cache_pos_; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line_cache_line_;
        line_cache_start_ = i + 1;
      }
    }
    line_cache_pos_ = std::max(line_cache_pos_, std::min(at, s_.size()));
    *line = line_cache_line_;
    *column = static_cast<int>(at - line_cache_start_) + 1;
  }

  void set_position(Token* t, size_t at) { position_of(at, &t->line, &t->column); }

  size_t find_tag_start(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Skips Python whitespace (\s) from `at`; returns the new position.
  size_t skip_ws(size_t at) const {
    while (at < s_.size()) {
      const auto b = static_cast<unsigned char>(s_[at]);
      if (b < 0x80) {
        if (!py_isspace(b)) break;
        ++at;
        continue;
      }
      size_t len = (b >= 0xF0) ? 4 : (b >= 0xE0) ? 3 : 2;
      if (at + len > s_.size()) break;
      const std::u32string cp = decode_utf8(std::string_view(s_).substr(at, len));
      if (cp.size() != 1 || !py_isspace(cp[0])) break;
      at += len;
    }
    return at;
  }

  // Jinja's OptionalLStrip: `-` strips all whitespace before the tag; otherwise, with
  // lstrip_blocks, spaces and tabs between a line start and a block/comment tag go.
  void strip_before_tag(std::string* text, char sign, bool is_block, bool line_starting) const {
    if (sign == '-') {
      *text = py_strip(*text, std::nullopt, false, true);
    } else if (sign != '+' && is_block) {
      const size_t nl = text->rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        if (text->find_first_not_of(" \t", l_pos) == std::string::npos) text->resize(l_pos);
      }
    }
  }

  void emit_data(std::string text, size_t at) {
    if (text.empty()) return;
    Token t;
    t.type = TokenType::kData;
    t.value = std::move(text);
    set_position(&t, at);
    tokens_.push_back(std::move(t));
  }

  // After "{%" and its sign: `\s*raw\s*(-%}\s*|%})`. Sets *body to where the raw text starts.
  bool match_raw_begin(size_t at, size_t* body) const {
    at = skip_ws(at);
    if (s_.compare(at, 3, "raw") != 0) return false;
    at += 3;
    if (at < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[at])) || s_[at] == '_'))
      return false;
    at = skip_ws(at);
    if (s_.compare(at, 3, "-%}") == 0) {
      *body = skip_ws(at + 3);
      return true;
    }
    if (s_.compare(at, 2, "%}") == 0) {
      *body = at + 2;
      return true;
    }
    return false;
  }

  // Consumes the end of a block-like tag at `at` ("+%}", "-%}\s*", "%}\n?" with the
  // given closer); returns the position after it, or npos if none starts at `at`.
  size_t match_block_end(size_t at, std::string_view closer, bool trim_newline) const {
    if (s_[at] == '+' && s_.compare(at + 1, closer.size(), closer) == 0) {
      return at + 1 + closer.size();
    }
    if (s_[at] == '-' && s_.compare(at + 1, closer.size(), closer) == 0) {
      return skip_ws(at + 1 + closer.size());
    }
    if (s_.compare(at, closer.size(), closer) == 0) {
      size_t end = at + closer.size();
      if (trim_newline && end < s_.size() && s_[end] == '\n') ++end;
      return end;
    }
    return std::string::npos;
  }

  bool lex_comment(size_t tag) {
    const size_t content = pos_;
    for (size_t i = content; i < s_.size(); ++i) {
      if (s_[i] != '#' && s_[i] != '-' && s_[i] != '+') continue;
      const size_t end = match_block_end(i, "#}", /*trim_newline=*/true);
      if (end == std::string::npos) continue;
      pos_ = end;
      return s_[end - 1] == '\n';
    }
    fail("Missing end of comment tag", tag);
  }

  bool lex_raw(size_t tag, bool line_starting) {
    for (size_t i = s_.find("{%", pos_); i != std::string::npos; i = s_.find("{%", i + 1)) {
      size_t at = i + 2;
      const char sign = at < s_.size() && (s_[at] == '-' || s_[at] == '+') ? s_[at] : '\0';
      if (sign) ++at;
      at = skip_ws(at);
      if (s_.compare(at, 6, "endraw") != 0) continue;
      at = skip_ws(at + 6);
      if (at >= s_.size()) continue;
      const size_t end = match_block_end(at, "%}", /*trim_newline=*/true);
      if (end == std::string::npos) continue;
      std::string text = s_.substr(pos_, i - pos_);
      const size_t text_pos = pos_;
      strip_before_tag(&text, sign, /*is_block=*/true, line_starting);
      emit_data(std::move(text), text_pos);
      pos_ = end;
      return s_[end - 1] == '\n';
    }
    fail("Missing end of raw directive", tag);
  }

  // Lexes the inside of {{ ... }} or {% ... %} up to and including its end.
  bool lex_tag(bool is_block, size_t tag) {
    Token begin;
    begin.type = is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin;
    set_position(&begin, tag);
    tokens_.push_back(begin);
    std::string brackets;  // open (, [, { awaiting their closers
    while (true) {
      pos_ = skip_ws(pos_);
      if (pos_ >= s_.size()) {
        fail(is_block ? "unexpected end of template, expected end of block ('%}')"
                      : "unexpected end of template, expected end of print statement ('}}')",
             tag);
      }
      if (brackets.empty()) {
        const size_t end = is_block ? match_block_end(pos_, "%}", /*trim_newline=*/true)
                                    : match_block_end(pos_, "}}", /*trim_newline=*/false);
        // A variable tag has no "+}}" form: "+" there is an operator.
        if (end != std::string::npos && (is_block || s_[pos_] != '+')) {
          Token t;
          t.type = is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd;
          set_position(&t, pos_);
          tokens_.push_back(t);
          pos_ = end;
          return s_[end - 1] == '\n';
        }
      }
      lex_expression_token(&brackets);
    }
  }

  static bool is_name_start(unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; }
  static bool is_name_char(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

  // Digits with single underscores between them, as Python literals allow.
  size_t scan_digits(size_t at, int base) const {
    auto is_digit = [base](char c) {
      if (base == 16) return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      return c >= '0' && c < static_cast<char>('0' + base);
    };
    size_t i = at;
    while (i < s_.size()) {
      if (is_digit(s_[i])) {
        ++i;
      } else if (s_[i] == '_' && i > at && i + 1 < s_.size() && is_digit(s_[i + 1])) {
        ++i;
      } else {
        break;
      }
    }
    return i;
  }

  void lex_expression_token(std::string* brackets) {
    const size_t start = pos_;
    const auto c = static_cast<unsigned char>(s_[pos_]);
    Token t;
    set_position(&t, start);
    if (std::isdigit(c)) {
      lex_number(&t);
    } else if (is_name_start(c)) {
      size_t i = pos_;
      while (i < s_.size() && is_name_char(static_cast<unsigned char>(s_[i]))) ++i;
      t.type = TokenType::kName;
      t.value = s_.substr(pos_, i - pos_);
      pos_ = i;
    } else if (c == '\'' || c == '"') {
      t.type = TokenType::kString;
      t.value = lex_string();
    } else {
      for (std::string_view op : kOperators) {
        if (s_.compare(pos_, op.size(), op) == 0) {
          t.type = TokenType::kOperator;
          t.value = std::string(op);
          pos_ += op.size();
          break;
        }
      }
      if (t.type != TokenType::kOperator) {
        fail(std::string("unexpected char '") + s_[pos_] + "'", pos_);
      }
      const char o = t.value[0];
      if (t.value.size() == 1 && (o == '(' || o == '[' || o == '{')) {
        brackets->push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
      } else if (t.value.size() == 1 && (o == ')' || o == ']' || o == '}')) {
        if (brackets->empty()) fail(std::string("unexpected '") + o + "'", start);
        if (brackets->back() != o) {
          fail(std::string("unexpected '") + o + "', expected '" + brackets->back() + "'", start);
        }
        brackets->pop_back();
      }
    }
    tokens_.push_back(std::move(t));
  }

  void lex_number(Token* t) {
    const size_t start = pos_;
    std::string digits;
    auto strip_underscores = [](std::string_view v) {
      std::string out;
      for (char ch : v) {
        if (ch != '_') out.push_back(ch);
      }
      return out;
    };
    if (s_[pos_] == '0' && pos_ + 1 < s_.size() &&
        std::string_view("xXoObB").find(s_[pos_ + 1]) != std::string_view::npos) {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s_[pos_ + 1])));
      const int base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
      size_t i = pos_ + 2;
      if (i < s_.size() && s_[i] == '_') ++i;
      const size_t end = scan_digits(i, base);
      if (end == i) fail("invalid number literal", start);
      digits = strip_underscores(std::string_view(s_).substr(i, end - i));
      t->type = TokenType::kInteger;
      const auto r =
          std::from_chars(digits.data(), digits.data() + digits.size(), t->int_value, base);
      if (r.ec != std::errc()) fail("integer literal too large", start);
      pos_ = end;
      return;
    }
    size_t end = scan_digits(pos_, 10);
    bool is_float = false;
    // A float needs digits after the dot ("1." is the integer 1 then "."), and is not
    // lexed right after a "." (so "x.0.1" is two subscripts).
    const bool after_dot = start > 0 && s_[start - 1] == '.';
    if (!after_dot && end + 1 < s_.size() && s_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(s_[end + 1]))) {
      end = scan_digits(end + 1, 10);
      is_float = true;
    }
    if (!after_dot && end < s_.size() && (s_[end] == 'e' || s_[end] == 'E')) {
      size_t e = end + 1;
      if (e < s_.size() && (s_[e] == '+' || s_[e] == '-')) ++e;
      const size_t exp_end = scan_digits(e, 10);
      if (exp_end > e) {
        end = exp_end;
        is_float = true;
      }
    }
    digits = strip_underscores(std::string_view(s_).substr(start, end - start));
    pos_ = end;
    if (is_float) {
      t->type = TokenType::kFloat;
      t->float_value = std::strtod(digits.c_str(), nullptr);
      return;
    }
    t->type = TokenType::kInteger;
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t->int_value);
    if (r.ec != std::errc()) fail("integer literal too large", start);
  }

  // A quoted string with Python's escapes (Jinja decodes with "unicode-escape").
  std::string lex_string() {
    const size_t start = pos_;
    const char quote = s_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unexpected end of string", start);
      const char c = s_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= s_.size()) fail("unexpected end of string", start);
      const char e = s_[pos_ + 1];
      pos_ += 2;
      auto hex_escape = [&](int n) {
        if (pos_ + n > s_.size()) fail("truncated escape in string", pos_);
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = s_[pos_ + k];
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail("truncated escape in string", pos_);
          v = v * 16 +
              static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                        ? h - '0'
                                        : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
        }
        if (v > 0x10FFFF) fail("illegal Unicode character in string", pos_);
        pos_ += n;
        append_utf8(&out, v);
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          hex_escape(2);
          break;
        case 'u':
          hex_escape(4);
          break;
        case 'U':
          hex_escape(8);
          break;
        case '0':
        case '1':
        case '2':
        case '3':
        case '4':
        case '5':
        case '6':
        case '7': {
          uint32_t v = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++k) {
            v = v * 8 + static_cast<uint32_t>(s_[pos_++] - '0');
          }
          append_utf8(&out, v);
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
          break;
      }
    }
  }

  std::string s_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  size_t line_cache_pos_ = 0;
  int line_cache_line_ = 1;
  size_t line_cache_start_ = 0;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(normalize_newlines(source)).run();
}

}  // namespace dserve::jinja
