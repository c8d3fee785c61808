// Parser: tokens -> syntax tree, following Jinja's grammar and operator precedence
// (jinja2/parser.py): `or` < `and` < `not` < comparisons and `in` < `+ -` < `~` <
// `* / // %` < `**` < unary `- +` < filters and tests < subscripts and calls.
//
// Thread-safety: pure function.
#pragma once

#include <string_view>

#include "jinja/ast.h"

namespace dserve::jinja {

// Deeper nesting of blocks or expressions than this is refused (it would only
// exhaust the stack of the recursive parser and interpreter).
inline constexpr int kMaxNestingDepth = 100;

// Throws SyntaxError (with line and column) on any malformed template.
Body parse_template(std::string_view source);

}  // namespace dserve::jinja
