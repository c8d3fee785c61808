// Jinja's built-in tests (`x is defined`, `x is string`, ...), jinja2/tests.py.
#include "jinja/builtins.h"
#include "jinja/operators.h"
#include "jinja/py_str.h"

namespace dserve::jinja {
namespace {

const Value& arg(const CallArgs& args, std::string_view test) {
  if (args.positional.empty()) {
    if (!args.keyword.empty()) return args.keyword[0].second;
    throw TemplateError("test '" + std::string(test) + "' needs an argument");
  }
  return args.positional[0];
}

int64_t int_operand(const Value& v, std::string_view test) {
  if (!v.is_int() && !v.is_bool()) {
    v.fail("test '" + std::string(test) + "' needs an integer, got " + v.type_name());
  }
  return v.as_integral();
}

}  // namespace

bool apply_test(std::string_view name, const Value& v, CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_mapping();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_mapping() || v.is_undefined();
  if (name == "iterable") {
    return v.is_string() || v.is_list() || v.is_mapping() || v.is_undefined() ||
           (v.is_dict() && v.dict_obj().kind == DictKind::kLoop);
  }
  if (name == "callable") return v.is_function();
  if (name == "escaped") return false;
  if (name == "lower")
    return v.is_string() ? py_is_cased(v.str(), false) : py_is_cased(v.to_str(), false);
  if (name == "upper")
    return v.is_string() ? py_is_cased(v.str(), true) : py_is_cased(v.to_str(), true);
  if (name == "odd") {
    const int64_t i = int_operand(v, name);
    return ((i % 2) + 2) % 2 == 1;
  }
  if (name == "even") return int_operand(v, name) % 2 == 0;
  if (name == "divisibleby") {
    const int64_t d = int_operand(arg(args, name), name);
    if (d == 0) throw TemplateError("integer division or modulo by zero");
    return int_operand(v, name) % d == 0;
  }
  if (name == "sameas") return Value::same(v, arg(args, name));
  if (name == "in") return contains(arg(args, name), v);
  if (name == "==" || name == "eq" || name == "equalto")
    return compare_op("==", v, arg(args, name));
  if (name == "!=" || name == "ne") return compare_op("!=", v, arg(args, name));
  if (name == "<" || name == "lt" || name == "lessthan") return compare_op("<", v, arg(args, name));
  if (name == "<=" || name == "le") return compare_op("<=", v, arg(args, name));
  if (name == ">" || name == "gt" || name == "greaterthan")
    return compare_op(">", v, arg(args, name));
  if (name == ">=" || name == "ge") return compare_op(">=", v, arg(args, name));
  if (name == "filter" || name == "test") {
    // Whether a filter/test of that name exists: probe by name only.
    if (!v.is_string()) return false;
    static constexpr std::string_view kTests[] = {
        "defined", "undefined", "none",        "boolean", "true",     "false",       "integer",
        "float",   "number",    "string",      "mapping", "sequence", "iterable",    "callable",
        "escaped", "lower",     "upper",       "odd",     "even",     "divisibleby", "sameas",
        "in",      "eq",        "ne",          "lt",      "le",       "gt",          "ge",
        "equalto", "lessthan",  "greaterthan", "filter",  "test"};
    if (name == "test") {
      for (std::string_view t : kTests) {
        if (t == v.str()) return true;
      }
      return false;
    }
    return has_filter(v.str());
  }
  throw TemplateError("no test named '" + std::string(name) + "'");
}

}  // namespace dserve::jinja
