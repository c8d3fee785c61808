#include "jinja/operators.h"

#include <cmath>
#include <string>

#include "jinja/py_format.h"

namespace dserve::jinja {
namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail("");
  if (b.is_undefined()) b.fail("");
  throw TemplateError("unsupported operand type(s) for " + std::string(op) + ": '" + a.type_name() +
                      "' and '" + b.type_name() + "'");
}

void check_overflow(bool overflow) {
  if (overflow) throw TemplateError("integer overflow");
}

bool both_integral(const Value& a, const Value& b) {
  return a.is_number() && b.is_number() && !a.is_float() && !b.is_float();
}

// Python's float floor division and modulo (float_divmod in CPython).
void float_divmod(double vx, double wx, double* div, double* mod) {
  if (wx == 0.0) throw TemplateError("float division by zero");
  *mod = std::fmod(vx, wx);
  double d = (vx - *mod) / wx;
  if (*mod != 0.0) {
    if ((wx < 0) != (*mod < 0)) {
      *mod += wx;
      d -= 1.0;
    }
  } else {
    *mod = std::copysign(0.0, wx);
  }
  if (d != 0.0) {
    const double floordiv = std::floor(d);
    if (d - floordiv > 0.5) {
      *div = floordiv + 1.0;
    } else {
      *div = floordiv;
    }
  } else {
    *div = std::copysign(0.0, vx / wx);
  }
}

Value repeat(const Value& seq, int64_t n, size_t max_size) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (!s.empty() && static_cast<size_t>(n) > max_size / s.size()) {
      throw TemplateError("string repetition result too large");
    }
    std::string out;
    out.reserve(s.size() * n);
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::string(std::move(out));
  }
  const auto& items = seq.list_obj().items;
  if (!items.empty() && static_cast<size_t>(n) > max_size / items.size()) {
    throw TemplateError("list repetition result too large");
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.is_tuple());
}

Value power(const Value& a, const Value& b) {
  if (both_integral(a, b) && b.as_integral() >= 0) {
    int64_t base = a.as_integral(), exp = b.as_integral(), result = 1;
    while (exp > 0) {
      if (exp & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
      exp >>= 1;
      if (exp > 0) check_overflow(__builtin_mul_overflow(base, base, &base));
    }
    return Value::integer(result);
  }
  const double x = a.as_double(), y = b.as_double();
  if (x == 0.0 && y < 0) throw TemplateError("0.0 cannot be raised to a negative power");
  return Value::floating(std::pow(x, y));
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b, size_t max_size) {
  if (op == "~") {
    std::string s = a.to_str();
    s += b.to_str();
    if (s.size() > max_size) throw TemplateError("string too large");
    return Value::string(std::move(s));
  }
  const bool numbers = a.is_number() && b.is_number();
  if (op == "+") {
    if (numbers) {
      if (both_integral(a, b)) {
        int64_t r;
        check_overflow(__builtin_add_overflow(a.as_integral(), b.as_integral(), &r));
        return Value::integer(r);
      }
      return Value::floating(a.as_double() + b.as_double());
    }
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > max_size) throw TemplateError("string too large");
      return Value::string(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.list_obj().items;
      const auto& more = b.list_obj().items;
      items.insert(items.end(), more.begin(), more.end());
      if (items.size() > max_size) throw TemplateError("list too large");
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string() && !b.is_undefined()) {
      throw TemplateError("can only concatenate str (not \"" + b.type_name() + "\") to str");
    }
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (!numbers) unsupported(op, a, b);
    if (both_integral(a, b)) {
      int64_t r;
      check_overflow(__builtin_sub_overflow(a.as_integral(), b.as_integral(), &r));
      return Value::integer(r);
    }
    return Value::floating(a.as_double() - b.as_double());
  }
  if (op == "*") {
    if (numbers) {
      if (both_integral(a, b)) {
        int64_t r;
        check_overflow(__builtin_mul_overflow(a.as_integral(), b.as_integral(), &r));
        return Value::integer(r);
      }
      return Value::floating(a.as_double() * b.as_double());
    }
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
      return repeat(a, b.as_integral(), max_size);
    }
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) {
      return repeat(b, a.as_integral(), max_size);
    }
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!numbers) unsupported(op, a, b);
    if (b.as_double() == 0.0) throw TemplateError("division by zero");
    return Value::floating(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value::string(percent_format(a.str(), b));
    if (!numbers) unsupported(op, a, b);
    if (both_integral(a, b)) {
      const int64_t x = a.as_integral(), y = b.as_integral();
      if (y == 0) throw TemplateError("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) throw TemplateError("integer overflow");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    double div, mod;
    float_divmod(a.as_double(), b.as_double(), &div, &mod);
    return Value::floating(op == "//" ? div : mod);
  }
  if (op == "**") {
    if (!numbers) unsupported(op, a, b);
    return power(a, b);
  }
  throw TemplateError("unknown operator " + std::string(op));
}

Value unary_op(std::string_view op, const Value& a) {
  if (!a.is_number()) {
    a.fail("bad operand type for unary " + std::string(op) + ": '" + a.type_name() + "'");
  }
  if (op == "+") return a.is_bool() ? Value::integer(a.as_integral()) : a;
  if (a.is_float()) return Value::floating(-a.as_float());
  if (a.as_integral() == INT64_MIN) throw TemplateError("integer overflow");
  return Value::integer(-a.as_integral());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) item.fail("");
        throw TemplateError("'in <string>' requires string as left operand, not " +
                            item.type_name());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.list_obj().items) {
        if (Value::equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (container.is_mapping()) return container.dict_obj().find(item) != nullptr;
      break;
    case Kind::kUndefined:
      return false;
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kFunction:
      break;
  }
  throw TemplateError("argument of type '" + container.type_name() + "' is not iterable");
}

bool compare_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return Value::equals(a, b);
  if (op == "!=") return !Value::equals(a, b);
  if (op == "<") return Value::less(a, b);
  if (op == ">") return Value::less(b, a);
  if (op == "<=") return Value::less(a, b) || Value::equals(a, b);
  if (op == ">=") return Value::less(b, a) || Value::equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  throw TemplateError("unknown comparison " + std::string(op));
}

}  // namespace dserve::jinja
