// f32_to_f16 and f16_to_f32 (tensor/half.h) against the CPU's own conversion
// instructions (F16C: vcvtps2ph with round-to-nearest-even, vcvtph2ps), which we did
// not write: every half for f16_to_f32, and for f32_to_f16 every float's top 23 bits
// (sign, exponent and the 14 mantissa bits that hold every rounding position, normal
// and subnormal) times low-bit patterns that decide the sticky bit. Plus hand-checked
// values that hold without F16C: ties to even, subnormals, overflow to infinity, NaN.
#include "tensor/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dserve {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(Half, KnownValues) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // the largest half
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // the tie above it goes to infinity (even)
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even one (1); 1 + 3 * 2^-11
  // is halfway between 1 + 2^-10 (odd) and 1 + 2^-9: up.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to zero, just above it rounds up.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 units: to even 2
  EXPECT_EQ(f32_to_f16(-5 * std::ldexp(1.0f, -25)), 0x8002);  // 2.5 units: to even 2
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.0f, -24)), 0x03ff);  // the largest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(f32_to_f16(1e-30f), 0x0000);
  // NaN stays NaN (quiet), keeping its sign.
  const uint16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_EQ(f32_to_f16(from_bits(0xff800001u)) & 0xfe00, 0xfe00);  // signalling, negative
  // Every finite half survives the round trip.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void hw_f32_to_f16(const float* in, uint16_t* out) {
  const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), h);
}

__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

bool have_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}

TEST(Half, F16ToF32MatchesF16cOnEveryHalf) {
  if (!have_f16c()) GTEST_SKIP() << "no F16C on this CPU";
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = hw_f16_to_f32(static_cast<uint16_t>(h));
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << h;
  }
}

TEST(Half, F32ToF16MatchesF16c) {
  if (!have_f16c()) GTEST_SKIP() << "no F16C on this CPU";
  // Low 9 bits: zero, the lowest, the highest, all set, and a scattered pattern (below
  // every rounding position they only make the sticky bit).
  const uint32_t kLow[8] = {0x000, 0x001, 0x100, 0x1ff, 0x0aa, 0x155, 0x080, 0x0ff};
  float in[8];
  uint16_t want[8];
  int64_t checked = 0;
  for (uint32_t top = 0; top < (1u << 23); ++top) {
    for (int i = 0; i < 8; ++i) in[i] = from_bits(top << 9 | kLow[i]);
    hw_f32_to_f16(in, want);
    for (int i = 0; i < 8; ++i) {
      const uint16_t got = f32_to_f16(in[i]);
      if (got != want[i]) {
        FAIL() << "f32 bits 0x" << std::hex << bits_of(in[i]) << ": got 0x" << got
               << ", F16C 0x" << want[i];
      }
    }
    checked += 8;
  }
  EXPECT_EQ(checked, int64_t{1} << 26);
}
#endif

}  // namespace
}  // namespace dserve
