// Fuzz target: the grammar matcher (grammar/grammar_matcher.h) fed random token
// sequences. The input is a structured-output spec, a NUL, then the steps of the walk
// (grammar_walk.h: each byte picks an allowed token, or from 0xF0 on any token):
//
//   json {"type": "object", "properties": {"a": {"type": "integer"}}}\0<steps>
//   regex [a-z]+@[a-z]+\.(com|org)\0<steps>
//   gbnf root ::= "x" root | "y"\0<steps>
//   choice yes\nno\nmaybe\0<steps>
//   json_object\0<steps>
#include <string>

#include "fuzz_support.h"
#include "grammar/structured_output.h"
#include "grammar_walk.h"

namespace {

using dserve::StructuredOutputs;

// The spec written as "<kind> <text>"; false for an unknown kind.
bool parse_spec(std::string_view s, StructuredOutputs* spec) {
  const size_t space = s.find(' ');
  const std::string_view kind = s.substr(0, space);
  const std::string_view text = space == std::string_view::npos ? "" : s.substr(space + 1);
  spec->text = std::string(text);
  if (kind == "json") {
    spec->kind = StructuredOutputs::Kind::kJson;
  } else if (kind == "regex") {
    spec->kind = StructuredOutputs::Kind::kRegex;
  } else if (kind == "gbnf") {
    spec->kind = StructuredOutputs::Kind::kGrammar;
  } else if (kind == "json_object") {
    spec->kind = StructuredOutputs::Kind::kJsonObject;
  } else if (kind == "choice") {
    spec->kind = StructuredOutputs::Kind::kChoice;
    spec->text.clear();
    size_t start = 0;
    while (start <= text.size()) {
      const size_t end = std::min(text.find('\n', start), text.size());
      spec->choices.emplace_back(text.substr(start, end - start));
      start = end + 1;
    }
  } else {
    return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  const std::vector<std::string_view> parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  if (parts.size() < 2) return 0;
  StructuredOutputs spec;
  if (!parse_spec(parts[0], &spec)) return 0;
  Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(spec);
  if (!g.ok()) return 0;
  fuzz::walk_matcher(*g, parts[1]);
  return 0;
}
