#include "sampling/fast_exp.h"

#include <cstdint>
#include <cstring>

#include "base/check.h"

// Built with -fno-trapping-math (see CMakeLists.txt): without it GCC keeps the
// selects below as branches and does not vectorise the loop.
namespace dserve {

void exp_weights(std::span<const float> in, float max, float inv_t, std::span<float> out) {
  DS_CHECK(in.size() == out.size());
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;       // ln 2 with its low mantissa bits zero
  constexpr float kLn2Lo = 1.42860682030941723e-6f;  // ln 2 - kLn2Hi
  constexpr float kMinY = -87.0f;                    // 2^k stays a normal float
  const float* __restrict x = in.data();
  float* __restrict w = out.data();
  const size_t n = in.size();
  for (size_t i = 0; i < n; ++i) {
    const float y0 = (x[i] - max) * inv_t;
    const float y = y0 > kMinY ? y0 : kMinY;
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
    w[i] = y0 > kMinY ? p * scale : 0.0f;
  }
}

}  // namespace dserve
