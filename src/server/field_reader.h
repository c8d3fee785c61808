// FieldReader: reads the optional fields of one JSON request object into typed values,
// keeping the first problem as an ApiError that names the field. A JSON null means
// "not given", as the OpenAI SDK sends it. Shared by the endpoints' request parsers.
// Thread-safety: one reader per request, used by one thread.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace dserve::server {

// j[key] when j is an object holding a string there, else "": for reading the type tag
// of a request's parts and items, which may hold anything (nlohmann's value() throws
// when the key holds another type).
inline std::string string_member(const nlohmann::ordered_json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

class FieldReader {
 public:
  explicit FieldReader(const nlohmann::ordered_json& body) : body_(body) {}

  bool ok() const { return !error_; }
  const ApiError& error() const { return *error_; }
  void fail(std::string message, std::string param, std::string code = "") {
    if (!error_) {
      error_ = ApiError::bad_request(std::move(message), std::move(param), std::move(code));
    }
  }

  const nlohmann::ordered_json* get(const char* name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  void number(const char* name, float* out) {
    const nlohmann::ordered_json* v = get(name);
    if (!v) return;
    if (!v->is_number()) return fail(std::string(name) + " must be a number", name);
    const double d = v->get<double>();
    if (!std::isfinite(d)) return fail(std::string(name) + " must be finite", name);
    *out = static_cast<float>(d);
  }
  template <typename Int>
  void integer(const char* name, Int* out) {
    const nlohmann::ordered_json* v = get(name);
    if (!v) return;
    // 3.0 is accepted as 3 (Python clients may send floats); 3.5 is not.
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (d != std::floor(d)) return fail(std::string(name) + " must be an integer", name);
    } else if (!v->is_number_integer()) {
      return fail(std::string(name) + " must be an integer", name);
    }
    const double d = v->get<double>();
    if (d < static_cast<double>(std::numeric_limits<Int>::min()) ||
        d > static_cast<double>(std::numeric_limits<Int>::max())) {
      return fail(std::string(name) + " is out of range", name);
    }
    *out = v->is_number_unsigned() ? static_cast<Int>(v->get<uint64_t>())
           : v->is_number_integer() ? static_cast<Int>(v->get<int64_t>())
                                    : static_cast<Int>(d);
  }
  template <typename Int>
  void integer(const char* name, std::optional<Int>* out) {
    if (!get(name)) return;
    Int v{};
    integer(name, &v);
    if (ok()) *out = v;
  }
  void boolean(const char* name, bool* out) {
    const nlohmann::ordered_json* v = get(name);
    if (!v) return;
    if (!v->is_boolean()) return fail(std::string(name) + " must be a boolean", name);
    *out = v->get<bool>();
  }
  void string(const char* name, std::string* out) {
    const nlohmann::ordered_json* v = get(name);
    if (!v) return;
    if (!v->is_string()) return fail(std::string(name) + " must be a string", name);
    *out = v->get<std::string>();
  }

  // Rejects every field not in `known`, as OpenAI does: silently ignoring one could
  // change what the client gets.
  void only(const std::set<std::string>& known) {
    for (auto it = body_.begin(); it != body_.end(); ++it) {
      if (known.count(it.key()) == 0) {
        return fail("Unrecognized request argument supplied: " + it.key(), it.key(),
                    "unknown_parameter");
      }
    }
  }

 private:
  const nlohmann::ordered_json& body_;
  std::optional<ApiError> error_;
};

}  // namespace dserve::server
