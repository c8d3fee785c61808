// GPT-2's byte-level alphabet: every byte 0-255 is spelled as one printable code point
// (printable Latin-1 bytes as themselves, the rest as U+0100 onwards), so that a
// vocabulary of byte strings can be stored as text. tokenizer.json vocabularies and
// GGUF `tokenizer.ggml.tokens` of "gpt2" tokenizers are written in this alphabet.
//
// Thread-safety: pure functions over constant tables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dserve::byte_level {

// The code point that spells `byte`.
uint32_t code_point_of(uint8_t byte);

// The bytes a token spelled in the byte-level alphabet stands for; nullopt if some
// character of `token` is outside the alphabet (added tokens such as "<｜User｜>").
std::optional<std::string> to_bytes(std::string_view token);

// Spells raw bytes in the alphabet.
std::string from_bytes(std::string_view bytes);

// What HF's ByteLevel decoder makes of one token: its bytes if it is spelled in the
// alphabet, else its own UTF-8 text.
std::string decode_token(std::string_view token);

}  // namespace dserve::byte_level
