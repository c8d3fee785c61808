// CpuBackend's paged KV cache ops: kv_store / kv_gather (row copies between a dense
// batch and pool slots) and paged_attention (causal GQA for a ragged batch of tokens
// from several sequences, each reading its keys and values through its block table).
//
// The pools hold F32 or F16 (IEEE half) elements: kv_store rounds to nearest even,
// kv_gather and the attention kernels convert back exactly and compute in FP32; the
// tiling and the order of every operation are the same for both, so an F16 pool
// gives the same bits as an F32 pool holding the same values.
//
// paged_attention: one pass over the keys with an online softmax, no gather copy.
// A tile is a set of up to 16 queries that share a KV head (the GQA group of a decode
// token, or a few consecutive tokens of a prefill chunk times their group). The tiles
// of one KV head and run of tokens (a group: one tile for Llama's GQA, eight for
// DeepSeek's 128 heads over one latent) walk their sequence's block table together and
// hand each run of consecutive slots to the kernel table's attn_step_f32 / _f16 / _f8
// (kernels.h) for each tile in turn, so each K/V row is read from memory once per
// group; a group of several tiles converts a step's F16 / F8 rows to floats once and
// runs the float step on them (the same bits: the converting steps convert exactly).
// paged_latent_attention is the same over MLA's latent pool, the values only the
// first v_dim of each row. Over an FP8 latent pool on a CPU with AVX512-BF16 a group's
// steps convert their rows once more, to BF16 layouts, and run attn_step_bf16 (BF16
// products, twice the multiply-adds per instruction; kernels_avx512_bf16.cc says what
// rounds and why only FP8): the one exception to "the same bits as an F32 pool".
//
// Batch invariance: a token's output is bit-for-bit the same whatever else is in the
// batch and however many threads run it (the engine relies on this: a request gives
// the same tokens alone and in a full batch). So every query's arithmetic depends
// only on its own position: keys are processed in fixed splits of kSplitKeys
// positions, each split in fixed steps (block boundaries and kKeyStep), with its own
// softmax state, and the split states are folded in order by one function. Whether
// a tile's splits run in one task (many tiles) or as parallel tasks merged
// afterwards (few tiles, long contexts) changes only the schedule.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "base/check.h"
#include "tensor/half.h"

namespace dserve::cpu {
namespace {

// Below this many elements a row copy runs on the calling thread.
constexpr int64_t kParallelCopyElems = 1 << 15;

// Most queries in one tile (its state lives in scratch), and most keys per kernel
// step: 32 rows of K and V of a 128-dim head are 32 KiB, which stay in L1 / L2 while
// every query of the tile reads them.
constexpr int kMaxQueries = 16;
constexpr int64_t kKeyStep = 32;

// Keys per split (a multiple of kKeyStep). Folding a split costs about v_dim per
// query, nothing next to its kSplitKeys * (head_dim + v_dim).
constexpr int64_t kSplitKeys = 256;

// Most floats of split state kept for a merge pass; beyond it the splits of a tile
// run in one task (one thread). One DeepSeek-R1 decode at 128K context keeps 8 tiles x
// 512 splits x (2 x 16 + 16 x 512) floats, 135 MB: under this bound, so a lone long
// sequence still spreads over the threads (at 1 << 23 a 32K one ran on one thread, at
// half the attention rate of two).
constexpr int64_t kMaxPartialFloats = int64_t{1} << 26;

// Prefetches n rows of `len` bytes, `stride` bytes apart: every cache line each row
// touches, into L2 (into L1 they would hold the core's few fill buffers, which the
// kernel's own loads then wait for: on a Zen 4 core the default model's decode at
// depth 512-640, 1 thread, ran at 99-109 tokens/s with L1 prefetches, 134-145 with L2).
inline void prefetch_rows(const char* p, int64_t stride, int64_t len, int64_t n) {
  constexpr uintptr_t kLine = 64;
  for (int64_t j = 0; j < n; ++j, p += stride) {
    const uintptr_t last = reinterpret_cast<uintptr_t>(p + len - 1);
    for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1); a <= last; a += kLine) {
      __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2);  // 2: _MM_HINT_T1
    }
  }
}

// Bytes of one pool element; CHECKs that the backend reads this KV dtype.
int64_t kv_elem_bytes(DType kv_dtype) {
  DS_CHECK_MSG(kv_dtype == DType::kF32 || kv_dtype == DType::kF16 ||
                   kv_dtype == DType::kF8_E4M3,
               "paged KV cache of %s: only f32, f16 and f8_e4m3 are supported",
               std::string(dtype_name(kv_dtype)).c_str());
  return kv_dtype == DType::kF32 ? 4 : kv_dtype == DType::kF16 ? 2 : 1;
}

// Online-softmax state of up to kMaxQueries queries, in one float array:
// m [kMaxQueries], l [kMaxQueries], acc [kMaxQueries, v_dim].
struct SoftmaxState {
  float* m;
  float* l;
  float* acc;
  int v_dim;

  static int64_t floats(int v_dim) { return 2 * kMaxQueries + int64_t{kMaxQueries} * v_dim; }
  static SoftmaxState at(float* p, int v_dim) {
    return {p, p + kMaxQueries, p + 2 * kMaxQueries, v_dim};
  }
  // No keys seen: m = -inf, l = 0, acc = 0.
  void clear(int n_q) const {
    std::fill_n(m, n_q, -INFINITY);
    std::fill_n(l, n_q, 0.0f);
    std::fill_n(acc, static_cast<size_t>(n_q) * v_dim, 0.0f);
  }
  // Folds `s` (a later split) into this state: with M = max(m, s.m),
  // l = l e^(m - M) + s.l e^(s.m - M), acc likewise. Folding into a cleared state
  // copies s exactly; a query s saw no key of is left as it is.
  void fold(const SoftmaxState& s, int n_q, const KernelTable& k) const {
    for (int i = 0; i < n_q; ++i) {
      if (s.l[i] == 0.0f) continue;
      const float mx = std::fmax(m[i], s.m[i]);  // finite: s saw a key
      const float a = std::exp(m[i] - mx), b = std::exp(s.m[i] - mx);
      float* dst = acc + int64_t{i} * v_dim;
      k.scale_f32(a, dst, v_dim);
      k.axpy_f32(b, s.acc + int64_t{i} * v_dim, dst, v_dim);
      l[i] = l[i] * a + s.l[i] * b;
      m[i] = mx;
    }
  }
};

// The scores of one step: a row of kKeyStep (a multiple of 4, as AttnStepArgs::scores
// asks) per query.
constexpr int64_t kScoreFloats = kMaxQueries * kKeyStep;

// The checks of a batch's sequences, positions and block tables.
void check_paged_batch(const PagedBatch& batch) {
  DS_CHECK(batch.block_size > 0);
  const int64_t bs = batch.block_size;
  for (int64_t t = 0; t < batch.n_tokens; ++t) {
    const int32_t s = batch.seq_of_token[t];
    DS_CHECK_MSG(s >= 0 && s < batch.n_seqs, "token %lld: sequence %d out of range",
                 static_cast<long long>(t), s);
    const int64_t n_blocks = batch.block_table_offsets[s + 1] - batch.block_table_offsets[s];
    DS_CHECK_MSG(batch.positions[t] >= 0 && batch.positions[t] < n_blocks * bs,
                 "token %lld: position %d beyond its block table (%lld blocks of %lld)",
                 static_cast<long long>(t), batch.positions[t], static_cast<long long>(n_blocks),
                 static_cast<long long>(bs));
  }
  for (int64_t s = 0; s < batch.n_seqs; ++s) {
    for (int64_t i = batch.block_table_offsets[s]; i < batch.block_table_offsets[s + 1]; ++i) {
      DS_CHECK_MSG(batch.block_tables[i] >= 0, "sequence %lld: negative block id %d",
                   static_cast<long long>(s), batch.block_tables[i]);
    }
  }
}

}  // namespace

void CpuBackend::kv_store(DType kv_dtype, void* pool, int64_t row, const float* x,
                          const int64_t* slots, int64_t n) {
  const int64_t elem = kv_elem_bytes(kv_dtype);
  for (int64_t i = 0; i < n; ++i) {
    DS_CHECK_MSG(slots[i] >= 0, "negative KV slot %lld", static_cast<long long>(slots[i]));
  }
  char* base = static_cast<char*>(pool);
  auto rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      char* dst = base + slots[i] * row * elem;
      if (kv_dtype == DType::kF16) {
        kernels_.f32_to_f16_row(x + i * row, reinterpret_cast<uint16_t*>(dst), row);
      } else if (kv_dtype == DType::kF8_E4M3) {
        uint8_t* out = reinterpret_cast<uint8_t*>(dst);
        for (int64_t e = 0; e < row; ++e) out[e] = f32_to_fp8_e4m3(x[i * row + e]);
      } else {
        std::memcpy(dst, x + i * row, static_cast<size_t>(row) * sizeof(float));
      }
    }
  };
  if (n * row < kParallelCopyElems) {
    rows(0, n, 0);
  } else {
    pool_.parallel_for(n, 1, rows);
  }
}

void CpuBackend::kv_gather(DType kv_dtype, const void* pool, int64_t row, const int64_t* slots,
                           int64_t n, float* out) {
  const int64_t elem = kv_elem_bytes(kv_dtype);
  for (int64_t i = 0; i < n; ++i) {
    DS_CHECK_MSG(slots[i] >= 0, "negative KV slot %lld", static_cast<long long>(slots[i]));
  }
  const char* base = static_cast<const char*>(pool);
  auto rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const char* src = base + slots[i] * row * elem;
      if (kv_dtype == DType::kF16) {
        kernels_.f16_to_f32_row(reinterpret_cast<const uint16_t*>(src), out + i * row, row);
      } else if (kv_dtype == DType::kF8_E4M3) {
        const uint8_t* in = reinterpret_cast<const uint8_t*>(src);
        for (int64_t e = 0; e < row; ++e) out[i * row + e] = fp8_e4m3_to_f32(in[e]);
      } else {
        std::memcpy(out + i * row, src, static_cast<size_t>(row) * sizeof(float));
      }
    }
  };
  if (n * row < kParallelCopyElems) {
    rows(0, n, 0);
  } else {
    pool_.parallel_for(n, 1, rows);
  }
}

// One paged_attention call: its inputs and shapes, its tiles, and the work on one
// group of tiles.
struct CpuBackend::PagedAttentionCall {
  const KernelTable& kernels;
  const float* q;       // [n_tokens, n_heads, head_dim]
  const char* k_pool;   // [n_slots, k_stride] elements of the KV dtype
  const char* v_pool;   // [n_slots, v_stride]
  float* out;           // [n_tokens, n_heads, v_dim]
  const PagedBatch& batch;
  void (*attn_step)(const AttnStepArgs&);  // the kernel for the KV dtype
  void (*to_f32_row)(const char* x, float* out, int64_t n, const KernelTable& k);  // or null
  void (*attn_step_bf16)(const AttnStepArgs&);  // FP8 pools, where the CPU has it; or null
  int64_t elem;                            // bytes of a KV element
  int n_heads, n_kv_heads, group, head_dim, v_dim;
  float scale;
  int64_t k_stride, v_stride;  // elements between slots of the pools
  int64_t state_floats;        // SoftmaxState::floats(v_dim)
  Tile* tiles = nullptr;       // [n_tiles], from plan_tiles
  int64_t n_tiles = 0;
  int64_t longest = 0;  // the most keys any tile reads

  // Tiles: a run of up to max_run consecutive batch tokens of one sequence times up to
  // kMaxQueries / run heads of one KV group. A group of tiles: those of one run of
  // tokens and one KV head (consecutive in tiles), which read the same K/V rows.
  int heads_per_tile() const { return std::min(group, kMaxQueries); }
  int64_t tiles_per_group() const { return (group + heads_per_tile() - 1) / heads_per_tile(); }
  int64_t max_tiles() const { return batch.n_tokens * n_kv_heads * tiles_per_group(); }
  int64_t n_groups() const { return n_tiles / tiles_per_group(); }
  // Fills tiles (storage: max_tiles() of them), n_tiles and longest.
  void plan_tiles(Tile* storage);

  // Whether a group's steps convert their K/V rows to floats once for all its tiles
  // (and run the float step on them) rather than each tile converting as it loads.
  // The float step on exactly converted rows gives the converting step's bits.
  bool converts() const { return to_f32_row != nullptr && tiles_per_group() > 1; }
  // Values read from the keys' own converted rows: MLA's latent pool, keys and values
  // one row.
  bool values_in_keys() const {
    return k_pool == v_pool && k_stride == v_stride && n_kv_heads == 1 && v_dim <= head_dim;
  }
  // MLA over FP8 latents with BF16 products (kernels_avx512_bf16.cc): a group's steps
  // convert their rows to floats and then to the BF16 layouts, queries once per split.
  bool bf16() const { return attn_step_bf16 != nullptr && converts() && values_in_keys(); }
  int64_t k_bf16_stride() const { return (head_dim + 31) / 32 * 32; }  // elements
  int64_t v_bf16_stride() const { return (v_dim + 15) / 16 * 16; }     // 32-bit words
  // Floats of per-thread scratch: the scores of one step and, when converting, the
  // step's rows (and their BF16 forms with the group's BF16 queries).
  int64_t scratch_floats() const {
    if (!converts()) return kScoreFloats;
    const int64_t rows = kKeyStep * (head_dim + (values_in_keys() ? 0 : v_dim));
    if (!bf16()) return kScoreFloats + rows;
    return kScoreFloats + rows + bf16_floats();
  }
  // The BF16 part: keys [kKeyStep, k_bf16_stride] and queries [tiles_per_group x
  // kMaxQueries, k_bf16_stride] as halves, value pairs [kKeyStep / 2, v_bf16_stride].
  int64_t bf16_floats() const {
    return (kKeyStep + tiles_per_group() * kMaxQueries) * k_bf16_stride() / 2 +
           kKeyStep / 2 * v_bf16_stride();
  }

  void run_group_split(int64_t g, int64_t split, float* states, int64_t state_stride,
                       float* scratch) const;
  [[gnu::always_inline]] void finish(const Tile& tile, const SoftmaxState& st) const;
};

void CpuBackend::PagedAttentionCall::plan_tiles(Tile* storage) {
  tiles = storage;
  const int per_tile = heads_per_tile();
  const int64_t max_run = std::max(1, kMaxQueries / per_tile);
  for (int64_t t = 0; t < batch.n_tokens;) {
    int64_t end = t + 1, max_ctx = int64_t{batch.positions[t]} + 1;
    while (end < batch.n_tokens && end - t < max_run &&
           batch.seq_of_token[end] == batch.seq_of_token[t]) {
      max_ctx = std::max(max_ctx, int64_t{batch.positions[end]} + 1);
      ++end;
    }
    longest = std::max(longest, max_ctx);
    for (int kvh = 0; kvh < n_kv_heads; ++kvh) {
      for (int h = 0; h < group; h += per_tile) {
        tiles[n_tiles++] = {t, static_cast<int>(end - t), kvh * group + h,
                            std::min(per_tile, group - h), max_ctx};
      }
    }
    t = end;
  }
}

// Runs split `split` of the tiles of group g into states (one SoftmaxState per tile,
// state_stride floats apart; cleared first); scratch: scratch_floats(). Every tile takes the
// same steps over the same rows in the same order as it would alone, so its bits do
// not depend on its group.
// The key loop stays in this function: moved to an always_inline helper, GCC 12 -O3
// dropped prefetch_rows' prefetches.
void CpuBackend::PagedAttentionCall::run_group_split(int64_t g, int64_t split, float* states,
                                                     int64_t state_stride,
                                                     float* scratch) const {
  const int64_t n_group_tiles = tiles_per_group();
  const Tile* gt = tiles + g * n_group_tiles;
  for (int64_t ti = 0; ti < n_group_tiles; ++ti) {
    SoftmaxState::at(states + ti * state_stride, v_dim).clear(gt[ti].n_tokens * gt[ti].n_heads);
  }
  const int64_t begin = split * kSplitKeys;
  const int64_t end = std::min(begin + kSplitKeys, gt[0].max_ctx);
  if (begin >= end) return;
  const int kvh = gt[0].h0 / group;
  const int64_t bs = batch.block_size;
  const int32_t* table =
      batch.block_tables + batch.block_table_offsets[batch.seq_of_token[gt[0].t0]];
  float* scores = scratch;
  float* k_rows = scratch + kScoreFloats;  // converted rows [kKeyStep, head_dim]
  float* v_rows = values_in_keys() ? k_rows : k_rows + kKeyStep * head_dim;
  const bool convert = converts();
  const bool use_bf16 = bf16();
  // BF16 scratch after the float rows: value pairs, keys, then the group's queries.
  uint32_t* v_bf16 = reinterpret_cast<uint32_t*>(k_rows + kKeyStep * head_dim);
  uint16_t* k_bf16 = reinterpret_cast<uint16_t*>(v_bf16 + kKeyStep / 2 * v_bf16_stride());
  uint16_t* q_bf16 = k_bf16 + kKeyStep * k_bf16_stride();
  if (use_bf16) {
    for (int64_t ti = 0; ti < n_group_tiles; ++ti) {
      const Tile& tile = gt[ti];
      for (int i = 0; i < tile.n_tokens * tile.n_heads; ++i) {
        const int64_t t = tile.t0 + i / tile.n_heads;
        kernels.f32_to_bf16_padded(q + (t * n_heads + tile.h0 + i % tile.n_heads) * head_dim,
                                   head_dim, static_cast<int>(k_bf16_stride()),
                                   q_bf16 + (ti * kMaxQueries + i) * k_bf16_stride());
      }
    }
  }

  // Steps end at block boundaries, every kKeyStep keys inside a block, and at `end`
  // (which cuts only the last step of the tile's last query; the kernel cuts the
  // others at n_visible). A step's rows are prefetched one step ahead: blocks are
  // scattered, and a head's slice of a slot is only part of the row, so the hardware
  // prefetcher cannot follow on its own.
  auto step_at = [&](int64_t p0, int64_t* slot) {
    *slot = int64_t{table[p0 / bs]} * bs + p0 % bs;
    return std::min({kKeyStep, bs - p0 % bs, end - p0});
  };
  // This KV head's part of slot 0, in bytes (elements of kv_dtype).
  const char* k_head = k_pool + int64_t{kvh} * head_dim * elem;
  const char* v_head = v_pool + int64_t{kvh} * v_dim * elem;
  const float* q_rows[kMaxQueries];  // query i: token t0 + i / n_heads, head h0 + i % n_heads
  const uint16_t* q_bf16_rows[kMaxQueries];  // the same in BF16 (use_bf16)
  int64_t n_visible[kMaxQueries];    // keys of the current step query i sees
  int64_t slot = 0;
  int64_t n_keys = step_at(begin, &slot);
  for (int64_t p0 = begin; p0 < end;) {
    const int64_t p1 = p0 + n_keys;
    int64_t next_slot = 0, next_n_keys = 0;
    if (p1 < end) {
      next_n_keys = step_at(p1, &next_slot);
      prefetch_rows(k_head + next_slot * k_stride * elem, k_stride * elem, head_dim * elem,
                    next_n_keys);
      if (!values_in_keys()) {
        prefetch_rows(v_head + next_slot * v_stride * elem, v_stride * elem, v_dim * elem,
                      next_n_keys);
      }
    }
    AttnStepArgs args{};
    args.q = q_rows;
    args.q_bf16 = q_bf16_rows;
    args.n_visible = n_visible;
    args.n_keys = n_keys;
    args.head_dim = head_dim;
    args.v_dim = v_dim;
    args.scale = scale;
    args.scores = scores;
    void (*step)(const AttnStepArgs&) = attn_step;
    const char* k_src = k_head + slot * k_stride * elem;
    const char* v_src = v_head + slot * v_stride * elem;
    if (convert) {
      for (int64_t j = 0; j < n_keys; ++j) {
        to_f32_row(k_src + j * k_stride * elem, k_rows + j * head_dim, head_dim, kernels);
        if (!values_in_keys()) {
          to_f32_row(v_src + j * v_stride * elem, v_rows + j * v_dim, v_dim, kernels);
        }
      }
      step = kernels.attn_step_f32;
      args.k = k_rows;
      args.v = v_rows;
      args.k_stride = head_dim;
      args.v_stride = values_in_keys() ? head_dim : v_dim;
      if (use_bf16) {
        kernels.attn_rows_to_bf16(k_rows, n_keys, head_dim, v_dim, k_bf16, k_bf16_stride(),
                                  v_bf16, v_bf16_stride());
        step = attn_step_bf16;
        args.k = k_bf16;
        args.v = v_bf16;
        args.k_stride = k_bf16_stride();
        args.v_stride = v_bf16_stride();
      }
    } else {
      args.k = k_src;
      args.v = v_src;
      args.k_stride = k_stride;
      args.v_stride = v_stride;
    }
    for (int64_t ti = 0; ti < n_group_tiles; ++ti) {
      const Tile& tile = gt[ti];
      const int n_q = tile.n_tokens * tile.n_heads;
      for (int i = 0; i < n_q; ++i) {
        const int64_t t = tile.t0 + i / tile.n_heads;
        q_rows[i] = q + (t * n_heads + tile.h0 + i % tile.n_heads) * head_dim;
        q_bf16_rows[i] = q_bf16 + (ti * kMaxQueries + i) * k_bf16_stride();
        n_visible[i] = int64_t{batch.positions[t]} + 1 - p0;
      }
      const SoftmaxState st = SoftmaxState::at(states + ti * state_stride, v_dim);
      args.n_q = n_q;
      args.m = st.m;
      args.l = st.l;
      args.acc = st.acc;
      step(args);
    }
    p0 = p1;
    slot = next_slot;
    n_keys = next_n_keys;
  }
}

// out rows of a tile's queries from their folded state (l >= 1: each query's
// largest score contributes exp(0)).
inline void CpuBackend::PagedAttentionCall::finish(const Tile& tile,
                                                   const SoftmaxState& st) const {
  for (int i = 0; i < tile.n_tokens * tile.n_heads; ++i) {
    const int64_t t = tile.t0 + i / tile.n_heads;
    float* o = out + (t * n_heads + tile.h0 + i % tile.n_heads) * v_dim;  // [v_dim]
    const float inv = 1.0f / st.l[i];
    const float* a = st.acc + int64_t{i} * v_dim;
    for (int d = 0; d < v_dim; ++d) o[d] = a[d] * inv;
  }
}

namespace {

// Row conversions to floats for a group's shared steps, per KV dtype.
void f16_rows(const char* x, float* out, int64_t n, const KernelTable& k) {
  k.f16_to_f32_row(reinterpret_cast<const uint16_t*>(x), out, n);
}
void f8_rows(const char* x, float* out, int64_t n, const KernelTable& k) {
  k.f8_to_f32_row(reinterpret_cast<const KvF8*>(x), out, n);
}

}  // namespace

void CpuBackend::paged_attention(const float* q, DType kv_dtype, const void* k_pool,
                                 const void* v_pool, float* out, const PagedBatch& batch,
                                 int n_heads, int n_kv_heads, int head_dim, int v_dim,
                                 float scale) {
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  run_paged_attention(q, kv_dtype, k_pool, v_pool, out, batch, n_heads, n_kv_heads, head_dim,
                      v_dim, int64_t{n_kv_heads} * head_dim, int64_t{n_kv_heads} * v_dim, scale);
}

void CpuBackend::paged_latent_attention(const float* q, DType kv_dtype, const void* pool,
                                        float* out, const PagedBatch& batch, int n_heads,
                                        int latent_dim, int v_dim, float scale) {
  DS_CHECK(n_heads > 0 && v_dim > 0 && v_dim <= latent_dim);
  run_paged_attention(q, kv_dtype, pool, pool, out, batch, n_heads, 1, latent_dim, v_dim,
                      latent_dim, latent_dim, scale);
}

void CpuBackend::run_paged_attention(const float* q, DType kv_dtype, const void* k_pool,
                                     const void* v_pool, float* out, const PagedBatch& batch,
                                     int n_heads, int n_kv_heads, int head_dim, int v_dim,
                                     int64_t k_stride, int64_t v_stride, float scale) {
  check_paged_batch(batch);
  if (batch.n_tokens == 0) return;
  PagedAttentionCall call{
      .kernels = kernels_,
      .q = q,
      .k_pool = static_cast<const char*>(k_pool),
      .v_pool = static_cast<const char*>(v_pool),
      .out = out,
      .batch = batch,
      .attn_step = kv_dtype == DType::kF16       ? kernels_.attn_step_f16
                   : kv_dtype == DType::kF8_E4M3 ? kernels_.attn_step_f8
                                                 : kernels_.attn_step_f32,
      .to_f32_row = kv_dtype == DType::kF16       ? f16_rows
                    : kv_dtype == DType::kF8_E4M3 ? f8_rows
                                                  : nullptr,
      .attn_step_bf16 = kv_dtype == DType::kF8_E4M3 ? kernels_.attn_step_bf16 : nullptr,
      .elem = kv_elem_bytes(kv_dtype),
      .n_heads = n_heads,
      .n_kv_heads = n_kv_heads,
      .group = n_heads / n_kv_heads,
      .head_dim = head_dim,
      .v_dim = v_dim,
      .scale = scale,
      .k_stride = k_stride,
      .v_stride = v_stride,
      .state_floats = SoftmaxState::floats(v_dim),
  };
  call.plan_tiles(tiles_.get_as<Tile>(call.max_tiles()));


  // Schedule: one task per group of tiles, or, when that leaves threads idle and the
  // contexts are long, one task per (group, split) and a merge pass.
  const int64_t n_splits = (call.longest + kSplitKeys - 1) / kSplitKeys;
  const bool split_tasks = n_splits > 1 && call.n_groups() < 2 * int64_t{pool_.n_threads()} &&
                           call.n_tiles * n_splits * call.state_floats <= kMaxPartialFloats;
  // Per thread: two states per tile of a group (running and split) and the step's
  // scratch.
  const int64_t per_thread = 2 * call.tiles_per_group() * call.state_floats + call.scratch_floats();
  for (auto& buf : per_thread_) buf.get(per_thread * sizeof(float));
  if (split_tasks) {
    run_split_tasks(call, n_splits,
                    partials_.get_as<float>(call.n_tiles * n_splits * call.state_floats));
  } else {
    run_group_tasks(call);
  }
}

// One task per group: its splits in order, each tile's folded into its running state.
void CpuBackend::run_group_tasks(const PagedAttentionCall& call) {
  const int64_t state_floats = call.state_floats;
  const int64_t per_group = call.tiles_per_group();
  const int v_dim = call.v_dim;
  // Tasks run head by head (a KV head's runs of tokens one after another): in a prefill
  // the runs of one head read the same K/V rows, which then come from cache, not
  // memory.
  const int64_t n_runs = call.n_groups() / call.n_kv_heads;
  pool_.run(call.n_groups(), [&](int64_t task, int thread) {
    const int64_t g = task % n_runs * call.n_kv_heads + task / n_runs;
    float* base = per_thread_[thread].get_as<float>(2 * per_group * state_floats +
                                                    call.scratch_floats());
    float* totals = base;                                // [per_group] running states
    float* parts = base + per_group * state_floats;      // [per_group] split states
    float* scratch = base + 2 * per_group * state_floats;
    const Tile* gt = call.tiles + g * per_group;
    if (gt[0].max_ctx <= kSplitKeys) {  // one split: folding it into a cleared state
      call.run_group_split(g, 0, totals, state_floats, scratch);  // would copy it exactly
    } else {
      for (int64_t ti = 0; ti < per_group; ++ti) {
        SoftmaxState::at(totals + ti * state_floats, v_dim).clear(gt[ti].n_tokens * gt[ti].n_heads);
      }
      for (int64_t sp = 0; sp * kSplitKeys < gt[0].max_ctx; ++sp) {
        call.run_group_split(g, sp, parts, state_floats, scratch);
        for (int64_t ti = 0; ti < per_group; ++ti) {
          SoftmaxState::at(totals + ti * state_floats, v_dim)
              .fold(SoftmaxState::at(parts + ti * state_floats, v_dim),
                    gt[ti].n_tokens * gt[ti].n_heads, kernels_);
        }
      }
    }
    for (int64_t ti = 0; ti < per_group; ++ti) {
      call.finish(gt[ti], SoftmaxState::at(totals + ti * state_floats, v_dim));
    }
  });
}

// One task per (group, split), each tile's state in partials ([n_tiles, n_splits,
// state_floats]), then a pass that folds each tile's in order.
void CpuBackend::run_split_tasks(const PagedAttentionCall& call, int64_t n_splits,
                                 float* partials) {
  const int64_t state_floats = call.state_floats;
  const int64_t per_group = call.tiles_per_group();
  const int v_dim = call.v_dim;
  pool_.run(call.n_groups() * n_splits, [&](int64_t task, int thread) {
    const int64_t g = task / n_splits, sp = task % n_splits;
    float* scratch = per_thread_[thread].get_as<float>(call.scratch_floats());
    call.run_group_split(g, sp, partials + (g * per_group * n_splits + sp) * state_floats,
                         n_splits * state_floats, scratch);
  });
  pool_.run(call.n_tiles, [&](int64_t ti, int thread) {
    const Tile& tile = call.tiles[ti];
    const int n_q = tile.n_tokens * tile.n_heads;
    const SoftmaxState total =
        SoftmaxState::at(per_thread_[thread].get_as<float>(state_floats), v_dim);
    total.clear(n_q);
    for (int64_t sp = 0; sp < n_splits; ++sp) {
      total.fold(SoftmaxState::at(partials + (ti * n_splits + sp) * state_floats, v_dim), n_q,
                 kernels_);
    }
    call.finish(tile, total);
  });
}

}  // namespace dserve::cpu
