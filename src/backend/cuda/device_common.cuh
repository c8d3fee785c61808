// Device helpers shared by the CUDA backend's kernels: element conversions (the same
// rounding as tensor/half.h; also callable on the host, for the host-side checks of
// kernels.h), warp and block reductions, launch geometry.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dserve::cuda {

inline constexpr int kWarp = 32;

__host__ __device__ inline float half_bits_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__host__ __device__ inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
__host__ __device__ inline float fp8_e4m3_to_float(uint8_t v) {
  __nv_fp8_e4m3 f;
  f.__x = v;
  return static_cast<float>(f);
}
// Round to nearest even, saturating at ±448; NaN stays NaN.
__host__ __device__ inline uint8_t float_to_fp8_e4m3(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

__host__ __device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ inline float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum (or max) over the block of every thread's v, returned to every thread.
// scratch: kWarp floats of shared memory; blockDim.x a multiple of kWarp.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n_warps = blockDim.x / kWarp;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < n_warps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(r) : warp_sum(r);
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace dserve::cuda
