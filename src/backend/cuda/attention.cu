// Causal attention on the GPU, contiguous or paged, GQA and MLA's latent pool alike:
// one block of kThreads threads per (token, head). Keys go in tiles of kThreads, one
// key per thread for its score; the online softmax (running max and sum, in FP32)
// rescales the accumulators once per tile; each thread then accumulates its share of
// the value dimensions over the tile's keys.
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace dserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kAccPerThread = kMaxAttentionVDim / kThreads;

template <DType T>
__device__ __forceinline__ float load_kv(const void* base, int64_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (T == DType::kF16) {
    return __half2float(static_cast<const __half*>(base)[i]);
  } else {
    return fp8_e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
  }
}

template <DType T>
__global__ void attention_kernel(AttentionArgs a) {
  extern __shared__ int64_t shared[];
  int64_t* slot_sh = shared;                                      // [kThreads]
  float* q_sh = reinterpret_cast<float*>(slot_sh + kThreads);     // [head_dim]
  float* p_sh = q_sh + a.head_dim;                                // [kThreads]
  float* scratch = p_sh + kThreads;                               // [kWarp]

  const int64_t t = blockIdx.x / a.n_heads;
  const int h = static_cast<int>(blockIdx.x % a.n_heads);
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int tid = threadIdx.x;
  const float* q = a.q + (t * a.n_heads + h) * a.head_dim;
  for (int i = tid; i < a.head_dim; i += kThreads) q_sh[i] = q[i];

  const int64_t n_keys = int64_t{a.positions[t]} + 1;
  const int32_t* table = nullptr;
  if (a.block_tables != nullptr) table = a.block_tables + a.block_table_offsets[a.seq_of_token[t]];
  const int64_t k_off = int64_t{kvh} * a.head_dim, v_off = int64_t{kvh} * a.v_dim;

  float m = -INFINITY, l = 0.0f;
  float acc[kAccPerThread] = {};
  __syncthreads();
  for (int64_t k0 = 0; k0 < n_keys; k0 += kThreads) {
    const int64_t j = k0 + tid;
    float s = -INFINITY;
    if (j < n_keys) {
      const int64_t slot =
          table != nullptr ? int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size : j;
      slot_sh[tid] = slot;
      const int64_t base = slot * a.k_row + k_off;
      float dot = 0.0f;
      for (int i = 0; i < a.head_dim; ++i) dot = fmaf(q_sh[i], load_kv<T>(a.k, base + i), dot);
      s = dot * a.scale;
    }
    const float tile_max = block_reduce<true>(s, scratch);
    const float new_m = fmaxf(m, tile_max);
    const float correction = expf(m - new_m);  // 0 on the first tile (m = -inf)
    const float p = j < n_keys ? expf(s - new_m) : 0.0f;
    p_sh[tid] = p;
    l = l * correction + block_reduce<false>(p, scratch);
    m = new_m;
    __syncthreads();  // p_sh and slot_sh complete
    const int n_tile = static_cast<int>(min64(kThreads, n_keys - k0));
#pragma unroll
    for (int c = 0; c < kAccPerThread; ++c) {
      const int d = tid + c * kThreads;
      if (d >= a.v_dim) break;
      float sum = acc[c] * correction;
      for (int jj = 0; jj < n_tile; ++jj) {
        sum = fmaf(p_sh[jj], load_kv<T>(a.v, slot_sh[jj] * a.v_row + v_off + d), sum);
      }
      acc[c] = sum;
    }
    __syncthreads();  // before the next tile overwrites p_sh and slot_sh
  }
  float* out = a.out + (t * a.n_heads + h) * a.v_dim;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int c = 0; c < kAccPerThread; ++c) {
    const int d = tid + c * kThreads;
    if (d >= a.v_dim) break;
    out[d] = acc[c] * inv;
  }
}

}  // namespace

void attention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return;
  const auto blocks = static_cast<unsigned>(a.n_tokens * a.n_heads);
  const size_t shared = (static_cast<size_t>(a.head_dim) + kThreads + kWarp) * sizeof(float) +
                        kThreads * sizeof(int64_t);
  if (a.kv_dtype == DType::kF32) {
    attention_kernel<DType::kF32><<<blocks, kThreads, shared, stream>>>(a);
  } else if (a.kv_dtype == DType::kF16) {
    attention_kernel<DType::kF16><<<blocks, kThreads, shared, stream>>>(a);
  } else {
    attention_kernel<DType::kF8_E4M3><<<blocks, kThreads, shared, stream>>>(a);
  }
}

}  // namespace dserve::cuda
