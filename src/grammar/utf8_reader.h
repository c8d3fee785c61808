// Utf8Reader: code points of a UTF-8 string one at a time, for the grammar front ends'
// parsers (regex, GBNF). Invalid bytes read as themselves (0x80..0xFF) so a parser
// can still report a position; valid() says whether the whole text is well formed.
// Decoding and validation are the tokenizer's (tokenizer/utf8.h).
// Thread-safety: a reader is used by one thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/utf8.h"

namespace dserve::grammar {

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
  bool valid() const { return utf8::is_valid(s_); }

 private:
  uint32_t decode(size_t p, size_t* len) const {
    if (p >= s_.size()) {
      *len = 0;
      return 0;
    }
    if (!utf8::scan(s_, p).valid) {
      *len = 1;
      return static_cast<uint8_t>(s_[p]);
    }
    size_t end = p;
    const uint32_t cp = utf8::decode(s_, &end);
    *len = end - p;
    return cp;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace dserve::grammar
