#include "jinja/json_value.h"

#include <algorithm>
#include <cstdio>

#include "jinja/py_str.h"

namespace dserve::jinja {
namespace {

constexpr int kMaxJsonDepth = 100;

void dump_string(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  char buf[16];
  auto escape_unit = [&](unsigned u) {
    std::snprintf(buf, sizeof buf, "\\u%04x", u);
    *out += buf;
  };
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20) {
      escape_unit(c);
    } else if (ensure_ascii && c > 0x7E) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        escape_unit(0xD800 | (v >> 10));
        escape_unit(0xDC00 | (v & 0x3FF));
      } else {
        escape_unit(c);
      }
    } else {
      append_utf8(out, c);
    }
  }
  out->push_back('"');
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py_repr_float(d);
}

std::string key_string(const Value& k) {
  switch (k.kind()) {
    case Kind::kString:
      return k.str();
    case Kind::kFloat:
      return float_json(k.as_float());
    case Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Kind::kNone:
      return "null";
    case Kind::kInt:
      return std::to_string(k.as_int());
    case Kind::kUndefined:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kFunction:
      break;
  }
  throw TemplateError("keys must be str, int, float, bool or None, not " + k.type_name());
}

void dump(const Value& v, const JsonDumpOptions& o, int level, std::string* out) {
  if (level > kMaxJsonDepth) throw TemplateError("tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int i = 0; i < lvl; ++i) *out += *o.indent;
  };
  switch (v.kind()) {
    case Kind::kNone:
      *out += "null";
      return;
    case Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return;
    case Kind::kInt:
      *out += std::to_string(v.as_int());
      return;
    case Kind::kFloat:
      *out += float_json(v.as_float());
      return;
    case Kind::kString:
      dump_string(v.str(), o.ensure_ascii, out);
      return;
    case Kind::kList: {
      const auto& items = v.list_obj().items;
      if (items.empty()) {
        *out += "[]";
        return;
      }
      out->push_back('[');
      if (o.indent) newline(level + 1);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          *out += o.item_separator;
          if (o.indent) newline(level + 1);
        }
        dump(items[i], o, level + 1, out);
      }
      if (o.indent) newline(level);
      out->push_back(']');
      return;
    }
    case Kind::kDict: {
      if (!v.is_mapping()) break;
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.dict_obj().entries) entries.push_back(&e);
      if (entries.empty()) {
        *out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
          return Value::less(a->first, b->first);
        });
      }
      out->push_back('{');
      if (o.indent) newline(level + 1);
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) {
          *out += o.item_separator;
          if (o.indent) newline(level + 1);
        }
        dump_string(key_string(entries[i]->first), o.ensure_ascii, out);
        *out += o.key_separator;
        dump(entries[i]->second, o, level + 1, out);
      }
      if (o.indent) newline(level);
      out->push_back('}');
      return;
    }
    case Kind::kUndefined:
    case Kind::kFunction:
      break;
  }
  throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
}

}  // namespace

namespace {

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth) throw TemplateError("JSON input nested too deeply");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::floating(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::binary:
      return Value::none();
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.dict_obj().set(it.key(), from_json_at(it.value(), depth + 1));
      }
      return d;
    }
  }
  return Value::none();
}

}  // namespace

Value value_from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dump(v, options, 0, &out);
  return out;
}

}  // namespace dserve::jinja
