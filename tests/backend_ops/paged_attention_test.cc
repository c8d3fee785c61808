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
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_isa.h"

namespace dserve {
namespace {

using cpu::CpuIsa;

std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct Config {
  CpuIsa isa;
  int n_threads;
};

std::string config_name(const testing::TestParamInfo<Config>& info) {
  return std::string(cpu::isa_name(info.param.isa)) + "_t" + std::to_string(info.param.n_threads);
}

std::vector<Config> all_configs() {
  std::vector<Config> out;
  for (CpuIsa isa : cpu::supported_isas()) {
    for (int n : {1, 2, 3}) out.push_back({isa, n});
  }
  return out;
}

class PagedAttentionTest : public testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    CpuBackendOptions options;
    options.n_threads = GetParam().n_threads;
    options.isa = std::string(cpu::isa_name(GetParam().isa));
    backend_ = make_cpu_backend(options);
  }
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
  std::vector<std::vector<float>> k_seq, v_seq;  // per sequence [n_ctx, row]
  std::vector<std::vector<int64_t>> slots;       // per sequence [n_ctx]
  std::vector<int32_t> seq_of_token, positions;  // [n_tokens]
  std::vector<float> q;                          // [n_tokens, q_row]
  float scale = 1.0f;

  int64_t n_tokens() const { return static_cast<int64_t>(positions.size()); }

  // paged_attention on the batch's tokens `tokens` (all when empty), as their own
  // batch: returns out [tokens.size(), o_row].
  std::vector<float> run(Backend& backend, std::vector<int64_t> tokens = {}) const {
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
    const float* v = sh.latent ? k_pool.data() : v_pool.data();  // the same pool for MLA
    backend.paged_attention(sub_q.data(), k_pool.data(), v, out.data(), batch,
                            sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.v_dim, scale);
    return out;
  }
};

// Block tables: every sequence gets the blocks it needs, some one spare, all drawn
// from one shuffled pool with a few blocks nobody owns. Pools full of NaN, then each
// sequence's K/V stored into its slots with kv_store. The batch: every sequence's new
// tokens, interleaved in a random order.
PagedCase make_case(Backend& backend, const Shape& sh, const std::vector<SeqStep>& seqs,
                    std::mt19937& rng) {
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
  c.k_seq.resize(n_seqs);
  c.v_seq.resize(n_seqs);
  c.slots.resize(n_seqs);
  for (int64_t s = 0; s < n_seqs; ++s) {
    c.k_seq[s] = random_floats(seqs[s].n_ctx * c.k_row, rng);
    c.v_seq[s] = sh.latent ? c.k_seq[s] : random_floats(seqs[s].n_ctx * c.v_row, rng);
    for (int p = 0; p < seqs[s].n_ctx; ++p) c.slots[s].push_back(slot_of(c.tables[s], bs, p));
    backend.kv_store(c.k_pool.data(), c.k_row, c.k_seq[s].data(), c.slots[s].data(), seqs[s].n_ctx);
    backend.kv_store(c.v_pool.data(), c.v_row, c.v_seq[s].data(), c.slots[s].data(), seqs[s].n_ctx);
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
    backend.kv_gather(c.k_pool.data(), c.k_row, c.slots[s].data(), n_ctx, k.data());
    backend.kv_gather(c.v_pool.data(), c.v_row, c.slots[s].data(), n_ctx, v.data());
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
// latent "head"; small odd-sized latents too), at block sizes 16 and 128.
TEST_P(PagedAttentionTest, MlaLatentPool) {
  const std::vector<SeqStep> seqs = {{1, 1}, {40, 1}, {129, 29}, {300, 1}, {17, 17}};
  for (const Shape& sh : {Shape{16, 16, 1, 576, 576, true}, Shape{128, 16, 1, 576, 576, true},
                          Shape{16, 5, 1, 40, 40, true}, Shape{128, 3, 1, 72, 72, true}}) {
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
    for (const Shape& sh :
         {Shape{16, 8, 1, 96, 64}, Shape{128, 9, 3, 64, 64}, Shape{5, 4, 4, 48, 48}}) {
      check_paged_attention(*backend_, sh, seqs, rng_);
      if (HasFatalFailure()) return;
    }
  }
}

// A token's output does not depend on what else is in the batch nor on the thread
// count, bit for bit (the engine's "same output alone and in a batch"): the whole
// batch, each sequence alone, and each token alone, on this backend and on a
// one-thread one, agree exactly. Long contexts make the alone runs split their keys
// over tasks where the batch does not.
TEST_P(PagedAttentionTest, BatchInvariant) {
  CpuBackendOptions options;
  options.n_threads = 1;
  options.isa = std::string(cpu::isa_name(GetParam().isa));
  std::unique_ptr<Backend> single = make_cpu_backend(options);
  const std::vector<SeqStep> seqs = {{900, 1}, {600, 40}, {300, 1}, {50, 50}, {1300, 1}};
  for (const Shape& sh :
       {Shape{16, 9, 3, 64, 64}, Shape{128, 8, 1, 96, 64}, Shape{5, 4, 4, 48, 40}}) {
    SCOPED_TRACE(shape_name(sh));
    const PagedCase c = make_case(*backend_, sh, seqs, rng_);
    const std::vector<float> all = c.run(*backend_);
    for (Backend* b : {backend_.get(), single.get()}) {
      for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s) {
        std::vector<int64_t> tokens;
        for (int64_t t = 0; t < c.n_tokens(); ++t) {
          if (c.seq_of_token[t] == s) tokens.push_back(t);
        }
        const std::vector<float> alone = c.run(*b, tokens);
        for (size_t i = 0; i < tokens.size(); ++i) {
          ASSERT_TRUE(std::equal(alone.begin() + i * c.o_row, alone.begin() + (i + 1) * c.o_row,
                                 all.begin() + tokens[i] * c.o_row))
              << "sequence " << s << " position " << c.positions[tokens[i]] << " on " << b->name();
        }
        const std::vector<float> one = c.run(*b, {tokens.back()});
        ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + tokens.back() * c.o_row))
            << "sequence " << s << " position " << c.positions[tokens.back()] << " alone";
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
  backend_->paged_attention(q.data(), k.data(), v.data(), out.data(), batch, 1, 1, hd, hd, 1.0f);
  EXPECT_NEAR(out[1], 50.0f, 1e-4f);
  EXPECT_EQ(out[0], 0.0f);
}

TEST_P(PagedAttentionTest, EmptyBatchIsANoOp) {
  PagedBatch batch;
  const int64_t offsets[1] = {0};
  batch.block_table_offsets = offsets;
  backend_->paged_attention(nullptr, nullptr, nullptr, nullptr, batch, 4, 2, 64, 64, 0.125f);
  backend_->kv_store(nullptr, 64, nullptr, nullptr, 0);
  backend_->kv_gather(nullptr, 64, nullptr, 0, nullptr);
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
    backend_->kv_store(pool.data(), row, x.data(), slots.data(), n);
    std::vector<float> back(n * row);
    backend_->kv_gather(pool.data(), row, slots.data(), n, back.data());
    EXPECT_EQ(back, x);
    // Slots not stored to are untouched.
    for (int64_t i = n; i < n_slots; ++i) {
      for (int64_t j = 0; j < row; ++j) ASSERT_EQ(pool[all[i] * row + j], -7.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, PagedAttentionTest, testing::ValuesIn(all_configs()),
                         config_name);

}  // namespace
}  // namespace dserve
