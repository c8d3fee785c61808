// JsonFields: typed, validated reads of fields of one JSON object (config.json,
// generation_config.json, rope parameters). A missing optional field leaves `out`
// unchanged; JSON null counts as absent, as in transformers; a field of the wrong type
// or out of range is a Corrupt status naming the file and key.
// Thread-safety: a view over borrowed JSON; use from one thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace dserve {

class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, const std::string& source) : j_(j), source_(source) {}
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  template <typename Int>
  Status get_int(const char* key, Int* out, bool required) const {
    if (!has(key)) return required ? missing(key) : Status::Ok();
    const auto& v = j_[key];
    double d = 0;
    if (v.is_number_integer()) {
      d = static_cast<double>(v.get<int64_t>());
    } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) {
      d = v.get<double>();
    } else {
      return corrupt(source_ + ": '" + key + "' must be an integer, got " + v.dump());
    }
    if (d < static_cast<double>(std::numeric_limits<Int>::min()) ||
        d > static_cast<double>(std::numeric_limits<Int>::max())) {
      return corrupt(source_ + ": '" + key + "' out of range");
    }
    *out = static_cast<Int>(d);
    return Status::Ok();
  }
  Status get_double(const char* key, double* out, bool required) const {
    if (!has(key)) return required ? missing(key) : Status::Ok();
    const auto& v = j_[key];
    if (!v.is_number())
      return corrupt(source_ + ": '" + key + "' must be a number, got " + v.dump());
    *out = v.get<double>();
    return Status::Ok();
  }
  Status get_optional_double(const char* key, std::optional<double>* out) const {
    if (!has(key)) return Status::Ok();
    double v = 0;
    DS_RETURN_IF_ERROR(get_double(key, &v, true));
    *out = v;
    return Status::Ok();
  }
  Status get_bool(const char* key, bool* out) const {
    if (!has(key)) return Status::Ok();
    const auto& v = j_[key];
    if (!v.is_boolean())
      return corrupt(source_ + ": '" + key + "' must be true or false, got " + v.dump());
    *out = v.get<bool>();
    return Status::Ok();
  }
  Status get_string(const char* key, std::string* out) const {
    if (!has(key)) return Status::Ok();
    const auto& v = j_[key];
    if (!v.is_string())
      return corrupt(source_ + ": '" + key + "' must be a string, got " + v.dump());
    *out = v.get<std::string>();
    return Status::Ok();
  }
  Status get_id_list(const char* key, std::vector<int32_t>* out) const {
    if (!has(key)) return Status::Ok();
    const auto& v = j_[key];
    std::vector<int32_t> ids;
    if (v.is_number_integer()) {
      ids.push_back(v.get<int32_t>());
    } else if (v.is_array()) {
      for (const auto& e : v) {
        if (!e.is_number_integer()) return corrupt(source_ + ": '" + key + "' must hold integers");
        ids.push_back(e.get<int32_t>());
      }
    } else {
      return corrupt(source_ + ": '" + key + "' must be an integer or a list, got " + v.dump());
    }
    *out = std::move(ids);
    return Status::Ok();
  }

 private:
  Status missing(const char* key) const {
    return corrupt(source_ + ": required field '" + key + "' is missing");
  }
  const nlohmann::json& j_;
  const std::string& source_;
};

}  // namespace dserve
