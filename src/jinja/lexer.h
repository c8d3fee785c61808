// Lexer: Jinja template source -> tokens, with the whitespace control transformers
// configures (trim_blocks and lstrip_blocks on, keep_trailing_newline off) and
// Jinja's `-` / `+` modifiers on tags. Text between tags comes out as kData tokens
// already trimmed; comments are dropped; {% raw %} bodies come out as kData.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dserve::jinja {

// A template that does not parse; line and column are 1-based.
class SyntaxError : public std::runtime_error {
 public:
  SyntaxError(const std::string& message, int line, int column)
      : std::runtime_error(message), line(line), column(column) {}
  int line;
  int column;
};

enum class TokenType {
  kData,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;  // data text, name, unescaped string, operator
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
  int column = 1;
};

// Throws SyntaxError on a malformed tag, string or number.
std::vector<Token> tokenize(std::string_view source);

}  // namespace dserve::jinja
