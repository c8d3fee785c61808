#include "sampling/fast_exp.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/check.h"

// Built with -fno-trapping-math and -ffp-contract=off (an FMA in one instruction set
// and not in another would change the bits; see fast_exp.h). The loop has no
// conditional expressions (std::max, and a 0/1 factor for the masked ids): GCC kept
// those as branches in the AVX-512 copy and did not vectorise it.
namespace dserve {
namespace {

// The whole computation, inlined into each instruction set's copy below.
[[gnu::always_inline]] inline void exp_weights_loop(const float* __restrict x, size_t n,
                                                    float max, float inv_t,
                                                    float* __restrict w) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;       // ln 2 with its low mantissa bits zero
  constexpr float kLn2Lo = 1.42860682030941723e-6f;  // ln 2 - kLn2Hi
  constexpr float kMinY = -87.0f;                    // 2^k stays a normal float
  for (size_t i = 0; i < n; ++i) {
    const float y0 = (x[i] - max) * inv_t;
    const float y = std::max(y0, kMinY);
    const int32_t k = static_cast<int32_t>(y * kLog2e - 0.5f);  // round to nearest, y <= 0
    const float kf = static_cast<float>(k);
    const float r = (y - kf * kLn2Hi) - kf * kLn2Lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (k + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    w[i] = p * scale * static_cast<float>(y0 > kMinY);  // exactly 0 below kMinY
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
[[gnu::target("avx512f,prefer-vector-width=512")]] void exp_weights_avx512(
    const float* x, size_t n, float max, float inv_t, float* w) {
  exp_weights_loop(x, n, max, inv_t, w);
}

bool have_avx512f() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have;
}
#endif

}  // namespace

void exp_weights_baseline(std::span<const float> in, float max, float inv_t,
                          std::span<float> out) {
  DS_CHECK(in.size() == out.size());
  exp_weights_loop(in.data(), in.size(), max, inv_t, out.data());
}

bool exp_weights_widest(std::span<const float> in, float max, float inv_t,
                        std::span<float> out) {
  DS_CHECK(in.size() == out.size());
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_avx512f()) {
    exp_weights_avx512(in.data(), in.size(), max, inv_t, out.data());
    return true;
  }
#endif
  return false;
}

void exp_weights(std::span<const float> in, float max, float inv_t, std::span<float> out) {
  if (!exp_weights_widest(in, max, inv_t, out)) exp_weights_baseline(in, max, inv_t, out);
}

}  // namespace dserve
