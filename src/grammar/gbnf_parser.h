// GBNF grammar text (llama.cpp's format, which xgrammar's EBNF and vLLM's
// guided_grammar also accept) as a Grammar:
//
//   root   ::= object            # comments run to the end of the line
//   object ::= "{" ws pair ("," ws pair)* "}" | "{}"
//   pair   ::= [a-z]+ ":" ws ("true" | "false" | [0-9]{1,3})
//   ws     ::= [ \t\n]*
//
// Literals "..." (or '...'), classes [...] / [^...] with ranges, . (any character),
// rule names [A-Za-z0-9_-]+, groups ( ), quantifiers * + ? {m} {m,} {m,n}; escapes
// \n \r \t \\ \" \' \[ \] \- \xHH \uHHHH \UHHHHHHHH. A rule may span lines: it ends
// where the next `name ::=` begins. The start rule is `root`.
// Errors (InvalidArgument) give the line and column.
//
// Thread-safety: pure function.
#pragma once

#include <memory>
#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace dserve::grammar {

// Adds the rules of `text` to `builder` (rule names must not clash with ones it has).
Status parse_gbnf_into(std::string_view text, GrammarBuilder* builder);
Result<std::shared_ptr<const Grammar>> parse_gbnf(std::string_view text);

}  // namespace dserve::grammar
