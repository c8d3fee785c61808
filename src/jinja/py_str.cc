#include "jinja/py_str.h"

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace dserve::jinja {
namespace {

constexpr char32_t kEscapeBase = 0xDC00;  // invalid byte b decodes to kEscapeBase + b

// Decodes one code point at s[*i] (advancing *i); invalid bytes become escapes.
char32_t decode_one(std::string_view s, size_t* i) {
  const auto b0 = static_cast<unsigned char>(s[*i]);
  if (b0 < 0x80) {
    ++*i;
    return b0;
  }
  int n = 0;
  char32_t c = 0;
  char32_t min = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 1, c = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 2, c = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 3, c = b0 & 0x07, min = 0x10000;
  } else {
    ++*i;
    return kEscapeBase + b0;
  }
  if (*i + n >= s.size()) {
    ++*i;
    return kEscapeBase + b0;
  }
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[*i + k]);
    if ((b & 0xC0) != 0x80) {
      ++*i;
      return kEscapeBase + b0;
    }
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
    ++*i;
    return kEscapeBase + b0;
  }
  *i += n + 1;
  return c;
}

bool is_byte_escape(char32_t c) { return c >= kEscapeBase + 0x80 && c <= kEscapeBase + 0xFF; }

// Case-maps one code point with ICU's full mapping (one character may become several).
template <typename Fn>
void map_code_point(char32_t c, Fn fn, std::u32string* out) {
  if (is_byte_escape(c)) {
    out->push_back(c);
    return;
  }
  icu::UnicodeString u(static_cast<UChar32>(c));
  fn(u);
  for (int32_t k = 0; k < u.length(); k = u.moveIndex32(k, 1)) out->push_back(u.char32At(k));
}

void to_upper(icu::UnicodeString& u) { u.toUpper(icu::Locale::getRoot()); }
void to_lower(icu::UnicodeString& u) { u.toLower(icu::Locale::getRoot()); }

char32_t to_title_simple(char32_t c) {
  return is_byte_escape(c) ? c : static_cast<char32_t>(u_totitle(static_cast<UChar32>(c)));
}

bool is_cased(char32_t c) {
  return !is_byte_escape(c) && u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED);
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  if (is_byte_escape(c)) return false;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR:
      return false;
    default:
      return true;
  }
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

}  // namespace

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(decode_one(s, &i));
  return out;
}

void append_utf8(std::string* out, char32_t c) {
  if (is_byte_escape(c)) {
    out->push_back(static_cast<char>(c - kEscapeBase));
  } else if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(&out, c);
  return out;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) decode_one(s, &i);
  return n;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool py_isword(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  if (is_byte_escape(c)) return false;
  return u_isalnum(static_cast<UChar32>(c)) || u_hasBinaryProperty(c, UCHAR_ALPHABETIC);
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  const std::u32string u = decode_utf8(s);
  const std::u32string set = chars ? decode_utf8(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : py_isspace(c);
  };
  size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return encode_utf8(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::u32string u = decode_utf8(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(encode_utf8(std::u32string_view(u).substr(i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    out.push_back(encode_utf8(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::u32string u = decode_utf8(s);
  size_t i = u.size();
  while (true) {
    while (i > 0 && py_isspace(u[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(encode_utf8(std::u32string_view(u).substr(0, i)));
      break;
    }
    size_t j = i;
    while (j > 0 && !py_isspace(u[j - 1])) --j;
    out.push_back(encode_utf8(std::u32string_view(u).substr(j, i - j)));
    i = j;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  const std::u32string u = decode_utf8(s);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!is_line_break(u[i])) continue;
    size_t eol = i + 1;
    if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') eol = i + 2;
    const size_t end = keepends ? eol : i;
    out.push_back(encode_utf8(std::u32string_view(u).substr(start, end - start)));
    start = eol;
    i = eol - 1;
  }
  if (start < u.size()) out.push_back(encode_utf8(std::u32string_view(u).substr(start)));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                       int64_t count) {
  std::string out;
  if (old_sub.empty()) {
    // Python inserts `new` before every code point and at the end.
    const std::u32string u = decode_utf8(s);
    int64_t done = 0;
    for (char32_t c : u) {
      if (count < 0 || done < count) {
        out += new_sub;
        ++done;
      }
      append_utf8(&out, c);
    }
    if (count < 0 || done < count) out += new_sub;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old_sub, pos);
    if (hit == std::string_view::npos) break;
    out += s.substr(pos, hit - pos);
    out += new_sub;
    pos = hit + old_sub.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

int64_t py_find(std::string_view s, std::string_view sub, bool reverse) {
  const size_t hit = reverse ? s.rfind(sub) : s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<int64_t>(count_code_points(s.substr(0, hit)));
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(count_code_points(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size()))
    ++n;
  return n;
}

std::string py_upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode_utf8(s)) map_code_point(c, to_upper, &out);
  return encode_utf8(out);
}

std::string py_lower(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode_utf8(s)) map_code_point(c, to_lower, &out);
  return encode_utf8(out);
}

std::string py_capitalize(std::string_view s) {
  const std::u32string u = decode_utf8(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0) {
      out.push_back(to_title_simple(u[0]));
    } else {
      map_code_point(u[i], to_lower, &out);
    }
  }
  return encode_utf8(out);
}

std::string py_title(std::string_view s) {
  std::u32string out;
  bool previous_is_cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (previous_is_cased) {
      map_code_point(c, to_lower, &out);
    } else {
      out.push_back(to_title_simple(c));
    }
    previous_is_cased = is_cased(c);
  }
  return encode_utf8(out);
}

bool py_is_cased(std::string_view s, bool upper) {
  bool any_cased = false;
  for (char32_t c : decode_utf8(s)) {
    if (is_byte_escape(c)) continue;
    const auto uc = static_cast<UChar32>(c);
    if (upper ? u_islower(uc) || u_istitle(uc) : u_isupper(uc) || u_istitle(uc)) return false;
    if (upper ? u_isupper(uc) : u_islower(uc)) any_cased = true;
  }
  return any_cased;
}

std::string py_repr_string(std::string_view s) {
  const std::u32string u = decode_utf8(s);
  const bool has_single = u.find(U'\'') != std::u32string::npos;
  const bool has_double = u.find(U'"') != std::u32string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : u) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x7F || py_isprintable(c)) {
      append_utf8(&out, c);
    } else if (c <= 0xFF) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c <= 0xFFFF) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

std::string py_repr_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits: "d.ddde+XX" (or "de+XX").
  const auto res =
      std::to_chars(buf, buf + sizeof buf, std::fabs(x), std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp10 = std::stoi(sci.substr(e_pos + 1));
  const int decpt = exp10 + 1;  // position of the decimal point in `digits`
  const int n = static_cast<int>(digits.size());
  std::string out = std::signbit(x) ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(decpt - n, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    std::snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += buf;
  }
  return out;
}

std::vector<int64_t> py_slice_indices(int64_t length, std::optional<int64_t> start,
                                      std::optional<int64_t> stop, std::optional<int64_t> step) {
  const int64_t st = step.value_or(1);
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) {
      i += length;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= length) {
      i = st < 0 ? length - 1 : length;
    }
    return i;
  };
  const int64_t b = adjust(start, st < 0 ? length - 1 : 0);
  const int64_t e = adjust(stop, st < 0 ? -1 : length);
  std::vector<int64_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(i);
  return out;
}

}  // namespace dserve::jinja
