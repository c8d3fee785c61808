#include "jinja/py_format.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "jinja/builtins.h"
#include "jinja/py_str.h"

namespace dserve::jinja {
namespace {

constexpr int64_t kMaxWidth = int64_t{1} << 20;

std::string c_format(const std::string& spec, double d) {
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, spec.c_str(), d);
  if (n < 0 || n >= static_cast<int>(sizeof buf)) throw TemplateError("formatted number too long");
  return std::string(buf, n);
}

std::string c_format_int(const std::string& spec, long long v) {
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, spec.c_str(), v);
  if (n < 0 || n >= static_cast<int>(sizeof buf)) throw TemplateError("formatted number too long");
  return std::string(buf, n);
}

std::string pad_to(std::string s, int64_t width, bool left_align, char fill = ' ') {
  const auto len = static_cast<int64_t>(count_code_points(s));
  if (width <= len) return s;
  if (width > kMaxWidth) throw TemplateError("format width too large");
  const std::string padding(width - len, fill);
  return left_align ? s + padding : padding + s;
}

double as_real(const Value& v, char conv) {
  if (!v.is_number()) {
    v.fail(std::string("%") + conv + " format: a real number is required, not " + v.type_name());
  }
  return v.as_double();
}

int64_t as_integer(const Value& v, char conv) {
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) throw TemplateError("cannot convert float to integer");
    return static_cast<int64_t>(std::trunc(v.as_float()));
  }
  if (!v.is_number()) {
    v.fail(std::string("%") + conv + " format: a real number is required, not " + v.type_name());
  }
  return v.as_integral();
}

// Looks up "name.attr[key]..." for one str.format field.
Value resolve_field(std::string_view field, const CallArgs& args, size_t* auto_index) {
  size_t end = 0;
  while (end < field.size() && field[end] != '.' && field[end] != '[') ++end;
  const std::string_view head = field.substr(0, end);
  Value v;
  if (head.empty() || std::isdigit(static_cast<unsigned char>(head[0]))) {
    size_t index = *auto_index;
    if (head.empty()) {
      ++*auto_index;
    } else {
      index = std::stoul(std::string(head));
    }
    if (index >= args.positional.size()) {
      throw TemplateError("Replacement index " + std::to_string(index) +
                          " out of range for positional args tuple");
    }
    v = args.positional[index];
  } else {
    bool found = false;
    for (const auto& [k, val] : args.keyword) {
      if (k == head) {
        v = val;
        found = true;
      }
    }
    if (!found) throw TemplateError("KeyError: '" + std::string(head) + "'");
  }
  size_t i = end;
  while (i < field.size()) {
    if (field[i] == '.') {
      size_t j = i + 1;
      while (j < field.size() && field[j] != '.' && field[j] != '[') ++j;
      v = get_attribute(v, field.substr(i + 1, j - i - 1));
      i = j;
    } else {
      const size_t close = field.find(']', i);
      if (close == std::string_view::npos) throw TemplateError("Missing ']' in format string");
      const std::string key(field.substr(i + 1, close - i - 1));
      const bool numeric = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos;
      v = get_item(v, numeric ? Value::integer(std::stoll(key)) : Value::string(key));
      i = close + 1;
    }
    if (v.is_undefined()) v.fail("");
  }
  return v;
}

}  // namespace

std::string percent_format(const std::string& format, const Value& args) {
  std::vector<Value> positional;
  const bool by_key = args.is_mapping();
  if (args.is_tuple()) {
    positional = args.list_obj().items;
  } else if (!by_key) {
    positional.push_back(args);
  }
  size_t next_arg = 0;
  auto take = [&]() -> const Value& {
    if (next_arg >= positional.size())
      throw TemplateError("not enough arguments for format string");
    return positional[next_arg++];
  };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) throw TemplateError("incomplete format");
    Value keyed;
    bool has_key = false;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) throw TemplateError("incomplete format key");
      if (!by_key) throw TemplateError("format requires a mapping");
      const Value* v = args.dict_obj().find(std::string_view(format).substr(i + 1, close - i - 1));
      if (!v) throw TemplateError("KeyError: '" + format.substr(i + 1, close - i - 1) + "'");
      keyed = *v;
      has_key = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() &&
           std::string_view("-+ 0#").find(format[i]) != std::string_view::npos) {
      flags.push_back(format[i++]);
    }
    int64_t width = 0;
    if (i < format.size() && format[i] == '*') {
      width = checked_int(take(), "* wants int");
      ++i;
    }
    while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) {
      width = width * 10 + (format[i++] - '0');
      if (width > kMaxWidth) throw TemplateError("format width too large");
    }
    int64_t precision = -1;
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = 0;
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) {
        precision = precision * 10 + (format[i++] - '0');
        if (precision > 1000) throw TemplateError("format precision too large");
      }
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) throw TemplateError("incomplete format");
    const char conv = format[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    const Value& v = has_key ? keyed : take();
    const bool left = flags.find('-') != std::string::npos;
    std::string spec = "%" + flags + (width ? std::to_string(width) : "") +
                       (precision >= 0 ? "." + std::to_string(precision) : "");
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? v.to_str() : v.repr();
        if (precision >= 0) s = encode_utf8(decode_utf8(s).substr(0, precision));
        out += pad_to(std::move(s), width, left);
        break;
      }
      case 'd':
      case 'i':
      case 'u':
        out += c_format_int(spec + "lld", as_integer(v, conv));
        break;
      case 'x':
      case 'X':
      case 'o':
        out += c_format_int(spec + "ll" + conv, as_integer(v, conv));
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        out += c_format(spec + conv, as_real(v, conv));
        break;
      case 'c': {
        std::string s;
        if (v.is_string() && count_code_points(v.str()) == 1) {
          s = v.str();
        } else {
          const int64_t c = as_integer(v, conv);
          if (c < 0 || c > 0x10FFFF) throw TemplateError("%c arg not in range(0x110000)");
          append_utf8(&s, static_cast<char32_t>(c));
        }
        out += pad_to(std::move(s), width, left);
        break;
      }
      default:
        throw TemplateError(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (!by_key && next_arg < positional.size()) {
    throw TemplateError("not all arguments converted during string formatting");
  }
  return out;
}

std::string format_value(const Value& v, std::string_view spec) {
  if (spec.empty()) return v.to_str();
  // [[fill]align][sign][#][0][width][,|_][.precision][type]
  size_t i = 0;
  std::string fill = " ";
  char align = '\0';
  const std::u32string u = decode_utf8(spec);
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  size_t skip_bytes = 0;
  if (u.size() >= 2 && is_align(u[1])) {
    fill.clear();
    append_utf8(&fill, u[0]);
    align = static_cast<char>(u[1]);
    skip_bytes = fill.size() + 1;
  } else if (!u.empty() && is_align(u[0])) {
    align = static_cast<char>(u[0]);
    skip_bytes = 1;
  }
  i = skip_bytes;
  char sign = '-';
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  bool alternate = false;
  if (i < spec.size() && spec[i] == '#') alternate = true, ++i;
  if (i < spec.size() && spec[i] == '0') {
    if (!align) fill = "0", align = '=';
    ++i;
  }
  int64_t width = 0;
  while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) {
    width = width * 10 + (spec[i++] - '0');
    if (width > kMaxWidth) throw TemplateError("format width too large");
  }
  char grouping = '\0';
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) grouping = spec[i++];
  int64_t precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    precision = 0;
    while (i < spec.size() && std::isdigit(static_cast<unsigned char>(spec[i]))) {
      precision = precision * 10 + (spec[i++] - '0');
      if (precision > 1000) throw TemplateError("format precision too large");
    }
  }
  char type = '\0';
  if (i < spec.size()) type = spec[i++];
  if (i != spec.size()) throw TemplateError("Invalid format specifier '" + std::string(spec) + "'");

  std::string body;
  std::string sign_str;
  if (v.is_string() || v.is_none() || v.is_undefined() || v.is_list() || v.is_dict()) {
    if (type != '\0' && type != 's') {
      throw TemplateError(std::string("Unknown format code '") + type + "' for object of type '" +
                          v.type_name() + "'");
    }
    body = v.to_str();
    if (precision >= 0) body = encode_utf8(decode_utf8(body).substr(0, precision));
    if (!align) align = '<';
  } else {
    if (!align) align = '>';
    double d = v.as_double();
    const bool integral = !v.is_float();
    char t = type;
    if (t == '\0') t = integral ? 'd' : (precision >= 0 ? 'g' : 'r');
    if (integral && (t == 'd' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c')) {
      int64_t n = v.as_integral();
      const bool neg = n < 0;
      uint64_t mag = neg ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
      if (t == 'b') {
        do {
          body.insert(body.begin(), static_cast<char>('0' + (mag & 1)));
          mag >>= 1;
        } while (mag);
        if (alternate) body = "0b" + body;
      } else if (t == 'c') {
        append_utf8(&body, static_cast<char32_t>(n));
      } else {
        const std::string fmt =
            std::string("%") + (alternate ? "#" : "") + "ll" + (t == 'd' ? 'u' : t);
        body = c_format_int(fmt, static_cast<long long>(mag));
      }
      if (neg) sign_str = "-";
    } else {
      if (t == 'd' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c') {
        throw TemplateError(std::string("Unknown format code '") + t +
                            "' for object of type 'float'");
      }
      const bool neg = std::signbit(d);
      d = std::fabs(d);
      if (t == 'r') {
        body = py_repr_float(d);
      } else if (t == '%') {
        body = c_format("%." + std::to_string(precision < 0 ? 6 : precision) + "f", d * 100) + "%";
      } else {
        const char ct = t == 'n' ? 'g' : t;
        body = c_format("%" + std::string(alternate ? "#" : "") + "." +
                            std::to_string(precision < 0 ? 6 : precision) + ct,
                        d);
      }
      if (neg) sign_str = "-";
    }
    if (sign_str.empty() && sign != '-') sign_str = std::string(1, sign);
    if (grouping) {
      const size_t digits_end = body.find_first_not_of("0123456789");
      const size_t n_int = digits_end == std::string::npos ? body.size() : digits_end;
      std::string grouped;
      for (size_t k = 0; k < n_int; ++k) {
        if (k && (n_int - k) % 3 == 0) grouped.push_back(grouping);
        grouped.push_back(body[k]);
      }
      body = grouped + body.substr(n_int);
    }
  }
  const auto len = static_cast<int64_t>(count_code_points(sign_str + body));
  if (width <= len) return sign_str + body;
  const int64_t total = width - len;
  std::string pad;
  auto repeat = [&](int64_t n) {
    std::string s;
    for (int64_t k = 0; k < n; ++k) s += fill;
    return s;
  };
  switch (align) {
    case '<':
      return sign_str + body + repeat(total);
    case '^':
      return repeat(total / 2) + sign_str + body + repeat(total - total / 2);
    case '=':
      return sign_str + repeat(total) + body;
    default:
      return repeat(total) + sign_str + body;
  }
}

std::string str_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      throw TemplateError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) throw TemplateError("Single '{' encountered in format string");
    std::string_view field(format.data() + i + 1, close - i - 1);
    if (field.find('{') != std::string_view::npos) {
      throw TemplateError("nested replacement fields in str.format are not supported");
    }
    std::string_view spec;
    const size_t colon = field.find(':');
    if (colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    char conversion = '\0';
    const size_t bang = field.find('!');
    if (bang != std::string_view::npos) {
      if (bang + 2 != field.size()) throw TemplateError("expected ':' after conversion specifier");
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    Value v = resolve_field(field, args, &auto_index);
    if (conversion == 'r' || conversion == 'a') {
      v = Value::string(v.repr());
    } else if (conversion == 's') {
      v = Value::string(v.to_str());
    } else if (conversion != '\0') {
      throw TemplateError(std::string("Unknown conversion specifier ") + conversion);
    }
    out += format_value(v, spec);
    i = close;
  }
  return out;
}

}  // namespace dserve::jinja
