// CpuBackend::matmul: quantises the activations once, then splits the weight rows
// into chunks over the thread pool. Each task runs all tokens of the call over its
// rows (in token blocks), so a weight chunk is read from memory once per call and
// then served from cache: decode (1 token) is bound by weight bandwidth, prefill and
// batched decode by the kernels' arithmetic. From matmul_batched_min_tokens tokens on,
// a level's batched kernel (if it has one for the type) takes the call: it repacks
// 16 rows at a time into per-thread scratch and runs every token over them.
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"

namespace dserve::cpu {
namespace {

// Rows per task are a multiple of this (the widest register tile of any kernel).
constexpr int64_t kRowGranule = 16;
// Upper bound on one task's weight bytes, so they stay in L2 across token blocks.
constexpr int64_t kMaxTaskWeightBytes = 256 << 10;
// Tokens per kernel call; their activations stay in L1/L2 while the rows stream.
constexpr int64_t kTokenBlock = 64;
// Tokens per batched-kernel call (a multiple of every level's activation tile): each
// repacked panel is reused for this many tokens, whose tiled activations (~0.9 KB each
// at k = 576) stay in L2.
constexpr int64_t kBatchTokenBlock = 240;

}  // namespace

void CpuBackend::matmul(const TensorView& w, const TensorView* bias, const float* x,
                        int64_t n_tokens, float* y) {
  DS_CHECK(w.n_dims() == 2);
  const int64_t k = w.shape[1];
  const int64_t n = w.shape[0];
  if (n_tokens <= 0 || n == 0) return;
  const ActFormat fmt = act_format_for(w.dtype);
  const MatmulBatchFn batched = n_tokens >= kernels_.matmul_batched_min_tokens
                                    ? kernels_.matmul_batched[static_cast<int>(w.dtype)]
                                    : nullptr;

  // 1. Activations in the weight type's format (and tiled for a batched kernel).
  const uint8_t* xa = reinterpret_cast<const uint8_t*>(x);
  int64_t x_stride = k * 4;
  uint8_t* tiles = nullptr;
  if (batched != nullptr) {
    DS_CHECK(fmt == ActFormat::kQ8x32 && kBatchTokenBlock % kernels_.matmul_batched_tile == 0);
    tiles = act_tiles_.get(static_cast<size_t>(
        q8x32_tiles_bytes(k, n_tokens, kernels_.matmul_batched_tile)));
  }
  if (fmt != ActFormat::kF32) {
    x_stride = act_row_bytes(fmt, k);
    uint8_t* buf = act_.get(static_cast<size_t>(x_stride * n_tokens));
    auto quantize = fmt == ActFormat::kQ8x32 ? kernels_.quantize_q8x32 : kernels_.quantize_q8x256;
    auto quantize_rows = [&](int64_t begin, int64_t end, int) {
      for (int64_t t = begin; t < end; ++t) {
        quantize(x + t * k, k, buf + t * x_stride);
        if (tiles != nullptr) {
          q8x32_copy_to_tiles(buf + t * x_stride, k, t, kernels_.matmul_batched_tile, tiles);
        }
      }
    };
    if (n_tokens * k < (1 << 14)) {
      quantize_rows(0, n_tokens, 0);
    } else {
      pool_.parallel_for(n_tokens, 1, quantize_rows);
    }
    xa = buf;
  }

  // 2. Row chunks over the pool.
  const int64_t w_stride = static_cast<int64_t>(w.row_bytes());
  const int64_t n_threads = pool_.n_threads();
  const auto* wb = static_cast<const uint8_t*>(w.data);
  if (batched != nullptr) {
    // Whole panels, about four chunks per thread; the kernel reuses each panel for
    // all tokens of a block, so chunk size does not matter for cache reuse.
    const int64_t rows = round_up((n + 4 * n_threads - 1) / (4 * n_threads), kRowGranule);
    const int64_t n_tasks = (n + rows - 1) / rows;
    const auto scratch_bytes = static_cast<size_t>(matmul_batched_scratch_bytes(k));
    for (auto& buf : per_thread_) buf.get(scratch_bytes);  // no allocation inside tasks
    pool_.run(n_tasks, [&](int64_t task, int thread) {
      const int64_t r0 = task * rows;
      const int64_t nr = std::min(rows, n - r0);
      uint8_t* scratch = per_thread_[thread].get(scratch_bytes);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kBatchTokenBlock) {
        batched(wb + r0 * w_stride, w_stride,
                tiles + q8x32_tiles_bytes(k, t0, kernels_.matmul_batched_tile), k, nr,
                std::min(kBatchTokenBlock, n_tokens - t0), y + t0 * n + r0, n, scratch);
      }
    });
  } else {
    int64_t rows = round_up((n + 4 * n_threads - 1) / (4 * n_threads), kRowGranule);
    rows = std::min(rows, std::max(kRowGranule, kMaxTaskWeightBytes / w_stride / kRowGranule *
                                                    kRowGranule));
    const int64_t n_tasks = (n + rows - 1) / rows;
    const MatmulTileFn tile = kernels_.matmul[static_cast<int>(w.dtype)];
    pool_.run(n_tasks, [&](int64_t task, int) {
      const int64_t r0 = task * rows;
      const int64_t nr = std::min(rows, n - r0);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
        const int64_t nt = std::min(kTokenBlock, n_tokens - t0);
        tile(wb + r0 * w_stride, w_stride, xa + t0 * x_stride, x_stride, k, nr, nt,
             y + t0 * n + r0, n);
      }
    });
  }

  // 3. Bias.
  if (bias != nullptr) {
    DS_CHECK(bias->n_elements() == n);
    const float* b = as_f32(*bias, param_);
    for (int64_t t = 0; t < n_tokens; ++t) kernels_.add_f32(y + t * n, b, n);
  }
}

}  // namespace dserve::cpu
