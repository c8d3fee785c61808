// Conversions between JSON and Values: the request's messages and tools come in as
// JSON, and the `tojson` filter must print exactly what Python's json.dumps prints
// (transformers replaces Jinja's tojson with json.dumps(x, ensure_ascii=False, ...)).
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "jinja/value.h"

namespace dserve::jinja {

// JSON objects keep their key order (Python dicts are insertion-ordered); integers
// stay ints, other numbers become floats. Nesting deeper than 100 levels throws
// TemplateError.
Value value_from_json(const nlohmann::ordered_json& j);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // None: one line; else the per-level indent
  std::string item_separator = ", ";  // Python's default; "," when indent is set
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// json.dumps(value, ...). Undefined, namespaces and functions are a TypeError ("Object
// of type Undefined is not JSON serializable"), as in Python.
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

}  // namespace dserve::jinja
