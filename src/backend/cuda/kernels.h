// The CUDA backend's kernels, as the backend class (cuda_backend.cc, host compiler)
// launches them: plain structs of device pointers and sizes, one launcher per
// operation, every launch asynchronous on the given stream. Each launcher's meaning is
// the Backend operation of the same name (backend.h); what differs is said here.
//
// The kernels favour being plainly right over being fast: one warp per output row for
// matmuls (weights decoded in 32-element units, FP32 accumulation), one block per
// (token, head) for attention with an online softmax over 128-key tiles, MoE experts as
// per-slot products. They are what faster kernels (cuBLASLt GEMMs, tensor-core
// attention) will be checked against.
//
// Thread-safety: launchers may be called from one thread per stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace dserve::cuda {

// A weight matrix [n_rows, n_cols] in device memory, as TensorView describes it.
struct DeviceMatrix {
  DType dtype = DType::kF32;
  int64_t n_rows = 0, n_cols = 0;
  int64_t row_bytes = 0;
  const uint8_t* data = nullptr;
  // kI8: per-row scales [n_rows], optional per-row bias [n_rows], static activation
  // scale (0: per token) and zero point.
  const float* row_scales = nullptr;
  const float* row_bias = nullptr;
  float input_scale = 0.0f;
  int input_offset = 0;
  // kF8_E4M3: block scales, as BlockScales (tensor/tensor_view.h).
  const float* scales = nullptr;
  int64_t scale_stride = 0, block_rows = 1, block_cols = 1, row0 = 0, col0 = 0;
};

// The dtypes a DeviceMatrix may have (decode_unit in matmul.cu).
bool matmul_dtype_supported(DType t);

// y[n_tokens, w.n_rows] = x[n_tokens, w.n_cols] · wᵀ (+ bias [n_rows] F32, or null).
// act_q [n_tokens * w.n_cols] int8 and act_scale [n_tokens] are scratch for kI8
// weights' quantised activations (null otherwise).
void matmul(const DeviceMatrix& w, const float* bias, const float* x, int64_t n_tokens,
            float* y, int8_t* act_q, float* act_scale, cudaStream_t stream);

// out[i] = table row (ids[i] - first_id) as float, or zeros outside [0, n_rows).
void get_rows(const DeviceMatrix& table, const int32_t* ids, int64_t n_ids, int64_t first_id,
              float* out, cudaStream_t stream);

void rms_norm(const float* x, const float* weight, float eps, int64_t n_tokens, int64_t n,
              float* out, cudaStream_t stream);
void silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);
void rope(float* x, int64_t n_tokens, int n_heads, int head_dim, const int32_t* positions,
          int rotary_dim, int64_t n_positions, const float* cos, const float* sin,
          bool pairs_interleaved, cudaStream_t stream);

// Backend::copy_strided's shape, as plain numbers.
void copy_strided(float* dst, const float* src, int64_t n0, int64_t n1, int64_t len,
                  int64_t dst_stride0, int64_t dst_stride1, int64_t src_stride0,
                  int64_t src_stride1, cudaStream_t stream);
void gather_rows(const float* x, int64_t row_length, const int32_t* rows, int64_t n, float* out,
                 cudaStream_t stream);

// Pools of F32, F16 or F8_E4M3 (conversions round to nearest even, F8 saturating at
// ±448, as tensor/half.h).
void kv_store(DType kv_dtype, void* pool, int64_t row, const float* x, const int64_t* slots,
              int64_t n, cudaStream_t stream);
void kv_gather(DType kv_dtype, const void* pool, int64_t row, const int64_t* slots, int64_t n,
               float* out, cudaStream_t stream);

// One attention call: contiguous (block_tables null: position p is slot p of sequence
// 0) or paged. Keys of (slot, kv head h) start at k + slot * k_row + h * head_dim,
// values at v + slot * v_row + h * v_dim; MLA's latent pool is one kv head whose keys
// are whole rows and whose values the rows' first v_dim elements (v == k, v_row == k_row).
struct AttentionArgs {
  const float* q = nullptr;  // [n_tokens, n_heads, head_dim]
  float* out = nullptr;      // [n_tokens, n_heads, v_dim]
  const void* k = nullptr;
  const void* v = nullptr;
  DType kv_dtype = DType::kF32;
  int64_t k_row = 0, v_row = 0;
  int64_t n_tokens = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, v_dim = 0;
  float scale = 1.0f;
  const int32_t* positions = nullptr;  // [n_tokens]: token t attends to 0..positions[t]
  const int32_t* seq_of_token = nullptr;
  const int32_t* block_tables = nullptr;
  const int64_t* block_table_offsets = nullptr;
  int block_size = 16;
};
// The largest v_dim the attention kernel holds (accumulators per thread).
inline constexpr int kMaxAttentionVDim = 1024;
void attention(const AttentionArgs& args, cudaStream_t stream);

// MoeRouting's numbers (backend.h) with the bias in device memory.
struct RoutingArgs {
  int n_experts = 0, top_k = 0;
  bool sigmoid = false;
  int group_select = 0;  // 0 none, 1 max of group, 2 sum of the two best
  int n_groups = 1, top_groups = 1;
  bool normalize = false;
  float scaling = 1.0f;
  const float* correction_bias = nullptr;
};
inline constexpr int kMaxRoutedExperts = 512;
inline constexpr int kMaxExpertGroups = 64;
void moe_route(const float* logits, int64_t n_tokens, const RoutingArgs& routing, int32_t* ids,
               float* weights, cudaStream_t stream);

// The routed experts of one layer for one batch. experts: device array of 3 * n_experts
// matrices (gate, up, down of expert e at 3e..3e+2; only [first, end) need be valid).
// h [n_tokens * k, inter] and slot_out [n_tokens * k, hidden] are scratch. out[t] =
// sum over t's slots with experts in [first, end), in increasing expert id, of weight
// * expert(x[t]) (shared experts are added by the caller). counters as Backend's.
struct MoeArgs {
  const float* x = nullptr;  // [n_tokens, hidden]
  DType dtype = DType::kF32;  // every local expert's weights have it
  int64_t n_tokens = 0;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int k = 0;
  const DeviceMatrix* experts = nullptr;
  int n_experts = 0, first = 0, end = 0;
  int64_t hidden = 0, inter = 0;
  float* h = nullptr;
  float* slot_out = nullptr;
  float* out = nullptr;
  int64_t* counters = nullptr;  // [kMoeCounterCount] or null
};
// counters' layout, Backend's MoeCounter (cuda_backend.cc checks they agree).
enum MoeCounterIndex {
  kMoeRoutedSlotsIndex,
  kMoeExpertRunsIndex,
  kMoeExpertRowsIndex,
  kMoeExpertIdleIndex,
  kMoeCounterCount
};
void moe_experts(const MoeArgs& args, cudaStream_t stream);

// The kernels' own code paths that need no GPU, run on the host with host pointers in
// w (or the routing bias), so that a machine without a GPU still checks them against
// the CPU backend: rows [first_row, first_row + n_rows) of w decoded as matmul and
// get_rows decode them (out [n_rows, n_cols]), the router's choice as moe_route, and
// the KV pool's conversions.
void decode_rows_on_host(const DeviceMatrix& w, int64_t first_row, int64_t n_rows, float* out);
void route_on_host(const float* logits, int64_t n_tokens, const RoutingArgs& routing,
                   int32_t* ids, float* weights);
// x [n] to F16 / F8_E4M3 bits as kv_store converts them, and back as kv_gather does.
void kv_convert_on_host(DType kv_dtype, const float* x, int64_t n, void* bits, float* back);

}  // namespace dserve::cuda
