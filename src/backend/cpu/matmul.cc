// CpuBackend::matmul / matmul_many: prepares the activations once per call in every
// form its weights need (int8 rows, or int8 tiles for a batched kernel), then splits
// the weights' rows into chunks, all targets' chunks as one job over the thread pool.
// Each task runs all tokens of the call over its rows (in token blocks), so a weight
// chunk is read from memory once per call and then served from cache: decode (1
// token) is bound by weight bandwidth, prefill and batched decode by the kernels'
// arithmetic.
//
// Three kernel paths, per weight: a packed copy made at load (prepare_matmul_weight;
// KernelTable::matmul_packed), else the level's batched kernel for the type, which
// repacks 16 rows at a time into per-thread scratch (matmul_batched), else the
// per-row tile kernels (matmul[]). The first two give the same bits.
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
// panel is reused for this many tokens, whose tiled activations (~0.9 KB each at
// k = 576) stay in L2.
constexpr int64_t kBatchTokenBlock = 240;
// Panel tasks per thread and job: enough that dynamic scheduling evens out the
// threads (q/k/v of a 576-wide model are 60 panels: 4 per task on 2 threads).
constexpr int64_t kPanelTasksPerThread = 8;
// Below this many activation values, quantising runs on the calling thread.
constexpr int64_t kParallelQuantizeValues = 1 << 14;

enum class Path { kPacked, kBatched, kRows };

// One task of a matmul_many job: rows [r0, r0 + n_rows) of target `target`.
struct MatmulTask {
  int target;
  Path path;
  int64_t r0, n_rows;
};

}  // namespace

const uint8_t* CpuBackend::packed_for(const TensorView& w) const {
  if (packed_.empty()) return nullptr;
  const auto it = packed_.find(w.data);
  if (it == packed_.end()) return nullptr;
  const PackedWeight& p = it->second;
  if (p.dtype != w.dtype || w.n_dims() != 2 || p.n_rows != w.shape[0] || p.k != w.shape[1]) {
    return nullptr;
  }
  return p.panels;
}

void CpuBackend::prepare_matmul_weight(const TensorView& w) {
  const int type = static_cast<int>(w.dtype);
  if (w.n_dims() != 2 || type >= kNumDTypes || kernels_.pack_weight[type] == nullptr) return;
  const int64_t n = w.shape[0], k = w.shape[1];
  if (n == 0 || k % 32 != 0) return;
  const int64_t panel_bytes = kernels_.packed_layout[type].panel_bytes(k);
  const int64_t n_panels = (n + kMatmulPackRows - 1) / kMatmulPackRows;
  PackedWeight p{w.dtype, n, k, ScratchBuffer(), nullptr, 0};
  uint8_t* out = p.storage.get(static_cast<size_t>(n_panels * panel_bytes));
  p.panels = out;
  const PackWeightFn pack = kernels_.pack_weight[type];
  const size_t w_stride = w.row_bytes();
  pool_.parallel_for(n_panels, 1, [&](int64_t begin, int64_t end, int) {
    const int64_t r0 = begin * kMatmulPackRows;
    pack(w.row(r0), w_stride, std::min(n, end * kMatmulPackRows) - r0, k,
         out + begin * panel_bytes);
  });
  if (auto old = packed_.find(w.data); old != packed_.end()) {  // prepared again: replaced
    prepared_bytes_ -= old->second.bytes;
    packed_.erase(old);
  }
  p.bytes = n_panels * panel_bytes;
  prepared_bytes_ += p.bytes;
  packed_.emplace(w.data, std::move(p));
}

void CpuBackend::matmul(const TensorView& w, const TensorView* bias, const float* x,
                        int64_t n_tokens, float* y) {
  const MatmulTarget target{&w, bias, y};
  matmul_many(x, n_tokens, &target, 1);
}

void CpuBackend::matmul_many(const float* x, int64_t n_tokens, const MatmulTarget* targets,
                             int n_targets) {
  if (n_tokens <= 0 || n_targets <= 0) return;
  const int64_t k = targets[0].w->row_length();
  for (int i = 0; i < n_targets; ++i) {
    const TensorView& w = *targets[i].w;
    DS_CHECK(w.n_dims() == 2);
    DS_CHECK_MSG(w.shape[1] == k, "matmul_many: weights of row lengths %lld and %lld",
                 static_cast<long long>(k), static_cast<long long>(w.shape[1]));
    DS_CHECK(static_cast<int>(w.dtype) < kNumDTypes);
  }

  // 1. Each target's path, and the activation forms they need.
  const bool batched_ok = n_tokens >= kernels_.matmul_batched_min_tokens;
  Path paths[64];
  DS_CHECK(n_targets <= 64);
  const uint8_t* packed[64];
  bool need_tiles = false, need_scratch = false, need_rows[3] = {false, false, false};
  for (int i = 0; i < n_targets; ++i) {
    const TensorView& w = *targets[i].w;
    const int type = static_cast<int>(w.dtype);
    packed[i] = batched_ok && kernels_.matmul_packed[type] != nullptr ? packed_for(w) : nullptr;
    if (packed[i] != nullptr) {
      paths[i] = Path::kPacked;
    } else if (batched_ok && kernels_.matmul_batched[type] != nullptr) {
      paths[i] = Path::kBatched;
      need_scratch = true;
    } else {
      paths[i] = Path::kRows;
    }
    if (paths[i] == Path::kRows) {
      need_rows[static_cast<int>(act_format_for(w.dtype))] = true;
    } else {
      DS_CHECK(act_format_for(w.dtype) == ActFormat::kQ8x32);
      need_tiles = true;
    }
  }

  // 2. The activations in those forms, quantised once for all targets.
  const int64_t tile = kernels_.matmul_batched_tile;
  uint8_t* tiles = nullptr;
  if (need_tiles) {
    DS_CHECK(kBatchTokenBlock % tile == 0);
    tiles = act_tiles_.get(static_cast<size_t>(q8x32_tiles_bytes(k, n_tokens, tile)));
  }
  const uint8_t* rows[3] = {reinterpret_cast<const uint8_t*>(x), nullptr, nullptr};
  int64_t row_bytes[3] = {k * 4, 0, 0};
  uint8_t* quantised[3] = {nullptr, nullptr, nullptr};
  for (int fi = 1; fi < 3; ++fi) {  // the int8 formats; F32 rows are x itself
    if (!need_rows[fi]) continue;
    row_bytes[fi] = act_row_bytes(static_cast<ActFormat>(fi), k);
    quantised[fi] = act_rows_[fi].get(static_cast<size_t>(row_bytes[fi] * n_tokens));
    rows[fi] = quantised[fi];
  }
  if (need_tiles || quantised[1] != nullptr || quantised[2] != nullptr) {
    auto quantize_tokens = [&](int64_t begin, int64_t end, int) {
      for (int64_t t = begin; t < end; ++t) {
        const float* xt = x + t * k;
        if (tiles != nullptr) kernels_.quantize_q8x32_tiles(xt, k, t, tile, tiles);
        if (quantised[1] != nullptr) kernels_.quantize_q8x32(xt, k, quantised[1] + t * row_bytes[1]);
        if (quantised[2] != nullptr) {
          kernels_.quantize_q8x256(xt, k, quantised[2] + t * row_bytes[2]);
        }
      }
    };
    if (n_tokens * k < kParallelQuantizeValues) {
      quantize_tokens(0, n_tokens, 0);
    } else if (tiles != nullptr) {
      // Whole tiles per thread: a tile's tokens share cache lines (4 bytes each per
      // group), and two threads writing one line would pass it back and forth.
      pool_.parallel_for((n_tokens + tile - 1) / tile, 1, [&](int64_t begin, int64_t end, int) {
        quantize_tokens(begin * tile, std::min(n_tokens, end * tile), 0);
      });
    } else {
      pool_.parallel_for(n_tokens, 1, quantize_tokens);
    }
  }

  // 3. Row chunks of every target, one job. Panel paths: chunks of whole panels,
  // sized over all targets' panels together (a panel's cost does not depend on which
  // weight it belongs to). Per-row kernels: chunks that stay in L2.
  const int64_t n_threads = pool_.n_threads();
  int64_t total_panels = 0;
  for (int i = 0; i < n_targets; ++i) {
    if (paths[i] != Path::kRows) total_panels += (targets[i].w->shape[0] + 15) / 16;
  }
  const int64_t panels_per_task = std::max<int64_t>(
      1, (total_panels + kPanelTasksPerThread * n_threads - 1) / (kPanelTasksPerThread * n_threads));
  int64_t max_tasks = 0;
  for (int i = 0; i < n_targets; ++i) max_tasks += targets[i].w->shape[0] / kRowGranule + 1;
  auto* tasks = matmul_tasks_.get_as<MatmulTask>(static_cast<size_t>(max_tasks));
  int64_t n_tasks = 0;
  for (int i = 0; i < n_targets; ++i) {
    const TensorView& w = *targets[i].w;
    const int64_t n = w.shape[0];
    int64_t rows_per_task = panels_per_task * kRowGranule;
    if (paths[i] == Path::kRows) {
      rows_per_task = round_up((n + 4 * n_threads - 1) / (4 * n_threads), kRowGranule);
      rows_per_task = std::min(
          rows_per_task, std::max(kRowGranule, kMaxTaskWeightBytes /
                                                   static_cast<int64_t>(w.row_bytes()) /
                                                   kRowGranule * kRowGranule));
    }
    for (int64_t r0 = 0; r0 < n; r0 += rows_per_task) {
      tasks[n_tasks++] = {i, paths[i], r0, std::min(rows_per_task, n - r0)};
    }
  }
  if (need_scratch) {
    const auto scratch_bytes = static_cast<size_t>(matmul_batched_scratch_bytes(k));
    for (auto& buf : per_thread_) buf.get(scratch_bytes);  // no allocation inside tasks
  }
  pool_.run(n_tasks, [&](int64_t task_index, int thread) {
    const MatmulTask& task = tasks[task_index];
    const TensorView& w = *targets[task.target].w;
    const int64_t n = w.shape[0];
    float* y = targets[task.target].y;
    const int type = static_cast<int>(w.dtype);
    const int64_t w_stride = static_cast<int64_t>(w.row_bytes());
    const uint8_t* wb = w.row(task.r0);
    switch (task.path) {
      case Path::kPacked: {
        const uint8_t* panels = packed[task.target] +
                                task.r0 / kMatmulPackRows * kernels_.packed_layout[type].panel_bytes(k);
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kBatchTokenBlock) {
          kernels_.matmul_packed[type](panels, tiles + q8x32_tiles_bytes(k, t0, tile), k,
                                       task.n_rows, std::min(kBatchTokenBlock, n_tokens - t0),
                                       y + t0 * n + task.r0, n);
        }
        break;
      }
      case Path::kBatched: {
        uint8_t* scratch = per_thread_[thread].get(
            static_cast<size_t>(matmul_batched_scratch_bytes(k)));
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kBatchTokenBlock) {
          kernels_.matmul_batched[type](wb, w_stride, tiles + q8x32_tiles_bytes(k, t0, tile), k,
                                        task.n_rows, std::min(kBatchTokenBlock, n_tokens - t0),
                                        y + t0 * n + task.r0, n, scratch);
        }
        break;
      }
      case Path::kRows: {
        const int fi = static_cast<int>(act_format_for(w.dtype));
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
          kernels_.matmul[type](wb, w_stride, rows[fi] + t0 * row_bytes[fi], row_bytes[fi], k,
                                task.n_rows, std::min(kTokenBlock, n_tokens - t0),
                                y + t0 * n + task.r0, n);
        }
        break;
      }
    }
  });

  // 4. Biases.
  for (int i = 0; i < n_targets; ++i) {
    const TensorView* bias = targets[i].bias;
    if (bias == nullptr) continue;
    const int64_t n = targets[i].w->shape[0];
    DS_CHECK(bias->n_elements() == n);
    const float* b = as_f32(*bias, param_);
    for (int64_t t = 0; t < n_tokens; ++t) kernels_.add_f32(targets[i].y + t * n, b, n);
  }
}

}  // namespace dserve::cpu
