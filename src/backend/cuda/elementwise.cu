// Element-wise and row-moving kernels: RMSNorm, SiLU-mul, add, RoPE, strided copies,
// row gathers and the KV pool's stores and reads.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace dserve::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t n, float* out) {
  __shared__ float scratch[kWarp];
  const float* xt = x + int64_t{blockIdx.x} * n;
  float* ot = out + int64_t{blockIdx.x} * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xt[i], xt[i], ss);
  ss = block_reduce<false>(ss, scratch);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ot[i] = xt[i] * r * w[i];
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  out[i] = g / (1.0f + expf(-g)) * up[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// One thread per (token, head, rotated pair).
__global__ void rope_kernel(float* x, int64_t n_tokens, int n_heads, int head_dim,
                            const int32_t* positions, int half, int64_t n_positions,
                            const float* cos, const float* sin, bool interleaved) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t per_token = int64_t{n_heads} * half;
  if (idx >= n_tokens * per_token) return;
  const int64_t t = idx / per_token;
  const int h = static_cast<int>(idx % per_token / half), i = static_cast<int>(idx % half);
  const int64_t p = positions[t];
  if (p < 0 || p >= n_positions) return;  // the CPU backend refuses such positions
  const float c = cos[p * half + i], s = sin[p * half + i];
  float* v = x + (t * n_heads + h) * head_dim;
  const int a_at = interleaved ? 2 * i : i, b_at = interleaved ? 2 * i + 1 : i + half;
  const float a = v[a_at], b = v[b_at];
  v[a_at] = a * c - b * s;
  v[b_at] = a * s + b * c;
}

__global__ void copy_strided_kernel(float* dst, const float* src, int64_t n1, int64_t len,
                                    int64_t ds0, int64_t ds1, int64_t ss0, int64_t ss1) {
  const int64_t run = blockIdx.x;  // i * n1 + j
  const int64_t i = run / n1, j = run % n1;
  float* d = dst + i * ds0 + j * ds1;
  const float* s = src + i * ss0 + j * ss1;
  for (int64_t x = threadIdx.x; x < len; x += blockDim.x) d[x] = s[x];
}

__global__ void gather_rows_kernel(const float* x, int64_t len, const int32_t* rows, float* out) {
  const float* s = x + int64_t{rows[blockIdx.x]} * len;
  float* d = out + int64_t{blockIdx.x} * len;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) d[i] = s[i];
}

template <DType T>
__global__ void kv_store_kernel(void* pool, int64_t row, const float* x, const int64_t* slots) {
  const int64_t slot = slots[blockIdx.x];
  if (slot < 0) return;  // the CPU backend refuses negative slots
  const float* src = x + int64_t{blockIdx.x} * row;
  for (int64_t e = threadIdx.x; e < row; e += blockDim.x) {
    if constexpr (T == DType::kF32) {
      static_cast<float*>(pool)[slot * row + e] = src[e];
    } else if constexpr (T == DType::kF16) {
      static_cast<__half*>(pool)[slot * row + e] = __float2half_rn(src[e]);
    } else {
      static_cast<uint8_t*>(pool)[slot * row + e] = float_to_fp8_e4m3(src[e]);
    }
  }
}

template <DType T>
__global__ void kv_gather_kernel(const void* pool, int64_t row, const int64_t* slots, float* out) {
  const int64_t slot = slots[blockIdx.x];
  float* dst = out + int64_t{blockIdx.x} * row;
  for (int64_t e = threadIdx.x; e < row; e += blockDim.x) {
    if (slot < 0) {
      dst[e] = 0.0f;
    } else if constexpr (T == DType::kF32) {
      dst[e] = static_cast<const float*>(pool)[slot * row + e];
    } else if constexpr (T == DType::kF16) {
      dst[e] = __half2float(static_cast<const __half*>(pool)[slot * row + e]);
    } else {
      dst[e] = fp8_e4m3_to_float(static_cast<const uint8_t*>(pool)[slot * row + e]);
    }
  }
}

}  // namespace

void rms_norm(const float* x, const float* weight, float eps, int64_t n_tokens, int64_t n,
              float* out, cudaStream_t stream) {
  if (n_tokens == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(n_tokens), kThreads, 0, stream>>>(x, weight, eps, n, out);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  silu_mul_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(gate, up, n, out);
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
}

void rope(float* x, int64_t n_tokens, int n_heads, int head_dim, const int32_t* positions,
          int rotary_dim, int64_t n_positions, const float* cos, const float* sin,
          bool pairs_interleaved, cudaStream_t stream) {
  const int half = rotary_dim / 2;
  const int64_t n = n_tokens * n_heads * half;
  if (n == 0) return;
  rope_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      x, n_tokens, n_heads, head_dim, positions, half, n_positions, cos, sin, pairs_interleaved);
}

void copy_strided(float* dst, const float* src, int64_t n0, int64_t n1, int64_t len,
                  int64_t dst_stride0, int64_t dst_stride1, int64_t src_stride0,
                  int64_t src_stride1, cudaStream_t stream) {
  if (n0 * n1 == 0 || len == 0) return;
  copy_strided_kernel<<<static_cast<unsigned>(n0 * n1), 128, 0, stream>>>(
      dst, src, n1, len, dst_stride0, dst_stride1, src_stride0, src_stride1);
}

void gather_rows(const float* x, int64_t row_length, const int32_t* rows, int64_t n, float* out,
                 cudaStream_t stream) {
  if (n == 0 || row_length == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(x, row_length, rows, out);
}

void kv_store(DType kv_dtype, void* pool, int64_t row, const float* x, const int64_t* slots,
              int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(n);
  if (kv_dtype == DType::kF32) {
    kv_store_kernel<DType::kF32><<<blocks, 128, 0, stream>>>(pool, row, x, slots);
  } else if (kv_dtype == DType::kF16) {
    kv_store_kernel<DType::kF16><<<blocks, 128, 0, stream>>>(pool, row, x, slots);
  } else {
    kv_store_kernel<DType::kF8_E4M3><<<blocks, 128, 0, stream>>>(pool, row, x, slots);
  }
}

void kv_convert_on_host(DType kv_dtype, const float* x, int64_t n, void* bits, float* back) {
  for (int64_t i = 0; i < n; ++i) {
    if (kv_dtype == DType::kF16) {
      const __half h = __float2half_rn(x[i]);
      static_cast<__half*>(bits)[i] = h;
      back[i] = __half2float(h);
    } else {
      const uint8_t b = float_to_fp8_e4m3(x[i]);
      static_cast<uint8_t*>(bits)[i] = b;
      back[i] = fp8_e4m3_to_float(b);
    }
  }
}

void kv_gather(DType kv_dtype, const void* pool, int64_t row, const int64_t* slots, int64_t n,
               float* out, cudaStream_t stream) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(n);
  if (kv_dtype == DType::kF32) {
    kv_gather_kernel<DType::kF32><<<blocks, 128, 0, stream>>>(pool, row, slots, out);
  } else if (kv_dtype == DType::kF16) {
    kv_gather_kernel<DType::kF16><<<blocks, 128, 0, stream>>>(pool, row, slots, out);
  } else {
    kv_gather_kernel<DType::kF8_E4M3><<<blocks, 128, 0, stream>>>(pool, row, slots, out);
  }
}

}  // namespace dserve::cuda
