// UTF-8 helpers for the tokenizer: validation, lossy repair and the incomplete-tail
// test the incremental decoder needs.
//
// Invalid input is repaired the way Rust's String::from_utf8_lossy (and so Hugging Face
// `tokenizers`) does it: each maximal subpart of an ill-formed sequence (Unicode 15,
// section 3.9, "U+FFFD substitution of maximal subparts") becomes one U+FFFD.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dserve::utf8 {

// What starts at s[i]: `length` bytes that are one valid character (valid = true), or
// a maximal ill-formed subpart (valid = false). `truncated` is true when the subpart is
// a valid prefix cut short by the end of `s` (more bytes could complete it).
struct Scan {
  size_t length = 0;
  bool valid = false;
  bool truncated = false;
};
Scan scan(std::string_view s, size_t i);

bool is_valid(std::string_view s);

// `s` with every maximal ill-formed subpart replaced by U+FFFD.
std::string repair(std::string_view s);

// How many trailing bytes of `s` form a valid but incomplete sequence (0 to 3): the
// bytes an incremental decoder must hold back until the character completes.
size_t incomplete_tail_length(std::string_view s);

// Decodes the (valid) character at s[*i] and advances *i past it.
uint32_t decode(std::string_view s, size_t* i);
void append(std::string* out, uint32_t code_point);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace dserve::utf8
