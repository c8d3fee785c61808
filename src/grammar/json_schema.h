// JSON schema -> Grammar, for response_format json_schema / structured_outputs.json.
// The output is compact JSON in one layout, as xgrammar writes it without free
// whitespace: ", " between items and members, ": " after keys, properties in the
// schema's order. A fixed layout leaves the model no room to wander in whitespace.
//
// Supported: type (one or a list), properties, required (others optional, order kept),
// additionalProperties (false, or a schema when there are no properties; with
// properties only the declared ones are generated, which every such schema accepts),
// enum, const, anyOf / oneOf (as alternatives), allOf of one schema, $ref into the
// document (#, #/$defs/..., #/definitions/..., recursion allowed), items, minItems,
// maxItems, prefixItems, string minLength / maxLength / pattern (regex_parser.h),
// integer minimum / maximum / exclusiveMinimum / exclusiveMaximum. Annotations
// (title, description, default, examples, format, ...) are ignored. Any other keyword
// that constrains values (not, if, uniqueItems, multipleOf, number bounds, ...) is an
// InvalidArgument naming it and where it is, rather than a grammar that would let
// invalid output through.
//
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace dserve::grammar {

// schema_json: the schema as JSON text.
Result<std::shared_ptr<const Grammar>> compile_json_schema(std::string_view schema_json);
// Any JSON object (response_format json_object).
Result<std::shared_ptr<const Grammar>> json_object_grammar();
// Defines rule `name` in `builder` as JSON valid under the schema, so that other rules
// (GBNF text parsed into the same builder) can use it. Helper rules are named
// `name_...`; the basic rules json_value, json_string, json_number, json_integer,
// json_boolean, json_null, json_array, json_object are added once and shared.
Status add_json_schema_rule(std::string_view schema_json, const std::string& name,
                            GrammarBuilder* builder);

}  // namespace dserve::grammar
