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

// float -> float8_e4m3fn, rounding to nearest even and saturating at +-448 (the FP8 KV
// cache, as vLLM's saturating conversion); NaN stays NaN.
inline uint8_t f32_to_fp8_e4m3(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7f;  // NaN
  if (abs >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and infinity): the largest finite
  if (abs < 0x3c800000u) {
    // Below 2^-6: subnormal steps of 2^-9; round |f| * 512 to the nearest even integer.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 512.0f;  // exact: a power of two
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return sign | static_cast<uint8_t>(m);  // m == 8 is the smallest normal, 0.0001.000
  }
  // Normal: keep 3 mantissa bits of the float's 23, rounding to nearest even.
  uint32_t r = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t exp = (r >> 23) - 120u;  // rebias 127 -> 7
  const uint32_t mant = (r >> 20) & 0x7u;
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7e;  // rounded past 448
  return sign | static_cast<uint8_t>((exp << 3) | mant);
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
  } else if (exp == 31) {  // infinity, or NaN made quiet (as vcvtph2ps does)
    bits = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// IEEE binary16 from float, rounding to nearest with ties to even, in plain integer
// arithmetic so that every build (any compiler, any CPU) gives the same bits as F16C's
// vcvtps2ph and numpy's astype(float16): subnormal halves are produced (not flushed),
// magnitudes from 65520 up become infinity, and a NaN stays NaN with its sign and the
// top ten payload bits, quietened.
inline uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) {  // NaN
    return static_cast<uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
  }
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (mag >= 0x38800000u) {
    // Normal half (>= 2^-14): rebias the exponent (127 -> 15), keep 10 mantissa bits,
    // round on the 13 dropped ones. A carry out of the mantissa bumps the exponent,
    // which is the right result (below 65520 it never reaches infinity).
    uint32_t h = (mag - 0x38000000u) >> 13;
    const uint32_t rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (mag <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 is a tie to 0)
  // Subnormal half: the value in units of 2^-24 is m >> shift, m the 24-bit mantissa
  // with its leading one. A result of 0x400 is the smallest normal, correctly encoded.
  const uint32_t m = (mag & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - (mag >> 23);  // 14..24 for exponents 2^-25..2^-15
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace dserve
