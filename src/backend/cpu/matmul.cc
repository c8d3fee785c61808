// CpuBackend::matmul / matmul_many / matmul_grouped: prepares each input once per call
// in every form its weights need (int8 rows, or int8 tiles for a batched kernel), then
// splits the weights' rows into chunks, all targets' chunks of all groups as one job
// over the thread pool (a mixture-of-experts layer's experts are one job, not one
// each).
// Each task runs all tokens of the call over its rows (in token blocks), so a weight
// chunk is read from memory once per call and then served from cache: decode (1
// token) is bound by weight bandwidth, prefill and batched decode by the kernels'
// arithmetic. A task of the panel paths may run from one weight's last rows into the
// next weight's first, the kernel prefetching the next one's first panel while it
// reads its own last: a decode job (a MoE layer's experts, q/k/v) then streams its
// matrices one after another instead of waiting on DRAM at the start of each.
//
// Three kernel paths, per weight: a packed copy made at load (prepare_matmul_weight;
// KernelTable::matmul_packed), else the level's batched kernel for the type, which
// repacks 16 rows at a time into per-thread scratch (matmul_batched), else the
// per-row tile kernels (matmul[]). The first two give the same bits.
//
// FP8 weights (DType::kF8_E4M3) take the F32 activations and run the level's per-row
// kernel (matmul_f8) for every token count: it converts each weight vector once per
// register tile of tokens and applies the block scales (TensorView::block_scales).
//
// W8A8 weights (DType::kI8) take activations quantised per token (or with the
// weight's static input scale): their packed copy serves every token count, else
// the level's per-row int8 kernel (matmul_i8). Weights of one group that need
// different static scales run as groups of their own.
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
// Tokens of the batched-kernel call that starts at token t0 of n_tokens:
// kBatchTokenBlock, or the rest, with a lone last token joined to the call before it
// (a call of one token reads a tile of width 1, kernels.h, and a group's tiles have
// one width).
int64_t batch_call_tokens(int64_t n_tokens, int64_t t0) {
  const int64_t rest = n_tokens - t0;
  return rest == kBatchTokenBlock + 1 ? rest : std::min(rest, kBatchTokenBlock);
}
// Panel tasks per thread and job: enough that dynamic scheduling evens out the
// threads (q/k/v of a 576-wide model are 60 panels: 4 per task on 2 threads).
constexpr int64_t kPanelTasksPerThread = 8;
// The same when every panel serves a single token (decode): the job streams its weight
// bytes, equal bytes take equal time, and each task starts cold (its first panel
// waits on DRAM: the kernels prefetch ahead only within a task, across its targets),
// so fewer, longer tasks. On a 2-core AMD EPYC (AVX2), with the prefetch across
// targets, 2 beat the former 8 by 9-13% on matmul_bench's stream/ cases and 1 was no
// faster than 2; end to end the two were level within that VM's noise.
constexpr int64_t kStreamTasksPerThread = 2;
// Below this many activation values, quantising runs on the calling thread.
constexpr int64_t kParallelQuantizeValues = 1 << 14;

enum class Path { kPacked, kBatched, kRows };

// A piece of a matmul_grouped job: rows [r0, r0 + n_rows) of the target planned at
// plans[target].
struct MatmulSegment {
  int target;
  int64_t r0, n_rows;
};
// One task of the job: segments [first, end) of its list, run in this order. A per-row
// task is one segment; a panel task may run from the end of one target into the
// next, so that a thread streams consecutive matrices, each kernel call prefetching
// the next one's first panel.
struct MatmulTask {
  int64_t first, end;
};

// How one target of a job runs: its group and index there, its kernel path, and its
// packed copy (kPacked).
struct TargetPlan {
  int group, target;
  Path path;
  const uint8_t* packed;
};

// One group's input in the forms its targets need: k, and where its tiles and
// quantised rows sit in the shared activation buffers.
struct GroupInput {
  int64_t k = 0;  // 0: the group has no work
  bool need_tiles = false;
  bool need_rows[kNumActFormats] = {};
  float i8_input_scale = 0.0f;  // kQ8Token rows: the static scale, 0 for per token
  int i8_input_offset = 0;      // and the static zero point
  int64_t tiles_at = 0;
  int64_t tile = 0;  // its tiles' width (q8x32_call_tile)
  int64_t rows_at[kNumActFormats] = {};
  int64_t row_bytes[kNumActFormats] = {};
};

// True if some group has I8 weights whose activations need different static scales.
bool mixed_i8_scales(const MatmulGroup* groups, int n_groups) {
  for (int g = 0; g < n_groups; ++g) {
    const TensorView* first = nullptr;
    for (int i = 0; i < groups[g].n_targets; ++i) {
      const TensorView& w = *groups[g].targets[i].w;
      if (w.dtype != DType::kI8) continue;
      if (first == nullptr) {
        first = &w;
      } else if (w.input_scale != first->input_scale || w.input_offset != first->input_offset) {
        return true;
      }
    }
  }
  return false;
}

// The checks every weight of a group passes; k: the group's row length.
void check_matmul_weight(const TensorView& w, int64_t k) {
  DS_CHECK(w.n_dims() == 2);
  DS_CHECK_MSG(w.shape[1] == k, "matmul_many: weights of row lengths %lld and %lld",
               static_cast<long long>(k), static_cast<long long>(w.shape[1]));
  const int type = static_cast<int>(w.dtype);
  DS_CHECK(type < kNumDTypes);
  DS_CHECK_MSG(w.dtype != DType::kF8_E4M3 || w.block_scales.data != nullptr,
               "matmul: an f8_e4m3 weight without block scales");
  if (w.dtype == DType::kI8) {
    DS_CHECK_MSG(w.row_scales != nullptr, "matmul: an i8 weight without row scales");
  }
}

// Target i of group g, given its weight's packed copy (null: none, or not for this
// call): its kernel path. Marks in `in` the activation form that path reads, and
// takes an I8 weight's static input scale (all of the group's agree: mixed_i8_scales).
TargetPlan plan_target(const KernelTable& kernels, const TensorView& w, int g, int i,
                       const uint8_t* packed, bool batched_ok, GroupInput& in) {
  TargetPlan plan{g, i, Path::kRows, packed};
  if (w.dtype == DType::kI8) {
    in.i8_input_scale = w.input_scale;
    in.i8_input_offset = w.input_offset;
  }
  if (plan.packed != nullptr) {
    plan.path = Path::kPacked;
  } else if (batched_ok && kernels.matmul_batched[static_cast<int>(w.dtype)] != nullptr) {
    plan.path = Path::kBatched;
  }
  // Batched kernels take Q8x32 types' activations in tiles, K-quants' as rows.
  const ActFormat format = act_format_for(w.dtype);
  if (plan.path == Path::kRows || format != ActFormat::kQ8x32) {
    in.need_rows[static_cast<int>(format)] = true;
  } else {
    in.need_tiles = true;
  }
  return plan;
}

// Sizes of the shared activation buffers, summed over the groups placed so far.
struct ActBufferSizes {
  int64_t tile_bytes = 0;
  int64_t rows_bytes[kNumActFormats] = {};
  int64_t total_values = 0;  // input values quantised into them
};

// Places the forms a group's targets need (marked in `in`) in the shared buffers; a
// group's tiles start on a tile boundary of their own. tile: the level's batched tile.
void place_group_input(int64_t tile, int64_t n_tokens, GroupInput& in, ActBufferSizes& sizes) {
  if (in.need_tiles) {
    DS_CHECK(kBatchTokenBlock % tile == 0);
    in.tiles_at = sizes.tile_bytes;
    in.tile = q8x32_call_tile(tile, n_tokens);
    sizes.tile_bytes += q8x32_tiles_bytes(in.k, n_tokens, in.tile);
  }
  for (int fi = 1; fi < kNumActFormats; ++fi) {  // the int8 formats; F32 rows are x itself
    if (!in.need_rows[fi]) continue;
    in.row_bytes[fi] = act_row_bytes(static_cast<ActFormat>(fi), in.k);
    in.rows_at[fi] = sizes.rows_bytes[fi];
    sizes.rows_bytes[fi] += in.row_bytes[fi] * n_tokens;
  }
  if (in.need_tiles || in.need_rows[1] || in.need_rows[2] || in.need_rows[3]) {
    sizes.total_values += n_tokens * in.k;
  }
}

// The shared activation buffers: every group's Q8x32 tiles, and its int8 rows per
// ActFormat (null where no group needs them; F32 rows are the group's x itself).
struct ActBuffers {
  uint8_t* tiles = nullptr;
  uint8_t* quantised[kNumActFormats] = {};
};

// What the targets on the panel paths add up to.
struct PanelWork {
  int64_t total_cost = 0;     // in panels times token tiles
  bool single_token = true;   // every one serves one token (decode)
  bool need_scratch = false;  // some run the batched kernels,
  int64_t max_k = 0;          // whose scratch the largest k of them sizes
};

// Rows per task of a target on the per-row kernels: about 4 tasks per thread, whole
// granules, and at most kMaxTaskWeightBytes of weight (so they stay in L2).
int64_t rows_per_row_task(const TensorView& w, int64_t n_threads) {
  const int64_t n = w.shape[0];
  const int64_t rows_per_task = round_up((n + 4 * n_threads - 1) / (4 * n_threads), kRowGranule);
  return std::min(rows_per_task,
                  std::max(kRowGranule, kMaxTaskWeightBytes / static_cast<int64_t>(w.row_bytes()) /
                                            kRowGranule * kRowGranule));
}

// Rows [r0, r0 + n_rows) of w by the per-row kernel of its type, kTokenBlock tokens a
// call. x: the tokens' activation rows, row_bytes apart; y: [n_tokens, w.shape[0]].
[[gnu::always_inline]] inline void run_rows(const KernelTable& kernels, const TensorView& w,
                                            int64_t r0, int64_t n_rows, const uint8_t* x,
                                            int64_t row_bytes, int64_t k, int64_t n_tokens,
                                            float* y) {
  const int64_t n = w.shape[0];
  const int type = static_cast<int>(w.dtype);
  const int64_t w_stride = static_cast<int64_t>(w.row_bytes());
  const uint8_t* wb = w.row(r0);
  if (w.dtype == DType::kF8_E4M3) {
    const BlockScales scales = w.block_scales.from_row(r0);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
      kernels.matmul_f8(wb, w_stride, scales, x + t0 * row_bytes, row_bytes, k, n_rows,
                        std::min(kTokenBlock, n_tokens - t0), y + t0 * n + r0, n);
    }
    return;
  }
  if (w.dtype == DType::kI8) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
      kernels.matmul_i8(wb, w_stride, w.row_scales + r0, x + t0 * row_bytes, row_bytes, k,
                        n_rows, std::min(kTokenBlock, n_tokens - t0), y + t0 * n + r0, n);
    }
    return;
  }
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
    kernels.matmul[type](wb, w_stride, x + t0 * row_bytes, row_bytes, k, n_rows,
                         std::min(kTokenBlock, n_tokens - t0), y + t0 * n + r0, n);
  }
}

}  // namespace

// One matmul_grouped call, as its steps share it: what step 1 plans, the activations
// step 2 fills, the tasks step 3 makes and runs.
struct CpuBackend::MatmulCall {
  MatmulCall(const MatmulGroup* groups, int n_groups) : groups(groups), n_groups(n_groups) {}

  const MatmulGroup* groups;  // [n_groups]
  int n_groups;
  TargetPlan* plans = nullptr;  // [n_plans]: the targets of the groups with tokens, in order
  int n_plans = 0;
  GroupInput* inputs = nullptr;  // [n_groups]
  ActBufferSizes act_sizes;
  ActBuffers act;
  MatmulTask* tasks = nullptr;        // [n_tasks]
  MatmulSegment* segments = nullptr;  // [n_segments]
  int64_t n_tasks = 0, n_segments = 0;
  bool need_scratch = false;  // as PanelWork: some target runs the batched kernels,
  int64_t max_k = 0;          // and the largest k of those sizes their scratch

  const TensorView& weight(const TargetPlan& p) const {
    return *groups[p.group].targets[p.target].w;
  }
  // A panel's cost: the token tiles of its group (it depends on its tokens, not on
  // which weight it belongs to).
  int64_t token_tiles(const TargetPlan& p, int64_t tile) const {
    const int64_t n = groups[p.group].n_tokens;
    return tile > 0 ? (n + tile - 1) / tile : n;
  }
  // Tokens [begin, end) of group g's input in every form its targets need.
  [[gnu::always_inline]] void quantize_tokens(const KernelTable& kernels, int g, int64_t begin,
                                              int64_t end) const;
  PanelWork panel_work(int64_t tile) const;
  // Every segment but a target's last holds a whole granule or more.
  int64_t max_segments() const {
    int64_t n = 0;
    for (int i = 0; i < n_plans; ++i) n += weight(plans[i]).shape[0] / kRowGranule + 1;
    return n;
  }
  void add_panel_tasks(int64_t cost_per_task, int64_t tile);
  void add_row_tasks(int64_t n_threads);
  // The batched kernels' activations of a group from token t0 on: tiles, or K-quants' /
  // I8's rows (fmt: the weight's ActFormat).
  const uint8_t* batched_x(const GroupInput& in, int fmt, int64_t t0) const {
    if (fmt == static_cast<int>(ActFormat::kQ8x32)) {
      return act.tiles + in.tiles_at + q8x32_tiles_bytes(in.k, t0, in.tile);
    }
    return act.quantised[fmt] + in.rows_at[fmt] + t0 * in.row_bytes[fmt];
  }
  // Where a packed segment's panels start.
  const uint8_t* panels_of(const KernelTable& kernels, const MatmulSegment& s) const {
    const TargetPlan& p = plans[s.target];
    return p.packed + s.r0 / kMatmulPackRows *
                          kernels.packed_layout[static_cast<int>(weight(p).dtype)].panel_bytes(
                              inputs[p.group].k);
  }
  [[gnu::always_inline]] void run_segment(const KernelTable& kernels, const MatmulSegment& seg,
                                          const MatmulSegment* next,
                                          ScratchBuffer& thread_scratch) const;
};

inline void CpuBackend::MatmulCall::quantize_tokens(const KernelTable& kernels, int g,
                                                    int64_t begin, int64_t end) const {
  const GroupInput& in = inputs[g];
  const float* x = groups[g].x;  // [n_tokens, k]
  for (int64_t t = begin; t < end; ++t) {
    const float* xt = x + t * in.k;
    if (in.need_tiles) kernels.quantize_q8x32_tiles(xt, in.k, t, in.tile, act.tiles + in.tiles_at);
    if (in.need_rows[1]) {
      kernels.quantize_q8x32(xt, in.k, act.quantised[1] + in.rows_at[1] + t * in.row_bytes[1]);
    }
    if (in.need_rows[2]) {
      kernels.quantize_q8x256(xt, in.k, act.quantised[2] + in.rows_at[2] + t * in.row_bytes[2]);
    }
    if (in.need_rows[3]) {
      quantize_q8_token(xt, in.k, in.i8_input_scale,
                        act.quantised[3] + in.rows_at[3] + t * in.row_bytes[3], in.i8_input_offset);
    }
  }
}

PanelWork CpuBackend::MatmulCall::panel_work(int64_t tile) const {
  PanelWork work;
  for (int i = 0; i < n_plans; ++i) {
    const TargetPlan& p = plans[i];
    if (p.path == Path::kRows) continue;
    work.total_cost += (weight(p).shape[0] + 15) / 16 * token_tiles(p, tile);
    work.single_token = work.single_token && groups[p.group].n_tokens == 1;
    if (p.path == Path::kBatched) {
      work.need_scratch = true;
      work.max_k = std::max(work.max_k, inputs[p.group].k);
    }
  }
  return work;
}

// All panel targets' panels in order, cut into tasks of about cost_per_task; a task may
// run from one target into the next.
void CpuBackend::MatmulCall::add_panel_tasks(int64_t cost_per_task, int64_t tile) {
  int64_t task_cost = 0;
  for (int i = 0; i < n_plans; ++i) {
    const TargetPlan& p = plans[i];
    if (p.path == Path::kRows) continue;
    const int64_t n = weight(p).shape[0], cost = token_tiles(p, tile);
    for (int64_t r0 = 0; r0 < n;) {
      if (task_cost == 0) tasks[n_tasks] = {n_segments, n_segments};
      const int64_t panels = std::max<int64_t>(1, (cost_per_task - task_cost + cost - 1) / cost);
      const int64_t rows = std::min(panels * kRowGranule, n - r0);
      segments[n_segments++] = {i, r0, rows};
      task_cost += (rows + kRowGranule - 1) / kRowGranule * cost;
      r0 += rows;
      if (task_cost >= cost_per_task) {
        tasks[n_tasks++].end = n_segments;
        task_cost = 0;
      }
    }
  }
  if (task_cost > 0) tasks[n_tasks++].end = n_segments;
}

// Each per-row target in chunks of rows_per_row_task rows, a task each.
void CpuBackend::MatmulCall::add_row_tasks(int64_t n_threads) {
  for (int i = 0; i < n_plans; ++i) {
    const TargetPlan& p = plans[i];
    if (p.path != Path::kRows) continue;
    const TensorView& w = weight(p);
    const int64_t n = w.shape[0], rows_per_task = rows_per_row_task(w, n_threads);
    for (int64_t r0 = 0; r0 < n; r0 += rows_per_task) {
      tasks[n_tasks++] = {n_segments, n_segments + 1};
      segments[n_segments++] = {i, r0, std::min(rows_per_task, n - r0)};
    }
  }
}

// Rows [seg.r0, seg.r0 + seg.n_rows) of one target; `next`: the segment this thread
// runs after it, or null; thread_scratch: the running thread's (the batched kernels
// repack weight rows into it).
inline void CpuBackend::MatmulCall::run_segment(const KernelTable& kernels,
                                                const MatmulSegment& seg,
                                                const MatmulSegment* next,
                                                ScratchBuffer& thread_scratch) const {
  const TargetPlan& plan = plans[seg.target];
  const MatmulGroup& group = groups[plan.group];
  const GroupInput& in = inputs[plan.group];
  const MatmulTarget& target = group.targets[plan.target];
  const TensorView& w = *target.w;
  const int64_t n = w.shape[0], k = in.k, n_tokens = group.n_tokens;
  float* y = target.y;  // [n_tokens, n]
  const int type = static_cast<int>(w.dtype);
  const int fmt = static_cast<int>(act_format_for(w.dtype));
  switch (plan.path) {
    case Path::kPacked: {
      const uint8_t* panels = panels_of(kernels, seg);
      const uint8_t* next_panels = next != nullptr && plans[next->target].path == Path::kPacked
                                       ? panels_of(kernels, *next)
                                       : nullptr;
      for (int64_t t0 = 0, count = 0; t0 < n_tokens; t0 += count) {
        count = batch_call_tokens(n_tokens, t0);
        const bool last = t0 + count >= n_tokens;
        kernels.matmul_packed[type](panels, batched_x(in, fmt, t0), k, seg.n_rows, count,
                                    y + t0 * n + seg.r0, n, last ? next_panels : nullptr);
      }
      break;
    }
    case Path::kBatched: {
      uint8_t* scratch =
          thread_scratch.get(static_cast<size_t>(matmul_batched_scratch_bytes(max_k)));
      const int64_t w_stride = static_cast<int64_t>(w.row_bytes());
      const uint8_t* wb = w.row(seg.r0);
      for (int64_t t0 = 0, count = 0; t0 < n_tokens; t0 += count) {
        count = batch_call_tokens(n_tokens, t0);
        kernels.matmul_batched[type](wb, w_stride, batched_x(in, fmt, t0), k, seg.n_rows, count,
                                     y + t0 * n + seg.r0, n, scratch);
      }
      break;
    }
    case Path::kRows: {
      const uint8_t* rows = fmt == 0 ? reinterpret_cast<const uint8_t*>(group.x)
                                     : act.quantised[fmt] + in.rows_at[fmt];
      const int64_t row_bytes = fmt == 0 ? k * 4 : in.row_bytes[fmt];
      run_rows(kernels, w, seg.r0, seg.n_rows, rows, row_bytes, k, n_tokens, y);
      break;
    }
  }
}

const uint8_t* CpuBackend::packed_for(const TensorView& w) const {
  if (packed_.empty()) return nullptr;
  const auto it = packed_.find(w.data);
  if (it == packed_.end()) return nullptr;
  const PackedWeight& p = it->second;
  if (p.dtype != w.dtype || w.n_dims() != 2 || p.n_rows != w.shape[0] || p.k != w.shape[1] ||
      p.row_scales != w.row_scales) {
    return nullptr;
  }
  return p.panels;
}

bool CpuBackend::prepare_matmul_weight(const TensorView& w) {
  const int type = static_cast<int>(w.dtype);
  if (w.n_dims() != 2 || type >= kNumDTypes) return false;
  const bool is_i8 = w.dtype == DType::kI8;
  if (is_i8 ? kernels_.pack_i8 == nullptr || w.row_scales == nullptr
            : kernels_.pack_weight[type] == nullptr) {
    return false;
  }
  const int64_t n = w.shape[0], k = w.shape[1];
  if (n == 0 || k % 32 != 0) return false;
  const int64_t panel_bytes = kernels_.packed_layout[type].panel_bytes(k);
  const int64_t n_panels = (n + kMatmulPackRows - 1) / kMatmulPackRows;
  PackedWeight p{w.dtype, n, k, w.row_scales, ScratchBuffer(), nullptr, 0};
  uint8_t* out = p.storage.get(static_cast<size_t>(n_panels * panel_bytes));
  p.panels = out;
  const size_t w_stride = w.row_bytes();
  pool_.parallel_for(n_panels, 1, [&](int64_t begin, int64_t end, int) {
    const int64_t r0 = begin * kMatmulPackRows;
    const int64_t rows = std::min(n, end * kMatmulPackRows) - r0;
    if (is_i8) {
      kernels_.pack_i8(w.row(r0), w_stride, w.row_scales + r0, rows, k, out + begin * panel_bytes);
    } else {
      kernels_.pack_weight[type](w.row(r0), w_stride, rows, k, out + begin * panel_bytes);
    }
  });
  if (auto old = packed_.find(w.data); old != packed_.end()) {  // prepared again: replaced
    prepared_bytes_ -= old->second.bytes;
    packed_.erase(old);
  }
  p.bytes = n_panels * panel_bytes;
  prepared_bytes_ += p.bytes;
  packed_.emplace(w.data, std::move(p));
  // plan_matmul takes the copy for every call that has a packed kernel: all token
  // counts for I8, the batched ones for the other types.
  return kernels_.matmul_packed[type] != nullptr &&
         (is_i8 || kernels_.matmul_batched_min_tokens <= 1);
}

void CpuBackend::matmul(const TensorView& w, const TensorView* bias, const float* x,
                        int64_t n_tokens, float* y) {
  const MatmulTarget target{&w, bias, y};
  matmul_many(x, n_tokens, &target, 1);
}

void CpuBackend::matmul_many(const float* x, int64_t n_tokens, const MatmulTarget* targets,
                             int n_targets) {
  const MatmulGroup group{x, n_tokens, targets, n_targets};
  matmul_grouped(&group, 1);
}

void CpuBackend::matmul_grouped(const MatmulGroup* groups, int n_groups) {
  if (mixed_i8_scales(groups, n_groups)) {  // rare: each target with its own activations
    for (int g = 0; g < n_groups; ++g) {
      for (int i = 0; i < groups[g].n_targets; ++i) {
        const MatmulGroup one{groups[g].x, groups[g].n_tokens, &groups[g].targets[i], 1};
        matmul_grouped(&one, 1);
      }
    }
    return;
  }
  MatmulCall call(groups, n_groups);
  if (!plan_matmul(call)) return;  // no group has tokens
  quantize_matmul_inputs(call);
  split_matmul_job(call);
  run_matmul_job(call);
  add_matmul_biases(call);
}

// 1. Each target's path; each group's activation forms, with their places in the
// shared buffers.
bool CpuBackend::plan_matmul(MatmulCall& call) {
  int n_all = 0;
  for (int g = 0; g < call.n_groups; ++g) {
    if (call.groups[g].n_tokens > 0) n_all += call.groups[g].n_targets;
  }
  if (n_all == 0) return false;
  // One buffer: the target plans, then the group inputs (both 8-byte aligned).
  uint8_t* plan_memory = matmul_plan_.get(static_cast<size_t>(n_all) * sizeof(TargetPlan) +
                                          static_cast<size_t>(call.n_groups) * sizeof(GroupInput));
  call.plans = reinterpret_cast<TargetPlan*>(plan_memory);
  call.inputs = reinterpret_cast<GroupInput*>(plan_memory +
                                              static_cast<size_t>(n_all) * sizeof(TargetPlan));
  for (int g = 0; g < call.n_groups; ++g) {
    const MatmulGroup& group = call.groups[g];
    GroupInput& in = call.inputs[g];
    in = GroupInput{};
    if (group.n_tokens <= 0 || group.n_targets <= 0) continue;
    in.k = group.targets[0].w->row_length();
    const bool batched_ok = group.n_tokens >= kernels_.matmul_batched_min_tokens;
    for (int i = 0; i < group.n_targets; ++i) {
      const TensorView& w = *group.targets[i].w;
      check_matmul_weight(w, in.k);
      // I8's packed kernel serves every token count (no separate batched kernel).
      const bool packed_ok = (batched_ok || w.dtype == DType::kI8) &&
                             kernels_.matmul_packed[static_cast<int>(w.dtype)] != nullptr;
      call.plans[call.n_plans++] =
          plan_target(kernels_, w, g, i, packed_ok ? packed_for(w) : nullptr, batched_ok, in);
    }
    place_group_input(kernels_.matmul_batched_tile, group.n_tokens, in, call.act_sizes);
  }
  return true;
}

// 2. The activations in those forms, quantised once for all the group's targets.
void CpuBackend::quantize_matmul_inputs(MatmulCall& call) {
  const ActBufferSizes& sizes = call.act_sizes;
  if (sizes.tile_bytes > 0) call.act.tiles = act_tiles_.get(static_cast<size_t>(sizes.tile_bytes));
  for (int fi = 1; fi < kNumActFormats; ++fi) {
    if (sizes.rows_bytes[fi] > 0) {
      call.act.quantised[fi] = act_rows_[fi].get(static_cast<size_t>(sizes.rows_bytes[fi]));
    }
  }
  if (sizes.total_values == 0) return;
  const MatmulGroup* groups = call.groups;
  if (sizes.total_values < kParallelQuantizeValues) {
    for (int g = 0; g < call.n_groups; ++g) {
      if (call.inputs[g].k > 0) call.quantize_tokens(kernels_, g, 0, groups[g].n_tokens);
    }
    return;
  }
  // Units of whole tiles (a tile's tokens share cache lines, 4 bytes each per
  // group, and two threads writing one line would pass it back and forth).
  const int64_t unit = std::max<int64_t>(kernels_.matmul_batched_tile, 8);
  int64_t n_units = 0;
  for (int g = 0; g < call.n_groups; ++g) n_units += (groups[g].n_tokens + unit - 1) / unit;
  pool_.parallel_for(n_units, 1, [&](int64_t begin, int64_t end, int) {
    int64_t first = 0;  // units before group g
    for (int g = 0; g < call.n_groups && begin < end; ++g) {
      const int64_t n_g = groups[g].n_tokens > 0 ? (groups[g].n_tokens + unit - 1) / unit : 0;
      const int64_t lo = std::max(begin, first), hi = std::min(end, first + n_g);
      if (lo < hi && call.inputs[g].k > 0) {
        call.quantize_tokens(kernels_, g, (lo - first) * unit,
                             std::min(groups[g].n_tokens, (hi - first) * unit));
      }
      first += n_g;
    }
  });
}

// 3. Row chunks of every target, one job. Panel paths: all targets' panels in order,
// cut into tasks of about equal cost (a task may span targets). Per-row kernels:
// chunks of one target that stay in L2.
void CpuBackend::split_matmul_job(MatmulCall& call) {
  const int64_t n_threads = pool_.n_threads();
  const int64_t tile = kernels_.matmul_batched_tile;
  const PanelWork work = call.panel_work(tile);
  call.need_scratch = work.need_scratch;
  call.max_k = work.max_k;
  const int64_t tasks_per_thread = work.single_token ? kStreamTasksPerThread : kPanelTasksPerThread;
  const int64_t cost_per_task = std::max<int64_t>(
      1, (work.total_cost + tasks_per_thread * n_threads - 1) / (tasks_per_thread * n_threads));
  // One buffer: the tasks (at most one per segment), then the segments.
  const int64_t max_segments = call.max_segments();
  static_assert(sizeof(MatmulTask) % alignof(MatmulSegment) == 0);
  call.tasks = reinterpret_cast<MatmulTask*>(matmul_tasks_.get(
      static_cast<size_t>(max_segments) * (sizeof(MatmulTask) + sizeof(MatmulSegment))));
  call.segments = reinterpret_cast<MatmulSegment*>(call.tasks + max_segments);
  call.add_panel_tasks(cost_per_task, tile);
  call.add_row_tasks(n_threads);
}

// Runs the job over the pool: each task's segments in order, on one thread.
void CpuBackend::run_matmul_job(const MatmulCall& call) {
  if (call.need_scratch) {
    const auto scratch_bytes = static_cast<size_t>(matmul_batched_scratch_bytes(call.max_k));
    for (auto& buf : per_thread_) buf.get(scratch_bytes);  // no allocation inside tasks
  }
  pool_.run(call.n_tasks, [&](int64_t task_index, int thread) {
    const MatmulTask& task = call.tasks[task_index];
    for (int64_t s = task.first; s < task.end; ++s) {
      call.run_segment(kernels_, call.segments[s],
                       s + 1 < task.end ? &call.segments[s + 1] : nullptr, per_thread_[thread]);
    }
  });
}

// 4. Biases: I8 weights' own (TensorView::row_bias), then the layer's.
void CpuBackend::add_matmul_biases(const MatmulCall& call) {
  for (int i = 0; i < call.n_plans; ++i) {
    const MatmulGroup& group = call.groups[call.plans[i].group];
    const MatmulTarget& target = group.targets[call.plans[i].target];
    const int64_t n = target.w->shape[0];
    if (target.w->dtype == DType::kI8 && target.w->row_bias != nullptr) {
      for (int64_t t = 0; t < group.n_tokens; ++t) {
        kernels_.add_f32(target.y + t * n, target.w->row_bias, n);
      }
    }
    if (target.bias == nullptr) continue;
    DS_CHECK(target.bias->n_elements() == n);
    const float* b = as_f32(*target.bias, param_);
    for (int64_t t = 0; t < group.n_tokens; ++t) {
      kernels_.add_f32(target.y + t * n, b, n);
    }
  }
}

}  // namespace dserve::cpu
