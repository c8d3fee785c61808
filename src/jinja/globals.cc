#include "jinja/globals.h"

#include <ctime>
#include <memory>

namespace dserve::jinja {
namespace {

// dict(*args, **kwargs): an optional mapping or iterable of pairs, then keywords.
void fill_dict(DictObj* d, const CallArgs& args, std::string_view fn) {
  if (args.positional.size() > 1) {
    throw TemplateError(std::string(fn) + " expected at most 1 positional argument");
  }
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict_obj().entries) d->set(k, v);
    } else {
      for (const Value& pair : src.iterate()) {
        const std::vector<Value> kv = pair.iterate();
        if (kv.size() != 2) {
          throw TemplateError("dictionary update sequence element has length " +
                              std::to_string(kv.size()) + "; 2 is required");
        }
        d->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) d->set(k, v);
}

Value range_fn(CallArgs& args) {
  if (!args.keyword.empty()) throw TemplateError("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) {
    throw TemplateError("range expected 1 to 3 arguments, got " + std::to_string(p.size()));
  }
  int64_t start = 0, stop = 0, step = 1;
  if (p.size() == 1) {
    stop = checked_int(p[0], "range()");
  } else {
    start = checked_int(p[0], "range()");
    stop = checked_int(p[1], "range()");
    if (p.size() == 3) step = checked_int(p[2], "range()");
  }
  if (step == 0) throw TemplateError("range() arg 3 must not be zero");
  // Length without overflow, as a long double.
  const long double span = static_cast<long double>(stop) - static_cast<long double>(start);
  long double count = span / static_cast<long double>(step);
  if (count < 0) count = 0;
  if (count > kMaxRange) {
    throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                        std::to_string(kMaxRange) + ").");
  }
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    items.push_back(Value::integer(i));
  return Value::list(std::move(items));
}

Value strftime_now(CallArgs& args) {
  const auto bound = bind_args(args, {"format"}, "strftime_now");
  if (!bound[0] || !bound[0]->is_string())
    throw TemplateError("strftime_now() needs a format string");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  const std::string& fmt = bound[0]->str();
  if (fmt.empty()) return Value::string("");
  std::string buf(256 + fmt.size() * 8, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(std::move(buf));
}

}  // namespace

std::unordered_map<std::string, Value> make_globals() {
  std::unordered_map<std::string, Value> g;
  g["range"] = Value::function("range", range_fn);
  g["namespace"] = Value::function("namespace", [](CallArgs& args) {
    Value ns = Value::namespace_object();
    fill_dict(&ns.dict_obj(), args, "namespace");
    for (const auto& [k, v] : ns.dict_obj().entries) {
      if (k.is_string() && !k.str().empty() && k.str()[0] == '_') {
        throw TemplateError(
            "chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
            k.repr());
      }
    }
    return ns;
  });
  g["dict"] = Value::function("dict", [](CallArgs& args) {
    Value d = Value::dict();
    fill_dict(&d.dict_obj(), args, "dict");
    return d;
  });
  g["raise_exception"] = Value::function("raise_exception", [](CallArgs& args) -> Value {
    const auto bound = bind_args(args, {"message"}, "raise_exception");
    throw TemplateError(bound[0] ? bound[0]->to_str() : std::string("raise_exception called"));
  });
  g["strftime_now"] = Value::function("strftime_now", strftime_now);
  g["joiner"] = Value::function("joiner", [](CallArgs& args) {
    const auto bound = bind_args(args, {"sep"}, "joiner");
    const std::string sep = bound[0] ? bound[0]->to_str() : ", ";
    auto used = std::make_shared<bool>(false);
    return Value::function("joiner", [sep, used](CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return Value::string(sep);
    });
  });
  return g;
}

}  // namespace dserve::jinja
