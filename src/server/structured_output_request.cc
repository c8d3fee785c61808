#include "server/structured_output_request.h"

#include <vector>

#include "grammar/structured_output.h"

namespace dserve::server {

using json = nlohmann::ordered_json;

const std::set<std::string> kStructuredOutputFields = {
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern"};

namespace {

using Kind = StructuredOutputs::Kind;

// A schema given as an object, or as a string holding one.
std::optional<ApiError> schema_text(const json& v, const std::string& param, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
  } else if (v.is_object() || v.is_boolean()) {
    *out = v.dump();
  } else {
    return ApiError::bad_request(param + " must be a JSON schema (an object)", param);
  }
  return std::nullopt;
}

std::optional<ApiError> choices(const json& v, const std::string& param,
                                std::vector<std::string>* out) {
  if (!v.is_array() || v.empty()) {
    return ApiError::bad_request(param + " must be a non-empty list of strings", param);
  }
  for (const json& c : v) {
    if (!c.is_string()) return ApiError::bad_request(param + " must be a list of strings", param);
    out->push_back(c.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> text(const json& v, const std::string& param, std::string* out) {
  if (!v.is_string()) return ApiError::bad_request(param + " must be a string", param);
  *out = v.get<std::string>();
  return std::nullopt;
}

struct Found {
  StructuredOutputs spec;
  std::string param;
};

std::optional<ApiError> response_format(const json& rf, std::vector<Found>* found) {
  const std::string param = "response_format";
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
    return ApiError::bad_request("response_format must be an object with a string \"type\"", param);
  }
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  Found f;
  f.param = param;
  if (type == "json_object") {
    f.spec.kind = Kind::kJsonObject;
  } else if (type == "json_schema") {
    const auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object()) {
      return ApiError::bad_request("response_format json_schema needs a \"json_schema\" object",
                                   param);
    }
    const auto schema = js->find("schema");
    f.spec.kind = Kind::kJson;
    if (schema == js->end() || schema->is_null()) {
      f.spec.text = "{}";  // OpenAI: no schema means any JSON
    } else if (auto e = schema_text(*schema, "response_format.json_schema.schema", &f.spec.text)) {
      return e;
    }
  } else {
    return ApiError::bad_request("response_format type '" + type +
                                     "' is not supported: use text, json_object or json_schema",
                                 param, "unsupported");
  }
  found->push_back(std::move(f));
  return std::nullopt;
}

std::optional<ApiError> structured_outputs(const json& so, std::vector<Found>* found) {
  const std::string param = "structured_outputs";
  if (!so.is_object()) return ApiError::bad_request("structured_outputs must be an object", param);
  for (auto it = so.begin(); it != so.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (v.is_null()) continue;
    Found f;
    f.param = param + "." + key;
    if (key == "json") {
      f.spec.kind = Kind::kJson;
      if (auto e = schema_text(v, f.param, &f.spec.text)) return e;
    } else if (key == "regex") {
      f.spec.kind = Kind::kRegex;
      if (auto e = text(v, f.param, &f.spec.text)) return e;
    } else if (key == "choice") {
      f.spec.kind = Kind::kChoice;
      if (auto e = choices(v, f.param, &f.spec.choices)) return e;
    } else if (key == "grammar") {
      f.spec.kind = Kind::kGrammar;
      if (auto e = text(v, f.param, &f.spec.text)) return e;
    } else if (key == "json_object") {
      if (!v.is_boolean()) return ApiError::bad_request(f.param + " must be a boolean", f.param);
      if (!v.get<bool>()) continue;
      f.spec.kind = Kind::kJsonObject;
    } else if (key == "disable_any_whitespace" || key == "disable_additional_properties" ||
               key == "disable_fallback" || key == "whitespace_pattern") {
      continue;  // the layout is fixed and extra properties are never generated
    } else {
      return ApiError::bad_request("structured_outputs." + key + " is not supported", f.param,
                                   "unsupported");
    }
    found->push_back(std::move(f));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_structured_outputs(const json& body, SamplingOptions* options) {
  std::vector<Found> found;
  auto get = [&](const char* name) -> const json* {
    auto it = body.find(name);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* rf = get("response_format")) {
    if (auto e = response_format(*rf, &found)) return e;
  }
  if (const json* so = get("structured_outputs")) {
    if (auto e = structured_outputs(*so, &found)) return e;
  }
  if (const json* v = get("guided_json")) {
    Found f{{Kind::kJson, "", {}, {}}, "guided_json"};
    if (auto e = schema_text(*v, f.param, &f.spec.text)) return e;
    found.push_back(std::move(f));
  }
  if (const json* v = get("guided_regex")) {
    Found f{{Kind::kRegex, "", {}, {}}, "guided_regex"};
    if (auto e = text(*v, f.param, &f.spec.text)) return e;
    found.push_back(std::move(f));
  }
  if (const json* v = get("guided_choice")) {
    Found f{{Kind::kChoice, "", {}, {}}, "guided_choice"};
    if (auto e = choices(*v, f.param, &f.spec.choices)) return e;
    found.push_back(std::move(f));
  }
  if (const json* v = get("guided_grammar")) {
    Found f{{Kind::kGrammar, "", {}, {}}, "guided_grammar"};
    if (auto e = text(*v, f.param, &f.spec.text)) return e;
    found.push_back(std::move(f));
  }
  for (const char* ignored : {"guided_decoding_backend", "guided_whitespace_pattern"}) {
    if (const json* v = get(ignored); v && !v->is_string()) {
      return ApiError::bad_request(std::string(ignored) + " must be a string", ignored);
    }
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    return ApiError::bad_request("only one kind of structured output constraint may be given, got " +
                                     found[0].param + " and " + found[1].param,
                                 found[1].param);
  }
  Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(found[0].spec);
  if (!g.ok()) return ApiError::bad_request(g.status().message(), found[0].param);
  options->structured_outputs = std::move(found[0].spec);
  return std::nullopt;
}

}  // namespace dserve::server
