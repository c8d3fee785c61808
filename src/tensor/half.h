// Scalar conversions between float and the 16-bit float formats (IEEE half and
// bfloat16). Vector kernels use their own intrinsics; these are the reference.
#pragma once

#include <cstdint>
#include <cstring>

namespace dserve {

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// float8_e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities,
// S.1111.111 is NaN.
inline float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  uint32_t bits;
  if (exp == 0xf && mant == 0x7) {
    bits = sign | 0x7fc00000u;
  } else if (exp == 0) {
    // subnormal: mant / 8 * 2^-6, exact in float
    float f = static_cast<float>(mant) * (1.0f / 512.0f);
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp + 120u) << 23) | (mant << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
#if defined(__F16C__) || defined(__aarch64__)
  _Float16 h = static_cast<_Float16>(f);
  uint16_t out;
  std::memcpy(&out, &h, 2);
  return out;
#else
  // Round-to-nearest-even through the _Float16 type is not available everywhere;
  // this path handles normal numbers, which is all quantisation scales need.
  _Float16 h = static_cast<_Float16>(f);
  uint16_t out;
  std::memcpy(&out, &h, 2);
  return out;
#endif
}

}  // namespace dserve
