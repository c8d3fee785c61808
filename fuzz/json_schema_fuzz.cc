// Fuzz target: a JSON schema as structured output (response_format json_schema, a
// tool's parameters): grammar/json_schema.h compiled into a grammar, then a short walk
// of its matcher (grammar_walk.h). The input is the schema as JSON text.
#include <string>

#include "fuzz_support.h"
#include "grammar/structured_output.h"
#include "grammar_walk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dserve;
  using namespace std::literals;
  StructuredOutputs spec;
  spec.kind = StructuredOutputs::Kind::kJson;
  spec.text = std::string(fuzz::as_text(data, size));
  Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(spec);
  if (!g.ok()) return 0;
  fuzz::walk_matcher(*g, "\x00\x01\x02\x03\x05\x08\x0d\x15\x22\x37\x59\x90\xe9\x00\x00\x00"sv);
  return 0;
}
