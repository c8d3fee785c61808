#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace dserve::byte_level {

namespace {

struct Tables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};  // code points used are < 256 + 68

  Tables() {
    cp_to_byte.fill(-1);
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      byte_to_cp[b] = cp;
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t code_point_of(uint8_t byte) { return tables().byte_to_cp[byte]; }

std::optional<std::string> to_bytes(std::string_view token) {
  const Tables& t = tables();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const utf8::Scan sc = utf8::scan(token, i);
    if (!sc.valid) return std::nullopt;
    const uint32_t cp = utf8::decode(token, &i);
    if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(t.cp_to_byte[cp]));
  }
  return out;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append(&out, code_point_of(static_cast<uint8_t>(c)));
  return out;
}

std::string decode_token(std::string_view token) {
  std::optional<std::string> bytes = to_bytes(token);
  return bytes ? std::move(*bytes) : std::string(token);
}

}  // namespace dserve::byte_level
