// GGUF / ggml quantisation block layouts, byte for byte as they sit in a .gguf file.
// A row of a quantised tensor is a plain array of these blocks. Scales stored as
// IEEE half are kept as raw uint16_t bits (convert with f16_to_f32 from half.h).
//
// These structs are the one definition of the layouts in dserve: the reference
// dequantiser (dequantize.cc) and the CPU/GPU kernels both read them.
//
// Thread-safety: plain data.
#pragma once

#include <cstdint>

namespace dserve {

inline constexpr int kQK4 = 32;   // elements per Q4_0 / Q4_1 block
inline constexpr int kQK8 = 32;   // elements per Q8_0 block
inline constexpr int kQKK = 256;  // elements per K-quant super-block
inline constexpr int kKScaleSize = 12;  // packed 6-bit scales + mins of Q4_K / Q5_K

#pragma pack(push, 1)

// y[i] = d * qs[i]
struct block_q8_0 {
  uint16_t d;            // f16 scale
  int8_t qs[kQK8];
};
static_assert(sizeof(block_q8_0) == 34);

// y[j] = d * ((qs[j] & 0xF) - 8), y[j + 16] = d * ((qs[j] >> 4) - 8), j < 16
struct block_q4_0 {
  uint16_t d;            // f16 scale
  uint8_t qs[kQK4 / 2];  // nibbles
};
static_assert(sizeof(block_q4_0) == 18);

// y[j] = d * (qs[j] & 0xF) + m, y[j + 16] = d * (qs[j] >> 4) + m, j < 16
struct block_q4_1 {
  uint16_t d;            // f16 scale
  uint16_t m;            // f16 minimum
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(block_q4_1) == 20);

// y[j] = d * (((qs[j] & 0xF) | b4(j)) - 16), y[j + 16] = d * (((qs[j] >> 4) | b4(j + 16)) - 16),
// j < 16, where b4(i) = ((qh >> i) & 1) << 4 and qh is the little-endian uint32 in `qh`.
struct block_q5_0 {
  uint16_t d;            // f16 scale
  uint8_t qh[4];         // fifth bits
  uint8_t qs[kQK4 / 2];  // low nibbles
};
static_assert(sizeof(block_q5_0) == 22);

// As Q5_0 without the offset, plus a minimum: y = d * q + m.
struct block_q5_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 minimum
  uint8_t qh[4];
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(block_q5_1) == 24);

// Super-block of 8 sub-blocks of 32. Sub-block s has scale d * sc[s] and minimum
// dmin * mn[s], with sc/mn 6-bit values packed in `scales` (see q_k_scale_min()).
// Elements 64*g + l (l < 32) are the low nibbles of qs[32*g + l]; 64*g + 32 + l the
// high nibbles. y = d * sc * q - dmin * mn.
struct block_q4_K {
  uint16_t d;     // f16 super-block scale for the scales
  uint16_t dmin;  // f16 super-block scale for the mins
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(block_q4_K) == 144);

// As Q4_K, plus a fifth bit: bit (2*g) of qh[l] is the high bit of element 64*g + l,
// bit (2*g + 1) that of element 64*g + 32 + l.
struct block_q5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(block_q5_K) == 176);

// Super-block of 16 sub-blocks of 16 with int8 scales; 6-bit values (low 4 bits in
// ql, high 2 bits in qh) offset by -32. y = d * scales[s] * (q - 32).
struct block_q6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;  // f16 super-block scale
};
static_assert(sizeof(block_q6_K) == 210);

#pragma pack(pop)

// Unpacks the 6-bit scale and minimum of sub-block j (0..7) of a Q4_K/Q5_K block.
// Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; sub-blocks 4-7
// keep their low 4 bits in bytes 8-11 and their top 2 bits in the spare top bits of
// bytes 0-7.
inline void q_k_scale_min(int j, const uint8_t* scales, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *mn = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

}  // namespace dserve
