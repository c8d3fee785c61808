// CpuBackend::matmul: quantises the activations once, then splits the weight rows
// into chunks over the thread pool. Each task runs all tokens of the call over its
// rows (in token blocks), so a weight chunk is read from memory once per call and
// then served from cache: decode (1 token) is bound by weight bandwidth, prefill by
// the kernels' arithmetic.
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

}  // namespace

void CpuBackend::matmul(const TensorView& w, const TensorView* bias, const float* x,
                        int64_t n_tokens, float* y) {
  DS_CHECK(w.n_dims() == 2);
  const int64_t k = w.shape[1];
  const int64_t n = w.shape[0];
  if (n_tokens <= 0 || n == 0) return;
  const ActFormat fmt = act_format_for(w.dtype);

  // 1. Activations in the weight type's format.
  const uint8_t* xa = reinterpret_cast<const uint8_t*>(x);
  int64_t x_stride = k * 4;
  if (fmt != ActFormat::kF32) {
    x_stride = act_row_bytes(fmt, k);
    uint8_t* buf = act_.get(static_cast<size_t>(x_stride * n_tokens));
    auto quantize = fmt == ActFormat::kQ8x32 ? kernels_.quantize_q8x32 : kernels_.quantize_q8x256;
    auto quantize_rows = [&](int64_t begin, int64_t end, int) {
      for (int64_t t = begin; t < end; ++t) quantize(x + t * k, k, buf + t * x_stride);
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
  int64_t rows = round_up((n + 4 * n_threads - 1) / (4 * n_threads), kRowGranule);
  rows = std::min(rows, std::max(kRowGranule, kMaxTaskWeightBytes / w_stride / kRowGranule *
                                                  kRowGranule));
  const int64_t n_tasks = (n + rows - 1) / rows;
  const MatmulTileFn tile = kernels_.matmul[static_cast<int>(w.dtype)];
  const auto* wb = static_cast<const uint8_t*>(w.data);
  pool_.run(n_tasks, [&](int64_t task, int) {
    const int64_t r0 = task * rows;
    const int64_t nr = std::min(rows, n - r0);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
      const int64_t nt = std::min(kTokenBlock, n_tokens - t0);
      tile(wb + r0 * w_stride, w_stride, xa + t0 * x_stride, x_stride, k, nr, nt,
           y + t0 * n + r0, n);
    }
  });

  // 3. Bias.
  if (bias != nullptr) {
    DS_CHECK(bias->n_elements() == n);
    const float* b = as_f32(*bias, param_);
    for (int64_t t = 0; t < n_tokens; ++t) kernels_.add_f32(y + t * n, b, n);
  }
}

}  // namespace dserve::cpu
