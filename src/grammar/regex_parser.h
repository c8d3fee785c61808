// Regular expressions (Python `re` syntax, the subset that describes a language) as
// grammar expressions, for guided_regex and JSON schema "pattern". The whole output
// must match (re.fullmatch); ^ at the start and $ at the end are accepted and mean
// nothing more.
//
// Supported: literals and escapes (\n \t \r \f \v \0 \xHH \uXXXX \\ and escaped
// metacharacters), ., [...] and [^...] with ranges, \d \w \s \D \W \S (ASCII
// meanings; \D \W \S are their complements over all of Unicode), groups ( ), (?: ),
// (?P<name> ), alternation |, quantifiers * + ? {m} {m,} {m,n} {,n} (lazy forms
// accepted: they match the same strings). Refused with an InvalidArgument naming the
// position: backreferences, lookaround, \b \B \A \Z, inline flags, and anything
// malformed.
//
// Thread-safety: pure function.
#pragma once

#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace dserve::grammar {

Result<ExprPtr> parse_regex(std::string_view pattern);

}  // namespace dserve::grammar
