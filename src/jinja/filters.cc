// Jinja's built-in filters (jinja2/filters.py) and transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "jinja/builtins.h"
#include "jinja/json_value.h"
#include "jinja/py_format.h"
#include "jinja/py_str.h"

namespace dserve::jinja {
namespace {

using FilterFn = Value (*)(const Value&, CallArgs&);
using Bound = std::vector<std::optional<Value>>;

Bound bind(CallArgs& args, std::vector<std::string_view> names, std::string_view filter) {
  return bind_args(args, names, filter);
}

bool flag(const std::optional<Value>& v, bool dflt = false) { return v ? v->truthy() : dflt; }

// soft_str: what string filters do to their input (Undefined becomes "").
std::string text(const Value& v) { return v.to_str(); }

// Jinja's make_attrgetter: "a.b.0" looked up item by item (digits as indices).
Value attr_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    const bool numeric = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    if (v.is_undefined()) v.fail("");
    v = get_item(v, numeric ? Value::integer(std::stoll(part)) : Value::string(part));
    start = dot + 1;
  }
  return v;
}

// The sort key Jinja uses when case_sensitive is false: strings lower-cased.
Value fold_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.str()));
  return v;
}

Value f_abs(const Value& v, CallArgs& args) {
  bind(args, {}, "abs");
  if (v.is_float()) return Value::floating(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    const int64_t i = v.as_integral();
    if (i == INT64_MIN) throw TemplateError("integer overflow");
    return Value::integer(i < 0 ? -i : i);
  }
  v.fail("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_attr(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"name"}, "attr");
  if (!b[0] || !b[0]->is_string()) throw TemplateError("attr filter needs an attribute name");
  if (v.is_undefined()) v.fail("");
  return get_attribute(v, b[0]->str(), /*dict_keys=*/false);
}

Value f_batch(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"linecount", "fill_with"}, "batch");
  if (!b[0]) throw TemplateError("batch filter needs a line count");
  const int64_t n = checked_int(*b[0], "batch");
  if (n <= 0) throw TemplateError("batch line count must be positive");
  std::vector<Value> out, cur;
  for (const Value& item : v.iterate()) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (b[1] && !b[1]->is_none()) {
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*b[1]);
    }
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(const Value& v, CallArgs& args) {
  bind(args, {}, "capitalize");
  return Value::string(py_capitalize(text(v)));
}

Value f_center(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"width"}, "center");
  CallArgs inner;
  inner.positional.push_back(b[0] ? *b[0] : Value::integer(80));
  return call_method(Value::string(text(v)), "center", inner);
}

Value f_length(const Value& v, CallArgs& args) {
  bind(args, {}, "length");
  switch (v.kind()) {
    case Kind::kString:
      return Value::integer(static_cast<int64_t>(count_code_points(v.str())));
    case Kind::kList:
      return Value::integer(static_cast<int64_t>(v.list_obj().items.size()));
    case Kind::kDict:
      if (v.is_mapping()) return Value::integer(static_cast<int64_t>(v.dict_obj().entries.size()));
      break;
    case Kind::kUndefined:
      return Value::integer(0);
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kFunction:
      break;
  }
  throw TemplateError("object of type '" + v.type_name() + "' has no len()");
}

Value f_default(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"default_value", "boolean"}, "default");
  const bool use_default = v.is_undefined() || (flag(b[1]) && !v.truthy());
  if (!use_default) return v;
  return b[0] ? *b[0] : Value::string("");
}

Value f_dictsort(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"case_sensitive", "by", "reverse"}, "dictsort");
  if (!v.is_mapping()) v.fail("dictsort filter needs a mapping, got " + v.type_name());
  const bool case_sensitive = flag(b[0]);
  const std::string by = b[1] ? b[1]->to_str() : "key";
  if (by != "key" && by != "value")
    throw TemplateError("You can only sort by either 'key' or 'value'");
  const size_t pos = by == "key" ? 0 : 1;
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict_obj().entries) items.push_back(Value::list({k, val}, true));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return Value::less(fold_case(x.list_obj().items[pos], case_sensitive),
                       fold_case(y.list_obj().items[pos], case_sensitive));
  });
  if (flag(b[2])) std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_escape(const Value& v, CallArgs& args) {
  bind(args, {}, "escape");
  std::string out;
  for (char c : text(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value::string(std::move(out));
}

Value f_first(const Value& v, CallArgs& args) {
  bind(args, {}, "first");
  const std::vector<Value> items = v.iterate();
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(const Value& v, CallArgs& args) {
  bind(args, {}, "last");
  const std::vector<Value> items = v.iterate();
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's float(str): surrounding whitespace, underscores between digits, inf/nan.
std::optional<double> parse_float(const std::string& s) {
  std::string t = py_strip(s, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_' && i > 0 && i + 1 < t.size() &&
        std::isdigit(static_cast<unsigned char>(t[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(t[i + 1]))) {
      continue;
    }
    clean.push_back(t[i]);
  }
  if (clean.empty()) return std::nullopt;
  const std::string lower = py_lower(clean);
  const std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double d = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -d : d;
  }
  if (clean.find_first_not_of("0123456789+-.eE") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

// Python's int(str, base): whitespace, sign, underscores, 0x/0o/0b prefixes for base 0/16/8/2.
std::optional<int64_t> parse_int(const std::string& s, int base) {
  std::string t = py_strip(s, std::nullopt, true, true);
  bool neg = false;
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  std::string digits;
  if (i + 1 < t.size() && t[i] == '0') {
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(t[i + 1])));
    const int prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base && (base == 0 || base == prefix_base)) {
      base = prefix_base;
      i += 2;
      if (i < t.size() && t[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  for (; i < t.size(); ++i) {
    if (t[i] == '_' && !digits.empty() && i + 1 < t.size() && t[i + 1] != '_') continue;
    digits.push_back(t[i]);
  }
  if (digits.empty()) return std::nullopt;
  int64_t out = 0;
  for (char c : digits) {
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c))
                ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(out, base, &out) || __builtin_add_overflow(out, d, &out)) {
      throw TemplateError("integer too large");
    }
  }
  return neg ? -out : out;
}

int64_t float_to_int(double d) {
  if (!std::isfinite(d)) throw TemplateError("cannot convert float infinity or NaN to integer");
  if (std::fabs(d) >= 9.2e18) throw TemplateError("integer too large");
  return static_cast<int64_t>(std::trunc(d));
}

Value f_float(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"default"}, "float");
  const Value dflt = b[0] ? *b[0] : Value::floating(0.0);
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string()) {
    if (auto d = parse_float(v.str())) return Value::floating(*d);
  }
  return dflt;
}

Value f_int(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"default", "base"}, "int");
  const Value dflt = b[0] ? *b[0] : Value::integer(0);
  const int64_t base = b[1] ? checked_int(*b[1], "int") : 10;
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_integral());
  if (v.is_float()) return Value::integer(float_to_int(v.as_float()));
  if (v.is_string()) {
    if (base != 0 && (base < 2 || base > 36))
      throw TemplateError("int() base must be >= 2 and <= 36, or 0");
    if (auto i = parse_int(v.str(), static_cast<int>(base))) return Value::integer(*i);
    if (auto d = parse_float(v.str())) return Value::integer(float_to_int(*d));
  }
  return dflt;
}

Value f_format(const Value& v, CallArgs& args) {
  if (!args.keyword.empty() && !args.positional.empty()) {
    throw TemplateError("can't handle positional and keyword arguments at the same time");
  }
  if (!args.keyword.empty()) {
    Value d = Value::dict();
    for (const auto& [k, val] : args.keyword) d.dict_obj().set(k, val);
    return Value::string(percent_format(text(v), d));
  }
  return Value::string(percent_format(text(v), Value::list(args.positional, true)));
}

Value f_indent(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"width", "first", "blank"}, "indent");
  std::string indention = "    ";
  if (b[0]) {
    indention =
        b[0]->is_string()
            ? b[0]->str()
            : std::string(std::clamp<int64_t>(checked_int(*b[0], "indent"), 0, 1 << 20), ' ');
  }
  if (!v.is_string()) v.fail("indent filter needs a string, got " + v.type_name());
  const std::string s = v.str() + "\n";
  std::string rv;
  const std::vector<std::string> lines = py_splitlines(s, false);
  if (flag(b[2])) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += indention;
        rv += lines[i];
      }
    }
  }
  if (flag(b[1])) rv = indention + rv;
  return Value::string(std::move(rv));
}

Value f_items(const Value& v, CallArgs& args) {
  bind(args, {}, "items");
  if (v.is_undefined()) return Value::list();
  if (!v.is_mapping()) throw TemplateError("Can only get item pairs from a mapping.");
  CallArgs none;
  return call_method(v, "items", none);
}

Value f_join(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"d", "attribute"}, "join");
  const std::string sep = b[0] ? b[0]->to_str() : "";
  std::string out;
  bool first = true;
  for (const Value& item : v.iterate()) {
    if (!first) out += sep;
    first = false;
    out += (b[1] && !b[1]->is_none() ? attr_path(item, b[1]->to_str()) : item).to_str();
  }
  return Value::string(std::move(out));
}

Value f_list(const Value& v, CallArgs& args) {
  bind(args, {}, "list");
  return Value::list(v.iterate());
}

Value f_lower(const Value& v, CallArgs& args) {
  bind(args, {}, "lower");
  return Value::string(py_lower(text(v)));
}

Value f_upper(const Value& v, CallArgs& args) {
  bind(args, {}, "upper");
  return Value::string(py_upper(text(v)));
}

Value f_map(const Value& v, CallArgs& args) {
  std::vector<Value> out;
  std::optional<std::string> attribute;
  std::optional<Value> dflt;
  CallArgs rest;
  for (const auto& [k, val] : args.keyword) {
    if (k == "attribute") {
      attribute = val.to_str();
    } else if (k == "default") {
      dflt = val;
    } else {
      rest.keyword.emplace_back(k, val);
    }
  }
  if (!attribute && args.positional.empty()) throw TemplateError("map requires a filter argument");
  for (const Value& item : v.iterate()) {
    if (attribute) {
      Value x = attr_path(item, *attribute);
      if (x.is_undefined() && dflt) x = *dflt;
      out.push_back(x);
    } else {
      CallArgs call;
      call.positional.assign(args.positional.begin() + 1, args.positional.end());
      call.keyword = rest.keyword;
      out.push_back(apply_filter(args.positional[0].to_str(), item, call));
    }
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& v, CallArgs& args, bool want_max, std::string_view name) {
  const Bound b = bind(args, {"case_sensitive", "attribute"}, name);
  const bool cs = flag(b[0]);
  const std::vector<Value> items = v.iterate();
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    return fold_case(b[1] && !b[1]->is_none() ? attr_path(x, b[1]->to_str()) : x, cs);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const bool better = want_max ? Value::less(key(items[best]), key(items[i]))
                                 : Value::less(key(items[i]), key(items[best]));
    if (better) best = i;
  }
  return items[best];
}

Value f_max(const Value& v, CallArgs& args) { return min_max(v, args, true, "max"); }
Value f_min(const Value& v, CallArgs& args) { return min_max(v, args, false, "min"); }

// select/reject/selectattr/rejectattr.
Value select_impl(const Value& v, CallArgs& args, bool by_attr, bool keep_if) {
  size_t at = 0;
  std::optional<std::string> attribute;
  if (by_attr) {
    if (args.positional.empty())
      throw TemplateError("selectattr/rejectattr need an attribute name");
    attribute = args.positional[at++].to_str();
  }
  std::optional<std::string> test;
  if (at < args.positional.size()) test = args.positional[at++].to_str();
  std::vector<Value> out;
  for (const Value& item : v.iterate()) {
    const Value x = attribute ? attr_path(item, *attribute) : item;
    bool pass;
    if (test) {
      CallArgs call;
      call.positional.assign(args.positional.begin() + at, args.positional.end());
      call.keyword = args.keyword;
      pass = apply_test(*test, x, call);
    } else {
      pass = x.truthy();
    }
    if (pass == keep_if) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(const Value& v, CallArgs& a) { return select_impl(v, a, false, true); }
Value f_reject(const Value& v, CallArgs& a) { return select_impl(v, a, false, false); }
Value f_selectattr(const Value& v, CallArgs& a) { return select_impl(v, a, true, true); }
Value f_rejectattr(const Value& v, CallArgs& a) { return select_impl(v, a, true, false); }

Value f_replace(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"old", "new", "count"}, "replace");
  if (!b[0] || !b[1]) throw TemplateError("replace filter needs old and new strings");
  const int64_t count = b[2] && !b[2]->is_none() ? checked_int(*b[2], "replace") : -1;
  return Value::string(py_replace(text(v), b[0]->to_str(), b[1]->to_str(), count));
}

Value f_reverse(const Value& v, CallArgs& args) {
  bind(args, {}, "reverse");
  if (v.is_string()) {
    std::u32string u = decode_utf8(v.str());
    std::reverse(u.begin(), u.end());
    return Value::string(encode_utf8(u));
  }
  std::vector<Value> items = v.iterate();
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

// Python's round(x, n) for floats: correctly rounded, ties to even on the exact value.
double py_round(double x, int64_t n) {
  if (!std::isfinite(x) || n > 300) return x;
  if (n < -308) return 0.0 * x;
  if (n < 0) {
    const double p = std::pow(10.0, static_cast<double>(-n));
    const double y = std::nearbyint(x / p) * p;
    return y;
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(n), x);
  return std::strtod(buf, nullptr);
}

Value f_round(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"precision", "method"}, "round");
  const int64_t precision = b[0] ? checked_int(*b[0], "round") : 0;
  const std::string method = b[1] ? b[1]->to_str() : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    throw TemplateError("method must be common, ceil or floor");
  }
  if (!v.is_number()) v.fail("type " + v.type_name() + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) {
      if (precision >= 0) return Value::integer(v.as_integral());
      const double p = std::pow(10.0, static_cast<double>(-precision));
      return Value::integer(static_cast<int64_t>(std::nearbyint(v.as_double() / p) * p));
    }
    return Value::floating(py_round(v.as_float(), precision));
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double r = method == "ceil" ? std::ceil(v.as_double() * p) : std::floor(v.as_double() * p);
  return Value::floating(r / p);
}

Value f_safe(const Value& v, CallArgs& args) {
  bind(args, {}, "safe");
  return Value::string(text(v));
}

Value f_sort(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"reverse", "case_sensitive", "attribute"}, "sort");
  std::vector<Value> items = v.iterate();
  const bool cs = flag(b[1]);
  auto key = [&](const Value& x) {
    return fold_case(b[2] && !b[2]->is_none() ? attr_path(x, b[2]->to_str()) : x, cs);
  };
  const bool rev = flag(b[0]);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? Value::less(key(y), key(x)) : Value::less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value f_string(const Value& v, CallArgs& args) {
  bind(args, {}, "string");
  return v.is_string() ? v : Value::string(text(v));
}

Value f_sum(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"attribute", "start"}, "sum");
  Value total = b[1] ? *b[1] : Value::integer(0);
  for (const Value& item : v.iterate()) {
    const Value x = b[0] && !b[0]->is_none() ? attr_path(item, b[0]->to_str()) : item;
    if (!total.is_number() || !x.is_number()) {
      throw TemplateError("unsupported operand type(s) for +: '" + total.type_name() + "' and '" +
                          x.type_name() + "'");
    }
    if (!total.is_float() && !x.is_float()) {
      int64_t r;
      if (__builtin_add_overflow(total.as_integral(), x.as_integral(), &r))
        throw TemplateError("integer overflow");
      total = Value::integer(r);
    } else {
      total = Value::floating(total.as_double() + x.as_double());
    }
  }
  return total;
}

Value f_title(const Value& v, CallArgs& args) {
  bind(args, {}, "title");
  // Jinja: split on runs of [-\s({[<], upper-case each piece's first char, lower the rest.
  const std::u32string u = decode_utf8(text(v));
  auto is_sep = [](char32_t c) {
    return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  bool at_start = true;
  for (char32_t c : u) {
    std::string one;
    append_utf8(&one, c);
    if (is_sep(c)) {
      out += one;
      at_start = true;
    } else {
      out += at_start ? py_upper(one) : py_lower(one);
      at_start = false;
    }
  }
  return Value::string(std::move(out));
}

Value f_tojson(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonDumpOptions o;
  o.ensure_ascii = flag(b[0]);
  if (b[1] && !b[1]->is_none()) {
    if (b[1]->is_string()) {
      o.indent = b[1]->str();
    } else {
      o.indent = std::string(std::clamp<int64_t>(checked_int(*b[1], "indent"), 0, 1 << 10), ' ');
    }
    o.item_separator = ",";
  }
  if (b[2] && !b[2]->is_none()) {
    const std::vector<Value> seps = b[2]->iterate();
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      throw TemplateError("separators must be an (item_separator, key_separator) pair of strings");
    }
    o.item_separator = seps[0].str();
    o.key_separator = seps[1].str();
  }
  o.sort_keys = flag(b[3]);
  return Value::string(json_dumps(v, o));
}

Value f_trim(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"chars"}, "trim");
  std::optional<std::string> chars;
  if (b[0] && !b[0]->is_none()) chars = b[0]->to_str();
  return Value::string(py_strip(text(v), chars, true, true));
}

Value f_unique(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"case_sensitive", "attribute"}, "unique");
  const bool cs = flag(b[0]);
  std::vector<Value> out, seen;
  for (const Value& item : v.iterate()) {
    const Value key =
        fold_case(b[1] && !b[1]->is_none() ? attr_path(item, b[1]->to_str()) : item, cs);
    bool dup = false;
    for (const Value& s : seen) {
      if (Value::equals(s, key)) {
        dup = true;
        break;
      }
    }
    if (dup) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_wordcount(const Value& v, CallArgs& args) {
  bind(args, {}, "wordcount");
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : decode_utf8(text(v))) {
    const bool w = py_isword(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_truncate(const Value& v, CallArgs& args) {
  const Bound b = bind(args, {"length", "killwords", "end", "leeway"}, "truncate");
  const std::u32string s = decode_utf8(text(v));
  const int64_t length = b[0] ? checked_int(*b[0], "truncate") : 255;
  const std::u32string end = decode_utf8(b[2] ? b[2]->to_str() : "...");
  const int64_t leeway = b[3] && !b[3]->is_none() ? checked_int(*b[3], "truncate") : 5;
  if (length < static_cast<int64_t>(end.size())) throw TemplateError("expected length >= len(end)");
  if (leeway < 0) throw TemplateError("expected leeway >= 0");
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::string(encode_utf8(s));
  std::u32string cut = s.substr(0, length - end.size());
  if (!flag(b[1])) {
    const size_t sp = cut.rfind(U' ');
    if (sp != std::u32string::npos) cut = cut.substr(0, sp);
  }
  return Value::string(encode_utf8(cut + end));
}

const std::unordered_map<std::string_view, FilterFn>& filter_table() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"format", f_format},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return table;
}

}  // namespace

bool has_filter(std::string_view name) { return filter_table().count(name) > 0; }

Value apply_filter(std::string_view name, const Value& input, CallArgs& args) {
  const auto& table = filter_table();
  const auto it = table.find(name);
  if (it == table.end()) throw TemplateError("no filter named '" + std::string(name) + "'");
  return it->second(input, args);
}

}  // namespace dserve::jinja
