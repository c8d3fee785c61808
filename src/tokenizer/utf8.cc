#include "tokenizer/utf8.h"

namespace dserve::utf8 {

namespace {

bool in(uint8_t b, uint8_t lo, uint8_t hi) { return b >= lo && b <= hi; }

}  // namespace

Scan scan(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return {1, true, false};
  // Expected length and the allowed range of the second byte (Unicode Table 3-7).
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (in(b0, 0xC2, 0xDF)) {
    need = 2;
  } else if (b0 == 0xE0) {
    need = 3, lo = 0xA0;
  } else if (in(b0, 0xE1, 0xEC) || in(b0, 0xEE, 0xEF)) {
    need = 3;
  } else if (b0 == 0xED) {
    need = 3, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 4, lo = 0x90;
  } else if (in(b0, 0xF1, 0xF3)) {
    need = 4;
  } else if (b0 == 0xF4) {
    need = 4, hi = 0x8F;
  } else {
    return {1, false, false};  // a continuation byte or a byte that never appears
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (i + k >= s.size()) return {k, false, true};
    const uint8_t b = byte(i + k);
    const bool ok = k == 1 ? in(b, lo, hi) : in(b, 0x80, 0xBF);
    if (!ok) return {k, false, false};
  }
  return {need, true, false};
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Scan sc = scan(s, i);
    if (!sc.valid) return false;
    i += sc.length;
  }
  return true;
}

std::string repair(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Scan sc = scan(s, i);
    if (sc.valid) {
      out.append(s.substr(i, sc.length));
    } else {
      out.append(kReplacementChar);
    }
    i += sc.length;
  }
  return out;
}

size_t incomplete_tail_length(std::string_view s) {
  // A truncated sequence starts at most 3 bytes before the end, at a lead byte.
  const size_t from = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = from; i < s.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0xC2 || b > 0xF4) continue;
    const Scan sc = scan(s, i);
    if (sc.truncated) return s.size() - i;
  }
  return 0;
}

uint32_t decode(std::string_view s, size_t* i) {
  const auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  const uint32_t b0 = byte(*i);
  if (b0 < 0x80) {
    *i += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    const uint32_t cp = ((b0 & 0x1F) << 6) | (byte(*i + 1) & 0x3F);
    *i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const uint32_t cp = ((b0 & 0x0F) << 12) | ((byte(*i + 1) & 0x3F) << 6) | (byte(*i + 2) & 0x3F);
    *i += 3;
    return cp;
  }
  const uint32_t cp = ((b0 & 0x07) << 18) | ((byte(*i + 1) & 0x3F) << 12) |
                      ((byte(*i + 2) & 0x3F) << 6) | (byte(*i + 3) & 0x3F);
  *i += 4;
  return cp;
}

void append(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace dserve::utf8
