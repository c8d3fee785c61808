// Utf8Reader: code points of a UTF-8 string one at a time, for the grammar front ends'
// parsers (regex, GBNF). Invalid bytes read as themselves (0x80..0xFF) so a parser
// can still report a position; valid() says whether the whole text is well formed.
// Thread-safety: a reader is used by one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dserve::grammar {

inline void append_utf8(uint32_t cp, std::string* out) {
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

class Utf8Reader {
 public:
  explicit Utf8Reader(std::string_view s) : s_(s) {}

  bool done() const { return pos_ >= s_.size(); }
  size_t offset() const { return pos_; }
  void seek(size_t offset) { pos_ = offset; }
  // The next code point (0 at the end) without consuming it.
  uint32_t peek() const {
    size_t len = 0;
    return decode(pos_, &len);
  }
  uint32_t next() {
    size_t len = 0;
    const uint32_t cp = decode(pos_, &len);
    pos_ += len;
    return cp;
  }
  bool valid() const {
    for (size_t p = 0; p < s_.size();) {
      size_t len = 0;
      bool ok = true;
      decode(p, &len, &ok);
      if (!ok) return false;
      p += len;
    }
    return true;
  }

 private:
  uint32_t decode(size_t p, size_t* len, bool* ok = nullptr) const {
    if (p >= s_.size()) {
      *len = 0;
      return 0;
    }
    const auto b0 = static_cast<uint8_t>(s_[p]);
    int n = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || p + n > s_.size()) {
      *len = 1;
      if (ok && b0 >= 0x80) *ok = false;
      return b0;
    }
    uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < n; ++i) {
      const auto b = static_cast<uint8_t>(s_[p + i]);
      if ((b & 0xC0) != 0x80) {
        *len = 1;
        if (ok) *ok = false;
        return b0;
      }
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      if (ok) *ok = false;
    }
    *len = static_cast<size_t>(n);
    return cp;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace dserve::grammar
