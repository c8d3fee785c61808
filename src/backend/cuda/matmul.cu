// Matmuls and embedding rows on the GPU: every weight dtype decoded in 32-element
// units (a Q8_0 / Q4_0 / Q4_1 block, a 32-element part of a K-quant super-block, 32
// plain or FP8 values) into FP32, one warp per output row, each lane a unit at a time.
// kI8 (W8A8) weights multiply int8 activations quantised per token (or with the
// checkpoint's static scale) in int32, as the CPU backend does.
#include "backend/cuda/decode.cuh"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace dserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kTokenTile = 8;

// One warp per row r, the tokens [t0, t0 + n_t) of x: y[t, r] = x[t] · w[r] (+ bias).
template <DType T>
__global__ void matmul_kernel(DeviceMatrix w, const float* bias, const float* x,
                              int64_t n_tokens, float* y) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t t0 = int64_t{blockIdx.y} * kTokenTile;
  if (r >= w.n_rows) return;
  const int n_t = static_cast<int>(min64(kTokenTile, n_tokens - t0));
  float acc[kTokenTile] = {};
  float v[kUnit];
  const int64_t n_units = (w.n_cols + kUnit - 1) / kUnit;
  for (int64_t u = lane; u < n_units; u += kWarp) {
    const int n = decode_unit<T>(w, r, u, v);
    for (int t = 0; t < kTokenTile; ++t) {
      if (t >= n_t) break;
      const float* xt = x + (t0 + t) * w.n_cols + u * kUnit;
      float a = 0.0f;
      for (int i = 0; i < n; ++i) a = fmaf(v[i], xt[i], a);
      acc[t] += a;
    }
  }
  for (int t = 0; t < n_t; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[(t0 + t) * w.n_rows + r] = s + (bias != nullptr ? bias[r] : 0.0f);
  }
}

// Per-token int8 activations, as the CPU backend's quantize_q8_token: scale
// max|x| / 127 (or the static scale), q = clamp(round(x / scale) + offset).
__global__ void quantize_tokens_kernel(const float* x, int64_t k, float static_scale,
                                       int offset, int8_t* q, float* scale) {
  __shared__ float scratch[kWarp];
  const float* xt = x + int64_t{blockIdx.x} * k;
  float d = static_scale, lo = -127.0f;
  if (static_scale == 0.0f) {
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(xt[i]));
    d = block_reduce<true>(amax, scratch) / 127.0f;
    lo = -128.0f;
  }
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int8_t* qt = q + int64_t{blockIdx.x} * k;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    qt[i] = static_cast<int8_t>(fminf(fmaxf(rintf(xt[i] * id) + static_cast<float>(offset), lo), 127.0f));
  }
  if (threadIdx.x == 0) scale[blockIdx.x] = d;
}

__global__ void matmul_i8_kernel(DeviceMatrix w, const float* bias, const int8_t* q,
                                 const float* q_scale, int64_t n_tokens, float* y) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t t0 = int64_t{blockIdx.y} * kTokenTile;
  if (r >= w.n_rows) return;
  const int n_t = static_cast<int>(min64(kTokenTile, n_tokens - t0));
  int acc[kTokenTile] = {};
  const int8_t* wr = reinterpret_cast<const int8_t*>(w.data + r * w.row_bytes);
  for (int64_t j = lane; j < w.n_cols; j += kWarp) {
    const int wj = wr[j];
    for (int t = 0; t < kTokenTile; ++t) {
      if (t >= n_t) break;
      acc[t] += wj * q[(t0 + t) * w.n_cols + j];
    }
  }
  for (int t = 0; t < n_t; ++t) {
    float s = 0.0f;
    int total = acc[t];
    for (int o = kWarp / 2; o > 0; o /= 2) total += __shfl_xor_sync(0xffffffffu, total, o);
    s = static_cast<float>(total) * (w.row_scales[r] * q_scale[t0 + t]);
    if (w.row_bias != nullptr) s += w.row_bias[r];
    if (lane == 0) y[(t0 + t) * w.n_rows + r] = s + (bias != nullptr ? bias[r] : 0.0f);
  }
}

template <DType T>
__global__ void get_rows_kernel(DeviceMatrix table, const int32_t* ids, int64_t first_id,
                                float* out) {
  const int64_t i = blockIdx.x;
  const int64_t id = int64_t{ids[i]} - first_id;
  float* dst = out + i * table.n_cols;
  const int64_t n_units = (table.n_cols + kUnit - 1) / kUnit;
  float v[kUnit];
  for (int64_t u = threadIdx.x; u < n_units; u += blockDim.x) {
    if (id < 0 || id >= table.n_rows) {
      for (int64_t j = u * kUnit; j < min64(table.n_cols, (u + 1) * kUnit); ++j) dst[j] = 0.0f;
      continue;
    }
    const int n = decode_unit<T>(table, id, u, v);
    for (int j = 0; j < n; ++j) dst[u * kUnit + j] = v[j];
  }
}

}  // namespace

bool matmul_dtype_supported(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kI8:
    case DType::kF8_E4M3:
      return true;
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kI32:
    case DType::kI64:
      return false;
  }
  return false;
}

void matmul(const DeviceMatrix& w, const float* bias, const float* x, int64_t n_tokens, float* y,
            int8_t* act_q, float* act_scale, cudaStream_t stream) {
  if (n_tokens == 0 || w.n_rows == 0) return;
  const dim3 grid(blocks_for(w.n_rows, kWarpsPerBlock), blocks_for(n_tokens, kTokenTile));
  const int threads = kWarpsPerBlock * kWarp;
  if (w.dtype == DType::kI8) {
    quantize_tokens_kernel<<<static_cast<unsigned>(n_tokens), 256, 0, stream>>>(
        x, w.n_cols, w.input_scale, w.input_offset, act_q, act_scale);
    matmul_i8_kernel<<<grid, threads, 0, stream>>>(w, bias, act_q, act_scale, n_tokens, y);
    return;
  }
  dispatch_dtype(w.dtype, [&]<DType T>() {
    matmul_kernel<T><<<grid, threads, 0, stream>>>(w, bias, x, n_tokens, y);
  });
}

void decode_rows_on_host(const DeviceMatrix& w, int64_t first_row, int64_t n_rows, float* out) {
  dispatch_dtype(w.dtype, [&]<DType T>() {
    const int64_t n_units = (w.n_cols + kUnit - 1) / kUnit;
    float v[kUnit];
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t u = 0; u < n_units; ++u) {
        const int n = decode_unit<T>(w, first_row + r, u, v);
        for (int i = 0; i < n; ++i) out[r * w.n_cols + u * kUnit + i] = v[i];
      }
    }
  });
}

void get_rows(const DeviceMatrix& table, const int32_t* ids, int64_t n_ids, int64_t first_id,
              float* out, cudaStream_t stream) {
  if (n_ids == 0) return;
  dispatch_dtype(table.dtype, [&]<DType T>() {
    get_rows_kernel<T><<<static_cast<unsigned>(n_ids), 128, 0, stream>>>(table, ids, first_id, out);
  });
}

}  // namespace dserve::cuda
