// The CPU kernel table: the innermost loops of the CPU backend, one implementation
// per instruction-set level (kernels_scalar.cc, kernels_avx2.cc, kernels_avx512.cc).
// The backend picks a table once and calls through it; everything around the
// kernels (threading, tiling, scratch memory) is shared ISA-independent code.
//
// Matmuls on quantised weights first quantise the activations to int8 once per call
// (as llama.cpp does) so the inner products are integer dot products:
//   ActFormat::kQ8x32   per-32 blocks, for Q8_0 / Q4_0 / Q4_1 weights
//   ActFormat::kQ8x256  per-256 blocks with per-16 sums, for Q4_K / Q5_K / Q6_K
//   ActFormat::kQ8Token one scale per token (W8A8: I8 weights), or the weight's
//                       static input scale
// F32 / F16 / BF16 weights take the activations as they are (ActFormat::kF32) and
// compute in FP32; so do FP8 (E4M3) weights, converted to f32 inside the kernel,
// with their block scales applied once per block of the reduction (MatmulF8Fn).
//
// Every level must quantise activations bit-identically (q = round-to-nearest-even of
// x * (1 / d), d = max|x| / 127), so the levels differ only in float summation order.
//
// Thread-safety: pure functions on caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_isa.h"
#include "tensor/dtype.h"
#include "tensor/tensor_view.h"

namespace dserve::cpu {

enum class ActFormat { kF32, kQ8x32, kQ8x256, kQ8Token };
inline constexpr int kNumActFormats = 4;

ActFormat act_format_for(DType weight);

// The helpers below are `static` on purpose: this header is also compiled into the
// AVX2 / AVX-512 translation units, and an ordinary inline function emitted there
// (with wide instructions) could be the copy the linker keeps for every caller.
inline constexpr int64_t kActAlign = 64;
static constexpr int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// One quantised activation row of k values (k a multiple of the block), laid out as
//   kQ8x32:  int8 qs[k] | pad to 64 | float d[k/32] | float s[k/32]   (s = d * sum(qs))
//   kQ8x256: int8 qs[k] | pad to 64 | float d[k/256] | int16 bsums[k/16]
//   kQ8Token: int8 qs[k] | pad to 64 | float d
// and each row padded to a multiple of 64 bytes.
static inline int64_t act_row_bytes(ActFormat f, int64_t k) {
  switch (f) {
    case ActFormat::kF32: return round_up(k * 4, kActAlign);
    case ActFormat::kQ8x32: return round_up(round_up(k, kActAlign) + (k / 32) * 8, kActAlign);
    case ActFormat::kQ8x256:
      return round_up(round_up(k, kActAlign) + (k / 256) * 4 + (k / 16) * 2, kActAlign);
    case ActFormat::kQ8Token: return round_up(round_up(k, kActAlign) + 4, kActAlign);
  }
  return 0;
}

struct Q8x32Row {
  const int8_t* qs;  // [k]
  const float* d;    // [k/32]
  const float* s;    // [k/32]
};
static inline Q8x32Row q8x32_row(const uint8_t* p, int64_t k) {
  const float* d = reinterpret_cast<const float*>(p + round_up(k, kActAlign));
  return {reinterpret_cast<const int8_t*>(p), d, d + k / 32};
}

struct Q8x256Row {
  const int8_t* qs;      // [k]
  const float* d;        // [k/256]
  const int16_t* bsums;  // [k/16]
};
static inline Q8x256Row q8x256_row(const uint8_t* p, int64_t k) {
  const float* d = reinterpret_cast<const float*>(p + round_up(k, kActAlign));
  return {reinterpret_cast<const int8_t*>(p), d, reinterpret_cast<const int16_t*>(d + k / 256)};
}

struct Q8TokenRow {
  const int8_t* qs;  // [k]
  float d;           // the token's scale
};
static inline Q8TokenRow q8token_row(const uint8_t* p, int64_t k) {
  float d;
  std::memcpy(&d, p + round_up(k, kActAlign), 4);
  return {reinterpret_cast<const int8_t*>(p), d};
}

// x[k] -> one kQ8Token row. static_scale 0: dynamic, d = max|x| / 127 and
// q = round-to-nearest-even(x * (1 / d)) (as vLLM's CPU path). Otherwise d =
// static_scale and q = that rounding clamped to [-127, 127]: -128 is left out so that
// the x86 kernels can move a weight's sign onto the activation (vpsignb) without
// overflow; it only matters for values past the calibrated range. One plain C++
// definition for every level, so the levels cannot differ in it. static_offset: the
// static activations' zero point (msModelSlim's input_offset), added before the clamp:
// q = clamp(round(x * (1 / d)) + static_offset, -127, 127).
void quantize_q8_token(const float* x, int64_t k, float static_scale, uint8_t* out,
                       int static_offset = 0);

// W8A8: y[t * y_stride + r] = float(sum_j q_w[r][j] q_x[t][j]) * (w_scales[r] * d_x[t])
// for r < n_rows, t < n_tokens: an exact int32 dot, scaled once. w rows w_stride
// bytes apart (int8), activations kQ8Token rows x_stride bytes apart. Every level
// gives the same bits (the integer dot is exact and the float steps are the same).
using MatmulI8Fn = void (*)(const uint8_t* w, size_t w_stride, const float* w_scales,
                            const uint8_t* x, size_t x_stride, int64_t k, int64_t n_rows,
                            int64_t n_tokens, float* y, int64_t y_stride);
// The packed form of I8 rows (see PackWeightFn), their scales inside each panel.
using PackI8Fn = void (*)(const uint8_t* w, size_t w_stride, const float* w_scales,
                          int64_t n_rows, int64_t k, uint8_t* out);

// FP8 E4M3 weights with block scales (TensorView::block_scales; scales.block_cols and
// scales.col0 multiples of 16), F32 activation rows x_stride bytes apart: for r <
// n_rows, t < n_tokens
//   y[t * y_stride + r] = sum_b scales.row(r)[b] * (sum_{j in block b} fp8(w[r][j]) x[t][j])
// over the blocks b of the row: columns [0, block_cols - col0), then block_cols each
// (the last one may be shorter). Each
// (row, token) result is one chain of operations that does not depend on n_rows or
// n_tokens, so a token gets the same bits alone and in any batch; the levels differ
// only in float summation order.
using MatmulF8Fn = void (*)(const uint8_t* w, size_t w_stride, const BlockScales& scales,
                            const uint8_t* x, size_t x_stride, int64_t k, int64_t n_rows,
                            int64_t n_tokens, float* y, int64_t y_stride);

// Computes y[t * y_stride + r] = dot(row r of w, activation row t) for r < n_rows,
// t < n_tokens. w rows are w_stride bytes apart (blocks along k); activation rows
// x_stride bytes apart in the weight type's ActFormat.
using MatmulTileFn = void (*)(const uint8_t* w, size_t w_stride, const uint8_t* x,
                              size_t x_stride, int64_t k, int64_t n_rows, int64_t n_tokens,
                              float* y, int64_t y_stride);

// Activations for the batched kernels (GEMM-shaped: many tokens per call), Q8x32 rows
// regrouped into tiles of T tokens so that one tile's values for a block sit together:
// tile i holds tokens [T i, T i + T) and, per 32-block b, q8x32_tile_block_bytes(T) =
// 48 T bytes:
//   int8 qs[8][T][4]   (the 4 values of group g of token t at [g][t])
//   float d[T], s[T]   (as in the Q8x32 row)
//   int32 off8[T], off128[T]   (-8 and -128 times the block's sum of qs)
// Slots past the last token of the final tile hold stale bytes: a kernel may read them
// (into results it does not store), never rely on them.
// A call with a single token (decode) gets it in a tile of width 1 instead, whatever
// the level's tile width (q8x32_call_tile): a block's 48 bytes then share one or two
// cache lines, where a wide tile spreads them over 48 T bytes that the weight stream
// evicts from L1, so that every block's activations came from L2. Measured on one
// Zen 4 core (AVX-512), matmul_bench's decode/q8_0/vocab_65536x1024 and
// stream/moe_q8_0 read 12-14 and 10-11 GB/s with the wide tile, 14-21 and 14-20 GB/s
// with width 1. Kernels read a 1-token call's tile that way.
static constexpr int64_t q8x32_tile_block_bytes(int64_t tile) { return 48 * tile; }
static constexpr int64_t q8x32_call_tile(int64_t level_tile, int64_t n_tokens) {
  return n_tokens == 1 ? 1 : level_tile;
}
static constexpr int64_t q8x32_tiles_bytes(int64_t k, int64_t n_tokens, int64_t tile) {
  return (n_tokens + tile - 1) / tile * (k / 32) * q8x32_tile_block_bytes(tile);
}
// Writes one token's slot of one block of a tile (layout above): `slot` is the
// token's place in the block's first row, blk + 4 * (t % T); qs the block's 32 values.
inline void store_q8x32_tile_slot(uint8_t* slot, int64_t tile, const int8_t* qs, float d,
                                  float s, int32_t sum) {
  const int32_t off[2] = {-8 * sum, -128 * sum};
  for (int64_t g = 0; g < 8; ++g) std::memcpy(slot + 4 * g * tile, qs + 4 * g, 4);
  std::memcpy(slot + 4 * 8 * tile, &d, 4);
  std::memcpy(slot + 4 * 9 * tile, &s, 4);
  std::memcpy(slot + 4 * 10 * tile, &off[0], 4);
  std::memcpy(slot + 4 * 11 * tile, &off[1], 4);
}
// Copies token t's Q8x32 row (act_row_bytes(kQ8x32, k) bytes at `row`) into `tiles`.
void q8x32_copy_to_tiles(const uint8_t* row, int64_t k, int64_t t, int64_t tile, uint8_t* tiles);
// Copies a single token's tile of width 1 (`one`) into slot 0 of a tile of width
// `tile` (`out`, q8x32_tile_block_bytes(tile) * k / 32 bytes; other slots untouched),
// for kernels that read tokens several at a time.
void q8x32_widen_tile(const uint8_t* one, int64_t k, int64_t tile, uint8_t* out);

// y[t * y_stride + r] = dot(row r of w, token t) for r < n_rows, t < n_tokens, with
// the activations in tiles as above (tile width q8x32_call_tile(
// KernelTable::matmul_batched_tile, n_tokens)) for
// the 32-block types, and as Q8x256 rows (act_row_bytes(kQ8x256, k) apart) for the
// K-quants.
// May repack weight rows into `scratch`: matmul_batched_scratch_bytes(k) bytes,
// 64-byte aligned, owned by the calling thread.
using MatmulBatchFn = void (*)(const uint8_t* w, size_t w_stride, const uint8_t* x_tiles,
                               int64_t k, int64_t n_rows, int64_t n_tokens, float* y,
                               int64_t y_stride, uint8_t* scratch);

// Scratch of a MatmulBatchFn: one 16-row panel of k weights as bytes plus two floats
// per row and 32-element block (kernels_avx512_gemm.h).
static constexpr int64_t matmul_batched_scratch_bytes(int64_t k) { return (k / 32) * 640; }

// A level's own layout of a weight matrix for its batched kernel ("packed"), made
// once when a model is loaded so that no call repacks: panels of kMatmulPackRows
// rows, one after another, each matmul_packed_panel_bytes(k) bytes (padding rows of
// the last panel compute zeros). The packed kernel gives the same results, bit for
// bit, as the batched kernel on the original rows.
inline constexpr int64_t kMatmulPackRows = 16;
// Writes the packed form of w[n_rows, k] (rows w_stride bytes apart) to `out`:
// ceil(n_rows / kMatmulPackRows) panels.
using PackWeightFn = void (*)(const uint8_t* w, size_t w_stride, int64_t n_rows, int64_t k,
                              uint8_t* out);
// As MatmulBatchFn for rows [0, n_rows) of a packed matrix (`packed` at a panel).
// `next`: the packed panel the calling thread reads right after these rows (another
// matrix's, in a job of several), or null. A kernel may prefetch its first bytes
// while it reads its own last ones, so that the next matrix does not start cold; it
// never reads `next` otherwise.
using MatmulPackedFn = void (*)(const uint8_t* packed, const uint8_t* x_tiles, int64_t k,
                                int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride,
                                const uint8_t* next);
struct PackedLayout {
  int64_t block_bytes = 0;  // bytes per panel and 32-element block; 0: no packed form
  int64_t panel_extra_bytes = 0;  // bytes per panel besides the blocks (I8's row scales)
  int64_t odd_block_extra_bytes = 0;  // more where k / 32 is odd (blocks packed in pairs)
  int64_t panel_bytes(int64_t k) const {
    return k / 32 * block_bytes + (k / 32 % 2) * odd_block_extra_bytes + panel_extra_bytes;
  }
};

// Quantises x[k] as token t straight into `tiles` (tile width `tile`): the same bytes
// as quantize_q8x32 followed by q8x32_copy_to_tiles.
using QuantizeTilesFn = void (*)(const float* x, int64_t k, int64_t t, int64_t tile,
                                 uint8_t* tiles);
void q8x32_quantize_to_tiles_generic(const float* x, int64_t k, int64_t t, int64_t tile,
                                     uint8_t* tiles);

inline constexpr int kNumDTypes = 11;  // the DTypes a kernel reads (F32 .. F8_E4M3)

// One step of online-softmax attention (paged_attention.cc): n_q queries that share
// a KV head against n_keys consecutive KV rows (a run of slots inside one block).
// Query i sees only the first n_visible[i] of these keys (none when <= 0); it keeps
// a running max m, sum of exponentials l and unnormalised output acc across steps:
//   s_j = scale * q_i . k_j,   m' = max(m, max_j s_j),   c = exp(m - m'),
//   l' = l c + sum_j exp(s_j - m'),   acc' = acc c + sum_j exp(s_j - m') v_j.
// Start with m = -inf, l = 0, acc = 0; the output is acc / l.
// K and V rows are floats (attn_step_f32), IEEE halves (attn_step_f16, the F16 KV
// cache) or float8_e4m3fn (attn_step_f8, the FP8 KV cache): the F16 and F8 steps
// convert each element exactly and then do the F32 step's arithmetic in the same
// order, so all give the same bits for the same values.
// A query's arithmetic depends only on its own inputs, never on n_q or the other
// queries of the call (the engine's batch invariance rests on it).
// One element of an FP8 (float8_e4m3fn) KV cache row: a type of its own so that the
// attention steps' loads convert it.
struct KvF8 {
  uint8_t bits;
};

struct AttnStepArgs {
  const float* const* q;     // [n_q] pointers to query rows [head_dim]
  const uint16_t* const* q_bf16;  // attn_step_bf16 only: the same rows in BF16, padded
  const int64_t* n_visible;  // [n_q]
  int n_q;
  const void* k;  // n_keys rows [head_dim], k_stride elements apart
  const void* v;  // n_keys rows [v_dim], v_stride elements apart
  int64_t k_stride, v_stride, n_keys;
  int head_dim, v_dim;
  float scale;
  float* m;       // [n_q]
  float* l;       // [n_q]
  float* acc;     // [n_q, v_dim]
  float* scores;  // [n_q, round_up(n_keys, 4)] scratch
};

// Prompt attention (CpuBackend::prompt_attention): one head of a block of up to
// KernelTable::attn_prompt_queries queries of one sequence over its contiguous float
// keys and values, the queries in vector lanes. Query i sees keys 0 .. positions[i].
// Keys go in online-softmax steps of kAttnPromptKeyStep positions from position 0, so
// a query's steps, and every lane's arithmetic, are its own: its output has the same
// bits whatever block it is computed in (the engine's batch invariance) -- other bits
// than attn_step's, whose arithmetic (dot products reduced across lanes) differs.
inline constexpr int kAttnPromptKeyStep = 64;
struct AttnPromptArgs {
  const float* q;            // query i's row [head_dim] at q + i * q_stride
  int64_t q_stride;
  const int32_t* positions;  // [n_q]
  int n_q;                   // 1 .. attn_prompt_queries
  const float* k;            // key j's row [head_dim] at k + j * k_stride
  const float* v;            // value j's row [v_dim] at v + j * v_stride
  int64_t k_stride, v_stride;
  int head_dim, v_dim;
  float scale;
  float* out;  // query i's output [v_dim] at out + i * out_stride
  int64_t out_stride;
  float* scratch;  // attn_prompt_scratch_floats(head_dim, v_dim, attn_prompt_queries)
};
inline int64_t attn_prompt_scratch_floats(int head_dim, int v_dim, int lanes) {
  return int64_t{lanes} * (head_dim + kAttnPromptKeyStep + v_dim + 1);
}

struct KernelTable {
  CpuIsa isa;
  // x[k] -> one activation row (act_row_bytes bytes) in the given format.
  void (*quantize_q8x32)(const float* x, int64_t k, uint8_t* out);
  void (*quantize_q8x256)(const float* x, int64_t k, uint8_t* out);
  MatmulTileFn matmul[kNumDTypes];  // indexed by DType
  // Optional faster kernels for n_tokens >= matmul_batched_min_tokens, for quantised
  // weight types (activations: see MatmulBatchFn); null where a level has none for a
  // type (then matmul[] serves every token count).
  MatmulBatchFn matmul_batched[kNumDTypes];
  int64_t matmul_batched_min_tokens;
  int64_t matmul_batched_tile;  // tokens per activation tile
  QuantizeTilesFn quantize_q8x32_tiles;  // activations for matmul_batched / matmul_packed
  // Optional packed forms (see PackWeightFn), per DType; null where a level has none.
  PackWeightFn pack_weight[kNumDTypes];
  MatmulPackedFn matmul_packed[kNumDTypes];
  PackedLayout packed_layout[kNumDTypes];
  // W8A8 (DType::kI8): the per-row kernel (every level), and optionally the packed
  // form (pack_i8, then matmul_packed / packed_layout at kI8, whose activations are
  // kQ8Token rows act_row_bytes(kQ8Token, k) apart). The packed kernel serves every
  // token count and gives the per-row kernel's bits.
  MatmulI8Fn matmul_i8;
  PackI8Fn pack_i8;
  // FP8 E4M3 with block scales (every level; matmul[kF8_E4M3] stays null): decode and
  // many-token calls alike, each weight vector converted once per register tile of
  // tokens.
  MatmulF8Fn matmul_f8;

  float (*dot_f32)(const float* a, const float* b, int64_t n);
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n);  // y += a * x
  void (*scale_f32)(float a, float* y, int64_t n);                 // y *= a
  // out = x / sqrt(mean(x^2) + eps) * w
  void (*rms_norm_f32)(const float* x, const float* w, float eps, int64_t n, float* out);
  void (*silu_mul_f32)(const float* gate, const float* up, int64_t n, float* out);
  void (*add_f32)(float* x, const float* y, int64_t n);  // x += y
  // x[i] = exp(x[i] - max) for i < n; returns the sum of the new values.
  float (*exp_sub_sum_f32)(float* x, float max, int64_t n);
  void (*attn_step_f32)(const AttnStepArgs& a);  // see AttnStepArgs; float K/V
  void (*attn_step_f16)(const AttnStepArgs& a);  // the same over IEEE-half K/V
  void (*attn_step_f8)(const AttnStepArgs& a);   // the same over float8_e4m3fn K/V
  // AVX512-BF16 only (null elsewhere): MLA's absorbed attention over FP8 latents with
  // BF16 products (kernels_avx512_bf16.cc: its layouts and why FP8 only). The step
  // reads q_bf16, keys and values as attn_rows_to_bf16 writes them.
  void (*attn_step_bf16)(const AttnStepArgs& a);
  void (*attn_rows_to_bf16)(const float* rows, int64_t n_keys, int head_dim, int v_dim,
                            uint16_t* k, int64_t k_stride, uint32_t* v_pairs,
                            int64_t v_stride);
  // x[n] -> out[n_pad] in BF16 (nearest even), zeros past n; n_pad a multiple of 32.
  void (*f32_to_bf16_padded)(const float* x, int n, int n_pad, uint16_t* out);
  // See AttnPromptArgs; null where the level has none (prompt_attention then runs
  // attention's kernel). attn_prompt_queries: the most queries per call.
  void (*attn_prompt_f32)(const AttnPromptArgs& a);
  int attn_prompt_queries;
  // Row conversions for the F16 KV cache: round to nearest even (as f32_to_f16 in
  // tensor/half.h, bit for bit on every level), and back exactly.
  void (*f32_to_f16_row)(const float* x, uint16_t* out, int64_t n);
  void (*f16_to_f32_row)(const uint16_t* x, float* out, int64_t n);
  // And the FP8 cache's rows (float8_e4m3fn) to floats, exactly (as the steps' loads).
  void (*f8_to_f32_row)(const KvF8* x, float* out, int64_t n);
};

const KernelTable& kernels_scalar();
#if defined(DSERVE_CPU_X86)
const KernelTable& kernels_avx2();
const KernelTable& kernels_avx512();
// Adds the AVX512-BF16 kernels to an avx512 table (only where the CPU has them).
void add_avx512_bf16(KernelTable& t);
#endif
#if defined(DSERVE_CPU_ARM)
const KernelTable& kernels_neon();
const KernelTable& kernels_neon_dotprod();
#endif

// The table for `isa`, which must be supported.
const KernelTable& kernels_for(CpuIsa isa);

}  // namespace dserve::cpu
