// The structured-output fields of an OpenAI request body, into
// SamplingOptions::structured_outputs:
//   response_format       {"type": "text" | "json_object" | "json_schema",
//                          "json_schema": {"name", "schema", "strict", "description"}}
//   structured_outputs    vLLM's extra body: {"json" | "regex" | "choice" | "grammar" |
//                          "json_object": ...} (exactly one)
//   guided_json, guided_regex, guided_choice, guided_grammar   vLLM's older names;
//   guided_decoding_backend and guided_whitespace_pattern are accepted and ignored
//   (there is one backend; the JSON layout is fixed, see grammar/json_schema.h).
// At most one constraint per request. The constraint is compiled here once (without a
// tokenizer) so that a bad schema, regex or grammar is a 400 naming the problem
// before the request reaches an engine.
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "sampling/sampling_params.h"
#include "server/api_error.h"

namespace dserve::server {

// The body fields read here (for the endpoints' lists of known fields).
extern const std::set<std::string> kStructuredOutputFields;

std::optional<ApiError> read_structured_outputs(const nlohmann::ordered_json& body,
                                                SamplingOptions* options);

}  // namespace dserve::server
