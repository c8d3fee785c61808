// Fuzz target: GBNF grammar text as structured output (guided_grammar): grammar/
// gbnf_parser.h compiled into a grammar, then a short walk of its matcher
// (grammar_walk.h). The input is the grammar, then optionally a NUL and a JSON schema
// that the grammar may use as rule `args`, as tool calling writes its grammars:
//
//   root ::= "<tool_call>{\"name\": \"f\", \"arguments\": " args "}</tool_call>"
#include <string>

#include "fuzz_support.h"
#include "grammar/structured_output.h"
#include "grammar_walk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  using namespace std::literals;
  const std::vector<std::string_view> parts = fuzz::split_parts(fuzz::as_text(data, size), 2);
  StructuredOutputs spec;
  spec.kind = StructuredOutputs::Kind::kGrammar;
  spec.text = std::string(parts[0]);
  if (parts.size() > 1) spec.schema_rules.emplace_back("args", std::string(parts[1]));
  Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(spec);
  if (!g.ok()) return 0;
  (void)(*g)->to_string();
  fuzz::walk_matcher(*g, "\x00\x01\x02\x03\x05\x08\x0d\x15\x22\x37\x59\x90\xe9"sv);
  return 0;
}
