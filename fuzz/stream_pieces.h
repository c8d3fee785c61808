// What the model-output fuzz targets share: cutting a text into the pieces an
// IncrementalDecoder would hand over (whole UTF-8 characters, lengths varying), and a
// UTF-8 check, since the server must never cut a character in two.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dserve::fuzz {

inline bool is_valid_utf8(std::string_view s) {
  try {
    (void)nlohmann::json(std::string(s)).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

// `text` (valid UTF-8) in pieces of 1, 2, 3, 5, 8, 13 bytes in turn, each extended to
// the end of the character it cuts into.
inline std::vector<std::string_view> decoder_pieces(std::string_view text) {
  static constexpr size_t kLengths[] = {1, 2, 3, 5, 8, 13};
  std::vector<std::string_view> pieces;
  size_t pos = 0;
  for (size_t i = 0; pos < text.size(); ++i) {
    size_t end = std::min(text.size(), pos + kLengths[i % std::size(kLengths)]);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

}  // namespace dserve::fuzz
