// Fuzz target: a regular expression as structured output (guided_regex, a JSON schema's
// "pattern"): grammar/regex_parser.h compiled into a grammar, then a short walk of its
// matcher (grammar_walk.h). The input is the pattern.
#include <string>

#include "fuzz_support.h"
#include "grammar/structured_output.h"
#include "grammar_walk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  using namespace std::literals;
  StructuredOutputs spec;
  spec.kind = StructuredOutputs::Kind::kRegex;
  spec.text = std::string(fuzz::as_text(data, size));
  Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(spec);
  if (!g.ok()) return 0;
  (void)(*g)->to_string();
  fuzz::walk_matcher(*g, "\x00\x01\x02\x03\x05\x08\x0d\x15\x22\x37\x59\x90\xe9"sv);
  return 0;
}
