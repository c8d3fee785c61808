// The paged KV cache ops (kv_store, kv_gather, paged_attention), on every
// instruction-set level this CPU supports and 1-3 threads.
//
// paged_attention is checked against the contiguous attention() (itself checked
// against a double-precision reference in backend_ops_test.cc) run per sequence on
// that sequence's K/V gathered back out of the pool. The block tables are shuffled,
// non-contiguous, and some are longer than needed; every pool slot no sequence has
// written holds NaN, so a kernel that reads a slot outside a token's causal window
// (or another sequence's slot) produces NaN and fails.
//
// Tolerance: both sides accumulate in FP32 over a few hundred keys, in different
// orders (two-pass softmax vs. online softmax); outputs are convex combinations of
// N(0, 1) values, so 1e-5 * max(1, |want|) leaves ample room.
//
// F16 pools (the engine's default KV cache): on F16-representable values an F16 pool
// gives the same bits as an F32 pool (both block sizes, GQA and MLA shapes, every
// level and thread count), and matches a plain-loop attention in double; kv_store's
// rounding and kv_gather's conversion equal tensor/half.h's on every level, special
// values included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_isa.h"
#include "backend/cpu/kernels.h"
#include "backend_configs.h"
#include "tensor/half.h"

namespace dserve {
namespace {

using test::all_configs;
using test::BackendConfig;
using test::config_name;
using test::make_backend;
using test::random_floats;

using cpu::CpuIsa;

class PagedAttentionTest : public testing::TestWithParam<BackendConfig> {
 protected:
  void SetUp() override { backend_ = make_backend(GetParam()); }
  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{4321};
};

// One sequence's part of a step: it holds n_ctx positions after this step, of which
// the last n_new are this step's tokens (1: decode; more: a prefill chunk, which
// starts mid-sequence when n_new < n_ctx).
struct SeqStep {
  int n_ctx, n_new;
};

struct Shape {
  int block_size, n_heads, n_kv_heads, head_dim, v_dim;
  // MLA's absorbed attention over the latent pool: one pool row per token serves as
  // key and value at once (k_pool == v_pool, one KV head, head_dim == v_dim == the
  // latent row: kv_lora_rank + qk_rope_head_dim), as DeepseekModel::attention_paged
  // calls it.
  bool latent = false;
};

std::string shape_name(const Shape& s) {
  return "block " + std::to_string(s.block_size) + " heads " + std::to_string(s.n_heads) + "/" +
         std::to_string(s.n_kv_heads) + " head_dim " + std::to_string(s.head_dim) + " v_dim " +
         std::to_string(s.v_dim) + (s.latent ? " (MLA latent pool)" : "");
}

// Slot of position p for a block table.
int64_t slot_of(const std::vector<int32_t>& table, int block_size, int64_t p) {
  return int64_t{table[p / block_size]} * block_size + p % block_size;
}

// Sequences stored in a paged pool, and a batch of their new tokens.
struct PagedCase {
  Shape sh;
  std::vector<SeqStep> seqs;
  int64_t k_row = 0, v_row = 0, q_row = 0, o_row = 0;
  std::vector<std::vector<int32_t>> tables;      // per sequence
  std::vector<int32_t> flat_tables;              // the tables, concatenated
  std::vector<int64_t> offsets;                  // [n_seqs + 1]
  std::vector<float> k_pool, v_pool;             // [n_slots, row]
  std::vector<uint16_t> k_pool16, v_pool16;      // the same as halves (f16 cases only)
  std::vector<uint8_t> k_pool8, v_pool8;         // the same as float8_e4m3fn (with_f8)
  std::vector<std::vector<float>> k_seq, v_seq;  // per sequence [n_ctx, row]
  std::vector<std::vector<int64_t>> slots;       // per sequence [n_ctx]
  std::vector<int32_t> seq_of_token, positions;  // [n_tokens]
  std::vector<float> q;                          // [n_tokens, q_row]
  float scale = 1.0f;

  int64_t n_tokens() const { return static_cast<int64_t>(positions.size()); }

  // paged_attention on the batch's tokens `tokens` (all when empty), as their own
  // batch: returns out [tokens.size(), o_row].
  std::vector<float> run(Backend& backend, std::vector<int64_t> tokens = {},
                         DType kv_dtype = DType::kF32) const {
    if (tokens.empty()) {
      for (int64_t t = 0; t < n_tokens(); ++t) tokens.push_back(t);
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::vector<int32_t> sub_seq(n), sub_pos(n);
    std::vector<float> sub_q(n * q_row);
    for (int64_t i = 0; i < n; ++i) {
      sub_seq[i] = seq_of_token[tokens[i]];
      sub_pos[i] = positions[tokens[i]];
      std::copy_n(q.begin() + tokens[i] * q_row, q_row, sub_q.begin() + i * q_row);
    }
    std::vector<float> out(n * o_row, std::numeric_limits<float>::quiet_NaN());
    PagedBatch batch;
    batch.n_tokens = n;
    batch.positions = sub_pos.data();
    batch.seq_of_token = sub_seq.data();
    batch.n_seqs = static_cast<int64_t>(seqs.size());
    batch.block_tables = flat_tables.data();
    batch.block_table_offsets = offsets.data();
    batch.block_size = sh.block_size;
    const bool f16 = kv_dtype == DType::kF16, f8 = kv_dtype == DType::kF8_E4M3;
    const void* k = f16  ? static_cast<const void*>(k_pool16.data())
                    : f8 ? static_cast<const void*>(k_pool8.data())
                         : k_pool.data();
    const void* v = f16  ? static_cast<const void*>(v_pool16.data())
                    : f8 ? static_cast<const void*>(v_pool8.data())
                         : v_pool.data();
    if (sh.latent) v = k;  // the same pool for MLA
    if (latent_v_dim > 0) {
      out.resize(n * sh.n_heads * latent_v_dim);
      backend.paged_latent_attention(sub_q.data(), kv_dtype, k, out.data(), batch, sh.n_heads,
                                     sh.head_dim, latent_v_dim, scale);
    } else {
      backend.paged_attention(sub_q.data(), kv_dtype, k, v, out.data(), batch, sh.n_heads,
                              sh.n_kv_heads, sh.head_dim, sh.v_dim, scale);
    }
    return out;
  }
  // > 0: run() calls paged_latent_attention with this v_dim (latent cases only).
  int latent_v_dim = 0;
};

// Block tables: every sequence gets the blocks it needs, some one spare, all drawn
// from one shuffled pool with a few blocks nobody owns. Pools full of NaN, then each
// sequence's K/V stored into its slots with kv_store. The batch: every sequence's new
// tokens, interleaved in a random order. With f16, K/V values are rounded to halves
// first and also stored into F16 pools (NaN halves elsewhere).
PagedCase make_case(Backend& backend, const Shape& sh, const std::vector<SeqStep>& seqs,
                    std::mt19937& rng, bool f16 = false) {
  PagedCase c;
  c.sh = sh;
  c.seqs = seqs;
  const int bs = sh.block_size;
  const int64_t n_seqs = static_cast<int64_t>(seqs.size());
  c.k_row = int64_t{sh.n_kv_heads} * sh.head_dim;
  c.v_row = int64_t{sh.n_kv_heads} * sh.v_dim;
  c.q_row = int64_t{sh.n_heads} * sh.head_dim;
  c.o_row = int64_t{sh.n_heads} * sh.v_dim;
  c.scale = 1.0f / std::sqrt(float(sh.head_dim));

  std::vector<int> n_blocks_of(n_seqs);
  int total_blocks = 3;
  for (int64_t s = 0; s < n_seqs; ++s) {
    n_blocks_of[s] = (seqs[s].n_ctx + bs - 1) / bs + static_cast<int>(s % 2);
    total_blocks += n_blocks_of[s];
  }
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.tables.resize(n_seqs);
  c.offsets = {0};
  for (int64_t s = 0, next = 0; s < n_seqs; ++s) {
    c.tables[s].assign(ids.begin() + next, ids.begin() + next + n_blocks_of[s]);
    next += n_blocks_of[s];
    c.flat_tables.insert(c.flat_tables.end(), c.tables[s].begin(), c.tables[s].end());
    c.offsets.push_back(static_cast<int64_t>(c.flat_tables.size()));
  }

  const int64_t n_slots = int64_t{total_blocks} * bs;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  c.k_pool.assign(n_slots * c.k_row, nan);
  c.v_pool.assign(n_slots * c.v_row, nan);
  if (f16) {
    c.k_pool16.assign(c.k_pool.size(), 0x7e00);  // NaN
    c.v_pool16.assign(c.v_pool.size(), 0x7e00);
  }
  auto maybe_round = [f16](std::vector<float> v) {
    if (f16) {
      for (float& x : v) x = f16_to_f32(f32_to_f16(x));
    }
    return v;
  };
  c.k_seq.resize(n_seqs);
  c.v_seq.resize(n_seqs);
  c.slots.resize(n_seqs);
  for (int64_t s = 0; s < n_seqs; ++s) {
    c.k_seq[s] = maybe_round(random_floats(seqs[s].n_ctx * c.k_row, rng));
    c.v_seq[s] =
        sh.latent ? c.k_seq[s] : maybe_round(random_floats(seqs[s].n_ctx * c.v_row, rng));
    for (int p = 0; p < seqs[s].n_ctx; ++p) c.slots[s].push_back(slot_of(c.tables[s], bs, p));
    const int64_t* slots = c.slots[s].data();
    const int64_t n = seqs[s].n_ctx;
    backend.kv_store(DType::kF32, c.k_pool.data(), c.k_row, c.k_seq[s].data(), slots, n);
    backend.kv_store(DType::kF32, c.v_pool.data(), c.v_row, c.v_seq[s].data(), slots, n);
    if (f16) {
      backend.kv_store(DType::kF16, c.k_pool16.data(), c.k_row, c.k_seq[s].data(), slots, n);
      backend.kv_store(DType::kF16, c.v_pool16.data(), c.v_row, c.v_seq[s].data(), slots, n);
    }
  }

  std::vector<std::pair<int32_t, int32_t>> tokens;  // (sequence, position)
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int p = seqs[s].n_ctx - seqs[s].n_new; p < seqs[s].n_ctx; ++p) {
      tokens.emplace_back(static_cast<int32_t>(s), p);
    }
  }
  std::shuffle(tokens.begin(), tokens.end(), rng);
  for (const auto& [s, p] : tokens) {
    c.seq_of_token.push_back(s);
    c.positions.push_back(p);
  }
  c.q = random_floats(c.n_tokens() * c.q_row, rng);
  return c;
}

void check_paged_attention(Backend& backend, const Shape& sh, const std::vector<SeqStep>& seqs,
                           std::mt19937& rng) {
  SCOPED_TRACE(shape_name(sh));
  ASSERT_TRUE(!sh.latent || (sh.n_kv_heads == 1 && sh.head_dim == sh.v_dim));
  const PagedCase c = make_case(backend, sh, seqs, rng);
  const std::vector<float> out = c.run(backend);

  // Per sequence: gather its K/V (must round-trip exactly), run attention() on its
  // tokens, compare.
  for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + " n_ctx " + std::to_string(seqs[s].n_ctx) +
                 " n_new " + std::to_string(seqs[s].n_new));
    const int n_ctx = seqs[s].n_ctx;
    std::vector<float> k(n_ctx * c.k_row), v(n_ctx * c.v_row);
    backend.kv_gather(DType::kF32, c.k_pool.data(), c.k_row, c.slots[s].data(), n_ctx, k.data());
    backend.kv_gather(DType::kF32, c.v_pool.data(), c.v_row, c.slots[s].data(), n_ctx, v.data());
    ASSERT_EQ(k, c.k_seq[s]);
    ASSERT_EQ(v, c.v_seq[s]);

    std::vector<int64_t> tokens;  // batch indices of this sequence's tokens
    for (int64_t t = 0; t < c.n_tokens(); ++t) {
      if (c.seq_of_token[t] == s) tokens.push_back(t);
    }
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::vector<float> sq(n * c.q_row), sout(n * c.o_row);
    std::vector<int32_t> spos(n);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(c.q.begin() + tokens[i] * c.q_row, c.q_row, sq.begin() + i * c.q_row);
      spos[i] = c.positions[tokens[i]];
    }
    backend.attention(sq.data(), k.data(), v.data(), sout.data(), n, spos.data(), n_ctx, sh.n_heads,
                      sh.n_kv_heads, sh.head_dim, sh.v_dim, c.scale);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < c.o_row; ++j) {
        const float want = sout[i * c.o_row + j];
        const float got = out[tokens[i] * c.o_row + j];
        ASSERT_NEAR(got, want, 1e-5f * std::max(1.0f, std::fabs(want)))
            << "position " << spos[i] << " head " << j / sh.v_dim << " dim " << j % sh.v_dim;
      }
    }
  }
}

// Decodes and prefill chunks of sequences of various lengths in one batch, across
// block sizes, GQA ratios and head sizes (including ones no vector width divides).
TEST_P(PagedAttentionTest, MatchesContiguousAttention) {
  const std::vector<SeqStep> seqs = {
      {1, 1},     // first token of a sequence
      {6, 6},     // a whole short prompt
      {40, 1},    // decode
      {129, 29},  // prefill chunk starting mid-sequence, crossing a 128 boundary
      {300, 1},   // decode, long context
      {261, 61},  // prefill chunk
      {17, 1},    // decode just past a 16 boundary
  };
  for (const Shape& sh : {Shape{16, 4, 4, 64, 64}, Shape{16, 9, 3, 48, 32},
                          Shape{128, 6, 2, 64, 48}, Shape{128, 3, 3, 48, 64},
                          Shape{5, 3, 1, 48, 64}, Shape{5, 2, 2, 7, 9}, Shape{16, 8, 1, 96, 64}}) {
    check_paged_attention(*backend_, sh, seqs, rng_);
    if (HasFatalFailure()) return;
  }
}

// MLA: DeepSeek-V2/V3's absorbed attention reads one latent pool as both keys and
// values (kv_lora_rank 512 + rope 64 = 576 floats per token; 16 query heads over one
// latent "head"; small odd-sized latents too; 40 heads, more than one tile of queries,
// whose tiles step over the keys together), at block sizes 16 and 128.
TEST_P(PagedAttentionTest, MlaLatentPool) {
  const std::vector<SeqStep> seqs = {{1, 1}, {40, 1}, {129, 29}, {300, 1}, {17, 17}};
  for (const Shape& sh : {Shape{16, 16, 1, 576, 576, true}, Shape{128, 16, 1, 576, 576, true},
                          Shape{16, 5, 1, 40, 40, true}, Shape{128, 3, 1, 72, 72, true},
                          Shape{16, 40, 1, 72, 72, true}}) {
    check_paged_attention(*backend_, sh, seqs, rng_);
    if (HasFatalFailure()) return;
  }
}

// Decode only: one token per sequence (the hot path), many sequences.
TEST_P(PagedAttentionTest, DecodeOnly) {
  std::vector<SeqStep> seqs;
  for (int n : {1, 2, 15, 16, 33, 80, 127, 128, 129, 200}) seqs.push_back({n, 1});
  for (const Shape& sh :
       {Shape{16, 9, 3, 64, 64}, Shape{128, 9, 3, 64, 64}, Shape{5, 4, 4, 48, 48}}) {
    check_paged_attention(*backend_, sh, seqs, rng_);
    if (HasFatalFailure()) return;
  }
}

// One or two long sequences: too few tiles for the threads, so each tile's keys are
// split over several tasks and merged (also with one thread: two splits).
TEST_P(PagedAttentionTest, LongContextSplitsKeys) {
  for (const std::vector<SeqStep>& seqs :
       {std::vector<SeqStep>{{2000, 1}}, std::vector<SeqStep>{{1200, 2}},
        std::vector<SeqStep>{{700, 1}, {1100, 1}}}) {
    for (const Shape& sh : {Shape{16, 8, 1, 96, 64}, Shape{128, 9, 3, 64, 64},
                            Shape{5, 4, 4, 48, 48}, Shape{16, 34, 1, 40, 24}}) {
      check_paged_attention(*backend_, sh, seqs, rng_);
      if (HasFatalFailure()) return;
    }
  }
}

void with_f8(Backend& backend, PagedCase* c);

// A token's output does not depend on what else is in the batch nor on the thread
// count, bit for bit (the engine's "same output alone and in a batch"): the whole
// batch, each sequence alone, and each token alone, on this backend and on a
// one-thread one, agree exactly. Long contexts make the alone runs split their keys
// over tasks where the batch does not. F32 pools, and FP8 ones (whose MLA latents take
// BF16 products where the CPU has them).
TEST_P(PagedAttentionTest, BatchInvariant) {
  std::unique_ptr<Backend> single = make_backend({GetParam().isa, 1});
  const std::vector<SeqStep> seqs = {{900, 1}, {600, 40}, {300, 1}, {50, 50}, {1300, 1}};
  for (const Shape& sh :
       {Shape{16, 9, 3, 64, 64}, Shape{128, 8, 1, 96, 64}, Shape{5, 4, 4, 48, 40},
        Shape{16, 40, 1, 72, 72, true}}) {
    SCOPED_TRACE(shape_name(sh));
    PagedCase c = make_case(*backend_, sh, seqs, rng_);
    for (DType dtype : {DType::kF32, DType::kF8_E4M3}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)));
      if (dtype == DType::kF8_E4M3) with_f8(*backend_, &c);
      const std::vector<float> all = c.run(*backend_, {}, dtype);
      for (Backend* b : {backend_.get(), single.get()}) {
        for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s) {
          std::vector<int64_t> tokens;
          for (int64_t t = 0; t < c.n_tokens(); ++t) {
            if (c.seq_of_token[t] == s) tokens.push_back(t);
          }
          const std::vector<float> alone = c.run(*b, tokens, dtype);
          for (size_t i = 0; i < tokens.size(); ++i) {
            ASSERT_TRUE(std::equal(alone.begin() + i * c.o_row,
                                   alone.begin() + (i + 1) * c.o_row,
                                   all.begin() + tokens[i] * c.o_row))
                << "sequence " << s << " position " << c.positions[tokens[i]] << " on "
                << b->name();
          }
          const std::vector<float> one = c.run(*b, {tokens.back()}, dtype);
          ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + tokens.back() * c.o_row))
              << "sequence " << s << " position " << c.positions[tokens.back()] << " alone";
        }
      }
    }
  }
}

// A single sequence with one extreme score per head: the softmax must stay finite
// and pick that key (checks the running-max rescaling of an online softmax).
TEST_P(PagedAttentionTest, LargeScoresStayFinite) {
  const int bs = 16, n_ctx = 70, hd = 32;
  std::vector<int32_t> table = {4, 0, 3, 1, 2};
  std::vector<float> k(int64_t{5} * bs * hd, 0.0f), v(int64_t{5} * bs * hd, 0.0f);
  std::vector<float> q(hd, 0.0f);
  q[0] = 1.0f;
  // Scores rise with position so the max moves block by block; position 50 dominates.
  for (int p = 0; p < n_ctx; ++p) {
    const int64_t slot = slot_of(table, bs, p);
    k[slot * hd] = p == 50 ? 1000.0f : float(p);
    v[slot * hd + 1] = float(p);
  }
  const int32_t pos = n_ctx - 1, seq = 0;
  const int64_t offsets[2] = {0, 5};
  PagedBatch batch{1, &pos, &seq, 1, table.data(), offsets, bs};
  std::vector<float> out(hd);
  backend_->paged_attention(q.data(), DType::kF32, k.data(), v.data(), out.data(), batch, 1, 1,
                            hd, hd, 1.0f);
  EXPECT_NEAR(out[1], 50.0f, 1e-4f);
  EXPECT_EQ(out[0], 0.0f);
  // The same in F16 (every value here is a half).
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  for (size_t i = 0; i < k.size(); ++i) k16[i] = f32_to_f16(k[i]);
  for (size_t i = 0; i < v.size(); ++i) v16[i] = f32_to_f16(v[i]);
  std::vector<float> out16(hd);
  backend_->paged_attention(q.data(), DType::kF16, k16.data(), v16.data(), out16.data(), batch, 1,
                            1, hd, hd, 1.0f);
  EXPECT_EQ(out16, out);
}

TEST_P(PagedAttentionTest, EmptyBatchIsANoOp) {
  PagedBatch batch;
  const int64_t offsets[1] = {0};
  batch.block_table_offsets = offsets;
  for (DType t : {DType::kF32, DType::kF16, DType::kF8_E4M3}) {
    backend_->paged_attention(nullptr, t, nullptr, nullptr, nullptr, batch, 4, 2, 64, 64, 0.125f);
    backend_->kv_store(t, nullptr, 64, nullptr, nullptr, 0);
    backend_->kv_gather(t, nullptr, 64, nullptr, 0, nullptr);
  }
}

// Store then gather, on a batch big enough to be split over the threads: exact.
TEST_P(PagedAttentionTest, StoreGatherRoundTrip) {
  for (int64_t row : {int64_t{1}, int64_t{576}, int64_t{37}}) {
    const int64_t n_slots = 1000, n = 300;
    std::vector<int64_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    std::vector<int64_t> slots(all.begin(), all.begin() + n);
    std::vector<float> pool(n_slots * row, -7.0f);
    std::vector<float> x = random_floats(n * row, rng_);
    backend_->kv_store(DType::kF32, pool.data(), row, x.data(), slots.data(), n);
    std::vector<float> back(n * row);
    backend_->kv_gather(DType::kF32, pool.data(), row, slots.data(), n, back.data());
    EXPECT_EQ(back, x);
    // Slots not stored to are untouched.
    for (int64_t i = n; i < n_slots; ++i) {
      for (int64_t j = 0; j < row; ++j) ASSERT_EQ(pool[all[i] * row + j], -7.0f);
    }
  }
}

// F16 store then gather: kv_store rounds as f32_to_f16 and kv_gather converts as
// f16_to_f32 (tensor/half.h, itself checked against F16C), bit for bit on every level,
// for rows no vector width divides and values that exercise rounding: ties, subnormals,
// overflow to infinity, infinities and NaN. Slots not stored to are untouched.
TEST_P(PagedAttentionTest, F16StoreGatherRoundsToNearestEven) {
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int64_t row : {int64_t{1}, int64_t{576}, int64_t{37}, int64_t{64}}) {
    const int64_t n_slots = 1000, n = 300;
    std::vector<int64_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    std::vector<int64_t> slots(all.begin(), all.begin() + n);
    std::vector<float> x(n * row);
    for (int64_t i = 0; i < n * row; ++i) {
      switch (i % 6) {
        case 0: x[i] = unit(rng_); break;
        case 1: x[i] = std::ldexp(unit(rng_), -14 - static_cast<int>(i % 13)); break;
        case 2: x[i] = unit(rng_) * 70000.0f; break;  // some overflow to inf
        case 3: {  // a tie: a half plus half its last place
          const float h = f16_to_f32(static_cast<uint16_t>(any_bits(rng_) & 0x7bff));
          x[i] = h + std::ldexp(1.0f, std::ilogb(h == 0.0f ? 1.0f : h) - 11);
          break;
        }
        case 4: {
          const uint32_t b = any_bits(rng_);
          std::memcpy(&x[i], &b, 4);  // any float: NaN, inf, huge, tiny
          break;
        }
        default: x[i] = static_cast<float>(i % 7) * 0.25f; break;
      }
    }
    std::vector<uint16_t> pool(n_slots * row, 0x1234);
    backend_->kv_store(DType::kF16, pool.data(), row, x.data(), slots.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < row; ++j) {
        ASSERT_EQ(pool[slots[i] * row + j], f32_to_f16(x[i * row + j]))
            << "row " << row << " value " << x[i * row + j];
      }
    }
    for (int64_t i = n; i < n_slots; ++i) {
      for (int64_t j = 0; j < row; ++j) ASSERT_EQ(pool[all[i] * row + j], 0x1234);
    }
    std::vector<float> back(n * row);
    backend_->kv_gather(DType::kF16, pool.data(), row, slots.data(), n, back.data());
    for (int64_t i = 0; i < n * row; ++i) {
      const float want = f16_to_f32(f32_to_f16(x[i]));
      uint32_t a, b;
      std::memcpy(&a, &back[i], 4);
      std::memcpy(&b, &want, 4);
      ASSERT_EQ(a, b) << "value " << x[i];
    }
  }
}

// An F16 pool gives bit for bit the output of an F32 pool holding the same values,
// for decodes, prefill chunks and long (split) contexts, block sizes 16 and 128, GQA,
// head sizes no vector width divides, and MLA's shared latent pool.
TEST_P(PagedAttentionTest, F16PoolEqualsF32PoolOfTheSameValues) {
  const std::vector<SeqStep> seqs = {{1, 1},     {6, 6},  {40, 1}, {129, 29},
                                     {300, 1},   {17, 1}, {1100, 1}};
  for (const Shape& sh :
       {Shape{16, 9, 3, 64, 64}, Shape{128, 9, 3, 64, 64}, Shape{16, 6, 2, 48, 40},
        Shape{128, 3, 3, 7, 9}, Shape{16, 8, 1, 128, 128}, Shape{16, 16, 1, 576, 576, true},
        Shape{128, 16, 1, 576, 576, true}, Shape{16, 5, 1, 40, 40, true},
        Shape{16, 40, 1, 576, 576, true}, Shape{16, 34, 1, 40, 24}}) {
    SCOPED_TRACE(shape_name(sh));
    const PagedCase c = make_case(*backend_, sh, seqs, rng_, /*f16=*/true);
    const std::vector<float> want = c.run(*backend_, {}, DType::kF32);
    const std::vector<float> got = c.run(*backend_, {}, DType::kF16);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    // Each sequence's rows gather back exactly from the F16 pool.
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<float> k(seqs[s].n_ctx * c.k_row);
      backend_->kv_gather(DType::kF16, c.k_pool16.data(), c.k_row, c.slots[s].data(),
                          seqs[s].n_ctx, k.data());
      ASSERT_EQ(k, c.k_seq[s]);
    }
  }
}

// A case's values rounded to float8_e4m3fn in its F32 pools and sequences, and the
// same stored with kv_store into F8 pools (NaN bytes where nothing was stored).
void with_f8(Backend& backend, PagedCase* c) {
  auto round = [](std::vector<float>& v) {
    for (float& x : v) {
      if (!std::isnan(x)) x = fp8_e4m3_to_f32(f32_to_fp8_e4m3(x));
    }
  };
  round(c->k_pool);
  round(c->v_pool);
  c->k_pool8.assign(c->k_pool.size(), 0x7f);
  c->v_pool8.assign(c->v_pool.size(), 0x7f);
  for (size_t s = 0; s < c->seqs.size(); ++s) {
    round(c->k_seq[s]);
    round(c->v_seq[s]);
    const int64_t n = c->seqs[s].n_ctx;
    backend.kv_store(DType::kF8_E4M3, c->k_pool8.data(), c->k_row, c->k_seq[s].data(),
                     c->slots[s].data(), n);
    backend.kv_store(DType::kF8_E4M3, c->v_pool8.data(), c->v_row, c->v_seq[s].data(),
                     c->slots[s].data(), n);
  }
}

// FP8 pools (--kv-cache-dtype fp8): on FP8-representable values the same bits as the
// F32 pool holding them (every shape, level and thread count); rows gather back
// exactly. One exception: MLA's latent pool read by a group of several query tiles
// (more than 16 heads) on a CPU with AVX512-BF16 takes BF16 products
// (KernelTable::attn_step_bf16): F8LatentPoolInBf16MatchesNaiveAttention checks those.
TEST_P(PagedAttentionTest, F8PoolEqualsF32PoolOfTheSameValues) {
  const std::vector<SeqStep> seqs = {{1, 1}, {6, 6}, {40, 1}, {129, 29}, {300, 1}, {1100, 1}};
  for (const Shape& sh :
       {Shape{16, 9, 3, 64, 64}, Shape{128, 3, 3, 7, 9}, Shape{16, 16, 1, 576, 576, true},
        Shape{128, 16, 1, 576, 576, true}, Shape{16, 5, 1, 40, 40, true},
        Shape{16, 40, 1, 576, 576, true}, Shape{16, 34, 1, 40, 24}}) {
    SCOPED_TRACE(shape_name(sh));
    PagedCase c = make_case(*backend_, sh, seqs, rng_);
    with_f8(*backend_, &c);
    const std::vector<float> want = c.run(*backend_, {}, DType::kF32);
    const std::vector<float> got = c.run(*backend_, {}, DType::kF8_E4M3);
    ASSERT_EQ(got.size(), want.size());
    const bool bf16 = sh.latent && sh.n_heads > 16 &&
                      cpu::kernels_for(GetParam().isa).attn_step_bf16 != nullptr;
    if (!bf16) {
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    for (size_t s = 0; s < seqs.size(); ++s) {
      std::vector<float> k(seqs[s].n_ctx * c.k_row);
      backend_->kv_gather(DType::kF8_E4M3, c.k_pool8.data(), c.k_row, c.slots[s].data(),
                          seqs[s].n_ctx, k.data());
      ASSERT_EQ(k, c.k_seq[s]);
    }
  }
}

// paged_latent_attention (MLA's values: the first v_dim of each latent row) gives bit
// for bit the first v_dim values of paged_attention over the pool as keys and values,
// in every pool dtype, for query tiles of one and several groups, split or not.
TEST_P(PagedAttentionTest, LatentAttentionIsPagedAttentionsFirstValues) {
  const std::vector<SeqStep> seqs = {{1, 1}, {40, 1}, {129, 29}, {1100, 1}, {17, 17}};
  for (const Shape& sh : {Shape{16, 16, 1, 576, 576, true}, Shape{16, 40, 1, 72, 72, true},
                          Shape{128, 128, 1, 72, 72, true}, Shape{5, 3, 1, 40, 40, true}}) {
    SCOPED_TRACE(shape_name(sh));
    PagedCase c = make_case(*backend_, sh, seqs, rng_, /*f16=*/true);
    const int v_dim = sh.head_dim * 8 / 9;  // 512 of 576, as kv_lora of a DeepSeek row
    for (DType dtype : {DType::kF32, DType::kF16, DType::kF8_E4M3}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)));
      if (dtype == DType::kF8_E4M3) with_f8(*backend_, &c);
      c.latent_v_dim = 0;
      const std::vector<float> full = c.run(*backend_, {}, dtype);
      c.latent_v_dim = v_dim;
      const std::vector<float> part = c.run(*backend_, {}, dtype);
      for (int64_t row = 0; row < c.n_tokens() * sh.n_heads; ++row) {
        ASSERT_EQ(std::memcmp(part.data() + row * v_dim, full.data() + row * sh.head_dim,
                              v_dim * sizeof(float)),
                  0)
            << "row " << row;
      }
    }
  }
}

// f32_to_fp8_e4m3 against the definition, from the decoder: every code but NaN
// round-trips; any float goes to the nearest finite code (ties to the even mantissa),
// saturating at +-448; NaN stays NaN.
TEST(Fp8KvConversion, RoundsToNearestEvenAndSaturates) {
  std::vector<float> codes;  // the finite non-negative values, ascending
  for (int b = 0; b < 0x7f; ++b) {
    ASSERT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(b))), b) << b;
    ASSERT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(b | 0x80))), b | 0x80) << b;
    codes.push_back(fp8_e4m3_to_f32(static_cast<uint8_t>(b)));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mag(-12.0f, 9.5f);
  for (int i = 0; i < 200000; ++i) {
    float x = std::exp2(mag(rng));
    if (i % 7 == 0) {  // an exact midpoint between two codes
      const size_t j = i % (codes.size() - 1);
      x = (codes[j] + codes[j + 1]) / 2;
    }
    const float got = fp8_e4m3_to_f32(f32_to_fp8_e4m3(x));
    const size_t hi = std::lower_bound(codes.begin(), codes.end(), x) - codes.begin();
    float want;
    if (hi == codes.size()) {
      want = codes.back();  // beyond 448: saturate
    } else if (hi == 0 || codes[hi] == x) {
      want = codes[hi];
    } else {
      const float lo_v = codes[hi - 1], hi_v = codes[hi];
      const float dl = x - lo_v, dh = hi_v - x;
      want = dl < dh ? lo_v : dh < dl ? hi_v : ((hi - 1) % 2 == 0 ? lo_v : hi_v);
    }
    ASSERT_EQ(got, want) << x;
    ASSERT_EQ(fp8_e4m3_to_f32(f32_to_fp8_e4m3(-x)), -want) << x;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e30f), 0xfe);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(f32_to_fp8_e4m3(NAN))));
}

// Token t's head h as plain loops in double (scores, max, softmax, weighted sum) over its
// sequence's stored keys and values, each query element passed through round_q first.
std::vector<double> naive_attention(const PagedCase& c, int64_t t, int h,
                                    float (*round_q)(float)) {
  const Shape& sh = c.sh;
  const int s = c.seq_of_token[t];
  const int n_ctx = c.positions[t] + 1;
  const int kvh = h / (sh.n_heads / sh.n_kv_heads);
  const float* q = &c.q[t * c.q_row + int64_t{h} * sh.head_dim];
  std::vector<double> score(n_ctx);
  double mx = -INFINITY;
  for (int p = 0; p < n_ctx; ++p) {
    const float* k = &c.k_seq[s][p * c.k_row + int64_t{kvh} * sh.head_dim];
    double dot = 0.0;
    for (int d = 0; d < sh.head_dim; ++d) dot += double{round_q(q[d])} * k[d];
    score[p] = dot * c.scale;
    mx = std::max(mx, score[p]);
  }
  double sum = 0.0;
  for (int p = 0; p < n_ctx; ++p) sum += score[p] = std::exp(score[p] - mx);
  std::vector<double> out(sh.v_dim);
  for (int d = 0; d < sh.v_dim; ++d) {
    double o = 0.0;
    for (int p = 0; p < n_ctx; ++p) {
      o += score[p] * c.v_seq[s][p * c.v_row + int64_t{kvh} * sh.v_dim + d];
    }
    out[d] = o / sum;
  }
  return out;
}

float as_is(float x) { return x; }

// The F16 path against attention written as plain loops in double on the same
// F16-rounded keys and values.
TEST_P(PagedAttentionTest, F16PoolMatchesNaiveAttention) {
  const std::vector<SeqStep> seqs = {{1, 1}, {33, 1}, {129, 29}, {400, 1}, {70, 70}};
  for (const Shape& sh : {Shape{16, 9, 3, 64, 64}, Shape{128, 4, 2, 48, 32},
                          Shape{16, 16, 1, 72, 72, true}}) {
    SCOPED_TRACE(shape_name(sh));
    const PagedCase c = make_case(*backend_, sh, seqs, rng_, /*f16=*/true);
    const std::vector<float> got = c.run(*backend_, {}, DType::kF16);
    for (int64_t t = 0; t < c.n_tokens(); ++t) {
      for (int h = 0; h < sh.n_heads; ++h) {
        const std::vector<double> want = naive_attention(c, t, h, as_is);
        for (int d = 0; d < sh.v_dim; ++d) {
          const float g = got[t * c.o_row + int64_t{h} * sh.v_dim + d];
          ASSERT_NEAR(g, want[d], 1e-5 * std::max(1.0, std::fabs(want[d])))
              << "position " << c.positions[t] << " head " << h << " dim " << d;
        }
      }
    }
  }
}

// BF16 rounding (nearest even) of a float, as the test's reference does it.
float round_to_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  b = (b + 0x7fff + ((b >> 16) & 1)) & 0xffff0000u;
  std::memcpy(&x, &b, sizeof b);
  return x;
}

// MLA over FP8 latents with BF16 products (kernels_avx512_bf16.cc), where this CPU has
// them: against attention as plain loops in double on the FP8 latents with each query
// rounded to BF16, as the kernel rounds it. What is left is the rounding of each
// softmax weight to BF16 (relative error <= u = 2^-8): weights off by relative errors
// <= u move a weighted mean of values by at most 2 u max|v| / (1 - u); the float
// sums' 1e-5 on top. Tiles of one and several tokens, split and not, odd key counts.
TEST_P(PagedAttentionTest, F8LatentPoolInBf16MatchesNaiveAttention) {
  if (cpu::kernels_for(GetParam().isa).attn_step_bf16 == nullptr) {
    GTEST_SKIP() << "no BF16 products at this level on this CPU";
  }
  const std::vector<SeqStep> seqs = {{1, 1}, {7, 7}, {33, 1}, {129, 29}, {300, 1}};
  for (const Shape& sh : {Shape{16, 40, 1, 576, 576, true}, Shape{16, 34, 1, 72, 72, true},
                          Shape{64, 128, 1, 40, 40, true}}) {
    SCOPED_TRACE(shape_name(sh));
    PagedCase c = make_case(*backend_, sh, seqs, rng_);
    with_f8(*backend_, &c);
    const std::vector<float> got = c.run(*backend_, {}, DType::kF8_E4M3);
    const double u = std::ldexp(1.0, -8);
    for (int64_t t = 0; t < c.n_tokens(); ++t) {
      const int s = c.seq_of_token[t];
      const int n_ctx = c.positions[t] + 1;
      double v_max = 0.0;
      for (int64_t i = 0; i < int64_t{n_ctx} * c.k_row; ++i) {
        v_max = std::max(v_max, double{std::fabs(c.k_seq[s][i])});
      }
      const double bound = 2 * u * v_max / (1 - u);
      for (int h = 0; h < sh.n_heads; ++h) {
        const std::vector<double> want = naive_attention(c, t, h, round_to_bf16);
        for (int d = 0; d < sh.v_dim; ++d) {
          const float g = got[t * c.o_row + int64_t{h} * sh.v_dim + d];
          ASSERT_NEAR(g, want[d], bound + 1e-5 * std::max(1.0, std::fabs(want[d])))
              << "position " << c.positions[t] << " head " << h << " dim " << d;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, PagedAttentionTest, testing::ValuesIn(all_configs()),
                         config_name);

}  // namespace
}  // namespace dserve
