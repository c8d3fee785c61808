// Attribute and item access, and the Python methods of str, dict and list that chat
// templates call (message.content.strip(), messages[0]['role'], tool.get('x'), ...).
#include <algorithm>

#include "jinja/builtins.h"
#include "jinja/py_format.h"
#include "jinja/py_str.h"

namespace dserve::jinja {
namespace {

constexpr std::string_view kStrMethods[] = {
    "strip",    "lstrip",  "rstrip",  "split",    "rsplit",       "splitlines",   "startswith",
    "endswith", "upper",   "lower",   "title",    "capitalize",   "replace",      "find",
    "rfind",    "index",   "count",   "join",     "format",       "isdigit",      "isalpha",
    "isalnum",  "isspace", "isupper", "islower",  "removeprefix", "removesuffix", "zfill",
    "center",   "ljust",   "rjust",   "swapcase", "partition",    "rpartition"};
constexpr std::string_view kDictMethods[] = {"items", "keys",   "values",     "get",   "copy",
                                             "pop",   "update", "setdefault", "clear", "popitem"};
constexpr std::string_view kListMethods[] = {"append", "index",   "count",  "copy",
                                             "pop",    "extend",  "insert", "remove",
                                             "sort",   "reverse", "clear"};

template <size_t N>
bool in(std::string_view name, const std::string_view (&names)[N]) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool has_method(const Value& obj, std::string_view name) {
  if (obj.is_string()) return in(name, kStrMethods);
  if (obj.is_mapping()) return in(name, kDictMethods);
  if (obj.is_list())
    return in(name, kListMethods) && (!obj.is_tuple() || name == "index" || name == "count");
  return false;
}

Value bound_method(const Value& obj, std::string_view name) {
  return Value::function(std::string(name), [obj, n = std::string(name)](CallArgs& args) {
    return call_method(obj, n, args);
  });
}

std::string object_type_repr(const Value& obj) {
  if (obj.is_none()) return "None";
  return obj.type_name() + " object";
}

Value missing(const Value& obj, const Value& key) {
  if (key.is_string()) {
    return Value::undefined("'" + object_type_repr(obj) + "' has no attribute " + key.repr());
  }
  return Value::undefined("'" + object_type_repr(obj) + "' has no element " + key.repr());
}

std::optional<std::string> opt_str(const std::optional<Value>& v, std::string_view what) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) {
    v->fail(std::string(what) + " arg must be None or str, not " + v->type_name());
  }
  return v->str();
}

const std::string& need_str(const std::optional<Value>& v, std::string_view what) {
  if (!v) throw TemplateError(std::string(what) + "() missing required argument");
  if (!v->is_string()) {
    v->fail(std::string(what) + "() argument must be str, not " + v->type_name());
  }
  return v->str();
}

int64_t opt_int(const std::optional<Value>& v, int64_t dflt, std::string_view what) {
  if (!v || v->is_none()) return dflt;
  return checked_int(*v, what);
}

// startswith/endswith with an optional tuple of candidates.
bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) {
      a.fail(std::string(prefix ? "startswith" : "endswith") +
             " first arg must be str or a tuple of str, not " + a.type_name());
    }
    const std::string& x = a.str();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_tuple()) {
    for (const Value& a : affix.list_obj().items) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, char align) {
  const auto len = static_cast<int64_t>(count_code_points(s));
  if (width <= len) return s;
  if (width > (int64_t{1} << 26)) throw TemplateError("width too large");
  const int64_t total = width - len;
  int64_t left = 0;
  if (align == '>') left = total;
  if (align == '^') left = total / 2 + (total & width & 1);  // CPython's str.center
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

Value str_method(const std::string& s, std::string_view name, CallArgs& args) {
  auto bind = [&](std::vector<std::string_view> names) { return bind_args(args, names, name); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto b = bind({"chars"});
    return Value::string(py_strip(s, opt_str(b[0], name), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const auto b = bind({"sep", "maxsplit"});
    const auto sep = opt_str(b[0], name);
    if (sep && sep->empty()) throw TemplateError("empty separator");
    const int64_t maxsplit = opt_int(b[1], -1, name);
    std::vector<Value> parts;
    for (auto& p : name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit)) {
      parts.push_back(Value::string(std::move(p)));
    }
    return Value::list(std::move(parts));
  }
  if (name == "splitlines") {
    const auto b = bind({"keepends"});
    std::vector<Value> parts;
    for (auto& p : py_splitlines(s, b[0] && b[0]->truthy()))
      parts.push_back(Value::string(std::move(p)));
    return Value::list(std::move(parts));
  }
  if (name == "startswith" || name == "endswith") {
    const auto b = bind({"affix", "start", "end"});
    if (!b[0]) throw TemplateError(std::string(name) + "() takes at least 1 argument");
    if (b[1] || b[2]) {
      const std::u32string u = decode_utf8(s);
      const auto idx = py_slice_indices(
          static_cast<int64_t>(u.size()),
          b[1] && !b[1]->is_none() ? std::optional(checked_int(*b[1], name)) : std::nullopt,
          b[2] && !b[2]->is_none() ? std::optional(checked_int(*b[2], name)) : std::nullopt,
          std::nullopt);
      std::u32string sub;
      for (int64_t i : idx) sub.push_back(u[i]);
      return Value::boolean(affix_match(encode_utf8(sub), *b[0], name == "startswith"));
    }
    return Value::boolean(affix_match(s, *b[0], name == "startswith"));
  }
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "swapcase") {
    std::string out;
    for (char32_t c : decode_utf8(s)) {
      std::string one;
      append_utf8(&one, c);
      const std::string up = py_upper(one);
      out += up != one ? up : py_lower(one);
    }
    return Value::string(std::move(out));
  }
  if (name == "replace") {
    const auto b = bind({"old", "new", "count"});
    return Value::string(
        py_replace(s, need_str(b[0], name), need_str(b[1], name), opt_int(b[2], -1, name)));
  }
  if (name == "find" || name == "rfind" || name == "index") {
    const auto b = bind({"sub"});
    const int64_t at = py_find(s, need_str(b[0], name), name == "rfind");
    if (name == "index" && at < 0) throw TemplateError("substring not found");
    return Value::integer(at);
  }
  if (name == "count") {
    const auto b = bind({"sub"});
    return Value::integer(py_count(s, need_str(b[0], name)));
  }
  if (name == "join") {
    const auto b = bind({"iterable"});
    if (!b[0]) throw TemplateError("join() takes exactly one argument");
    std::string out;
    size_t i = 0;
    for (const Value& item : b[0]->iterate()) {
      if (!item.is_string()) {
        throw TemplateError("sequence item " + std::to_string(i) + ": expected str instance, " +
                            item.type_name() + " found");
      }
      if (i++) out += s;
      out += item.str();
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(str_format(s, args));
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace") {
    const std::u32string u = decode_utf8(s);
    if (u.empty()) return Value::boolean(false);
    for (char32_t c : u) {
      bool ok = false;
      if (name == "isspace") ok = py_isspace(c);
      if (name == "isdigit") ok = c >= '0' && c <= '9';
      if (name == "isalpha") ok = py_isword(c) && c != '_' && !(c >= '0' && c <= '9');
      if (name == "isalnum") ok = py_isword(c) && c != '_';
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (name == "isupper") return Value::boolean(py_is_cased(s, true));
  if (name == "islower") return Value::boolean(py_is_cased(s, false));
  if (name == "removeprefix" || name == "removesuffix") {
    const auto b = bind({"affix"});
    const std::string& a = need_str(b[0], name);
    if (name == "removeprefix" && s.compare(0, a.size(), a) == 0)
      return Value::string(s.substr(a.size()));
    if (name == "removesuffix" && s.size() >= a.size() &&
        s.compare(s.size() - a.size(), a.size(), a) == 0) {
      return Value::string(s.substr(0, s.size() - a.size()));
    }
    return Value::string(s);
  }
  if (name == "zfill") {
    const auto b = bind({"width"});
    const int64_t width = opt_int(b[0], 0, name);
    const auto len = static_cast<int64_t>(count_code_points(s));
    if (width <= len) return Value::string(s);
    if (width > (int64_t{1} << 26)) throw TemplateError("width too large");
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    std::string out = sign ? s.substr(0, 1) : "";
    out += std::string(width - len, '0');
    out += sign ? s.substr(1) : s;
    return Value::string(std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const auto b = bind({"width", "fillchar"});
    const std::string fill = b[1] ? need_str(b[1], name) : " ";
    if (count_code_points(fill) != 1)
      throw TemplateError("The fill character must be exactly one character long");
    const char align = name == "center" ? '^' : name == "ljust" ? '<' : '>';
    return Value::string(pad(s, opt_int(b[0], 0, name), fill, align));
  }
  if (name == "partition" || name == "rpartition") {
    const auto b = bind({"sep"});
    const std::string& sep = need_str(b[0], name);
    if (sep.empty()) throw TemplateError("empty separator");
    const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      return name == "partition"
                 ? Value::list({Value::string(s), Value::string(""), Value::string("")}, true)
                 : Value::list({Value::string(""), Value::string(""), Value::string(s)}, true);
    }
    return Value::list({Value::string(s.substr(0, at)), Value::string(sep),
                        Value::string(s.substr(at + sep.size()))},
                       true);
  }
  throw TemplateError("'str' object has no attribute '" + std::string(name) + "'");
}

[[noreturn]] void unsafe(const Value& self, std::string_view name) {
  throw TemplateError("access to attribute '" + std::string(name) + "' of '" + self.type_name() +
                      "' object is unsafe.");
}

Value dict_method(const Value& self, std::string_view name, CallArgs& args) {
  const DictObj& d = self.dict_obj();
  if (name == "items" || name == "keys" || name == "values") {
    bind_args(args, {}, name);
    std::vector<Value> out;
    for (const auto& [k, v] : d.entries) {
      if (name == "items") out.push_back(Value::list({k, v}, true));
      if (name == "keys") out.push_back(k);
      if (name == "values") out.push_back(v);
    }
    return Value::list(std::move(out));
  }
  if (name == "get") {
    const auto b = bind_args(args, {"key", "default"}, name);
    if (!b[0]) throw TemplateError("get expected at least 1 argument, got 0");
    const Value* v = d.find(*b[0]);
    if (v) return *v;
    return b[1] ? *b[1] : Value::none();
  }
  if (name == "copy") {
    bind_args(args, {}, name);
    Value c = Value::dict();
    for (const auto& [k, v] : d.entries) c.dict_obj().set(k, v);
    return c;
  }
  unsafe(self, name);
}

Value list_method(const Value& self, std::string_view name, CallArgs& args) {
  ListObj& l = self.list_obj();
  if (name == "append" && !l.is_tuple) {
    const auto b = bind_args(args, {"object"}, name);
    if (!b[0]) throw TemplateError("append() takes exactly one argument (0 given)");
    if (l.items.size() >= (size_t{1} << 24)) throw TemplateError("list too large");
    MutationScope::note(self);
    l.items.push_back(*b[0]);
    return Value::none();
  }
  if (name == "index" || name == "count") {
    const auto b = bind_args(args, {"value"}, name);
    if (!b[0]) throw TemplateError(std::string(name) + "() takes exactly one argument (0 given)");
    int64_t n = 0;
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (!Value::equals(l.items[i], *b[0])) continue;
      if (name == "index") return Value::integer(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") throw TemplateError(b[0]->repr() + " is not in list");
    return Value::integer(n);
  }
  if (name == "copy") return Value::list(l.items, l.is_tuple);
  unsafe(self, name);
}

}  // namespace

Value call_method(const Value& self, std::string_view name, CallArgs& args) {
  if (self.is_string()) return str_method(self.str(), name, args);
  if (self.is_mapping()) return dict_method(self, name, args);
  if (self.is_list()) return list_method(self, name, args);
  self.fail("'" + self.type_name() + "' object has no attribute '" + std::string(name) + "'");
}

Value get_attribute(const Value& obj, std::string_view name, bool dict_keys) {
  if (has_method(obj, name)) return bound_method(obj, name);
  if (obj.is_dict() && (dict_keys || !obj.is_mapping())) {
    if (const Value* v = obj.dict_obj().find(name)) return *v;
  }
  return missing(obj, Value::string(std::string(name)));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_dict() && (obj.is_mapping() || key.is_string())) {
    if (const Value* v = obj.dict_obj().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_integral();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list_obj().items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list_obj().items[i];
    } else {
      const std::u32string u = decode_utf8(obj.str());
      const auto n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(encode_utf8(u.substr(i, 1)));
    }
    return missing(obj, key);
  }
  if (key.is_string() && has_method(obj, key.str())) return bound_method(obj, key.str());
  return missing(obj, key);
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto bound = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    return v.as_integral();
  };
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_none() && !v->is_int() && !v->is_bool()) return Value::undefined("bad slice index");
  }
  if (!step.is_none() && step.as_integral() == 0) throw TemplateError("slice step cannot be zero");
  if (obj.is_list()) {
    const auto& items = obj.list_obj().items;
    std::vector<Value> out;
    for (int64_t i : py_slice_indices(static_cast<int64_t>(items.size()), bound(start), bound(stop),
                                      bound(step))) {
      out.push_back(items[i]);
    }
    return Value::list(std::move(out), obj.is_tuple());
  }
  if (obj.is_string()) {
    const std::u32string u = decode_utf8(obj.str());
    std::u32string out;
    for (int64_t i :
         py_slice_indices(static_cast<int64_t>(u.size()), bound(start), bound(stop), bound(step))) {
      out.push_back(u[i]);
    }
    return Value::string(encode_utf8(out));
  }
  return Value::undefined("'" + object_type_repr(obj) + "' is not subscriptable");
}

}  // namespace dserve::jinja
