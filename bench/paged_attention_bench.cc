// Paged attention micro-benchmarks: a decode step (one token per sequence, each at
// the end of its context) and a prefill chunk over a paged KV pool with shuffled
// block tables, with F32 and F16 pools ("paged/" and "paged_f16/"), against the
// contiguous attention() run per sequence for the same work. Reports the K/V bytes
// read per second ("bytes_per_second", of the pool's own dtype) and decode tokens
// (query heads) per second.
//
// "mla_f16/", "mla_f8/", "mla_f32/": MLA's absorbed decode at R1's shape (128 heads over
// one 576-wide latent pool, values its first 512) through paged_latent_attention, with
// multiply-accumulates per second; ".../v16" keeps 16 values, to isolate the scores.
// "mla_prefill/": a 512-token prompt's attention over its expanded keys and values,
// by attention() or (".../prompt_kernel") prompt_attention().
//
// Environment: DSERVE_BENCH_ISA (scalar / avx2 / avx512; default: best available),
// DSERVE_BENCH_THREADS (default: all cores).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "bench_backend.h"
#include "tensor/half.h"

namespace dserve {
namespace {

struct Case {
  int n_seqs, n_ctx, n_new;  // each sequence: n_ctx positions, the last n_new queried
  int n_heads, n_kv_heads, head_dim, block_size;
};

// A pool holding n_seqs sequences of n_ctx positions in shuffled blocks.
struct PagedSetup {
  explicit PagedSetup(const Case& c) {
    std::mt19937 rng(11);
    std::normal_distribution<float> dist;
    const int blocks_per_seq = (c.n_ctx + c.block_size - 1) / c.block_size;
    const int n_blocks = c.n_seqs * blocks_per_seq;
    std::vector<int32_t> ids(n_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables = ids;
    for (int s = 0; s <= c.n_seqs; ++s) offsets.push_back(int64_t{s} * blocks_per_seq);
    const int64_t row = int64_t{c.n_kv_heads} * c.head_dim;
    k_pool.resize(int64_t{n_blocks} * c.block_size * row);
    v_pool.resize(k_pool.size());
    for (auto& x : k_pool) x = dist(rng);
    for (auto& x : v_pool) x = dist(rng);
    k_pool16.resize(k_pool.size());
    v_pool16.resize(v_pool.size());
    for (size_t i = 0; i < k_pool.size(); ++i) k_pool16[i] = f32_to_f16(k_pool[i]);
    for (size_t i = 0; i < v_pool.size(); ++i) v_pool16[i] = f32_to_f16(v_pool[i]);
    for (int s = 0; s < c.n_seqs; ++s) {
      for (int p = c.n_ctx - c.n_new; p < c.n_ctx; ++p) {
        seq_of_token.push_back(s);
        positions.push_back(p);
      }
    }
    const int64_t n_tokens = static_cast<int64_t>(positions.size());
    q.resize(n_tokens * c.n_heads * c.head_dim);
    for (auto& x : q) x = dist(rng);
    out.resize(q.size());
    batch.n_tokens = n_tokens;
    batch.positions = positions.data();
    batch.seq_of_token = seq_of_token.data();
    batch.n_seqs = c.n_seqs;
    batch.block_tables = tables.data();
    batch.block_table_offsets = offsets.data();
    batch.block_size = c.block_size;
  }
  std::vector<int32_t> tables, seq_of_token, positions;
  std::vector<int64_t> offsets;
  std::vector<float> k_pool, v_pool, q, out;
  std::vector<uint16_t> k_pool16, v_pool16;  // the pools as IEEE halves
  PagedBatch batch;
};

void set_counters(benchmark::State& state, const Case& c, size_t elem_bytes = sizeof(float)) {
  // Every query's K and V rows: the bytes one pass over the cache reads.
  const double kv_bytes = 2.0 * c.n_seqs * c.n_ctx * c.n_kv_heads * c.head_dim * elem_bytes;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kv_bytes));
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * c.n_seqs * c.n_new, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(bench_backend().name()));
}

void bm_paged(benchmark::State& state, Case c) {
  PagedSetup p(c);
  Backend& b = bench_backend();
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  for (auto _ : state) {
    b.paged_attention(p.q.data(), DType::kF32, p.k_pool.data(), p.v_pool.data(), p.out.data(),
                      p.batch, c.n_heads, c.n_kv_heads, c.head_dim, c.head_dim, scale);
    benchmark::DoNotOptimize(p.out.data());
  }
  set_counters(state, c);
}

void bm_paged_f16(benchmark::State& state, Case c) {
  PagedSetup p(c);
  Backend& b = bench_backend();
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  for (auto _ : state) {
    b.paged_attention(p.q.data(), DType::kF16, p.k_pool16.data(), p.v_pool16.data(),
                      p.out.data(), p.batch, c.n_heads, c.n_kv_heads, c.head_dim, c.head_dim,
                      scale);
    benchmark::DoNotOptimize(p.out.data());
  }
  set_counters(state, c, sizeof(uint16_t));
}

// The same work with contiguous K/V: attention() once per sequence.
void bm_contiguous(benchmark::State& state, Case c) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  const int64_t row = int64_t{c.n_kv_heads} * c.head_dim;
  std::vector<std::vector<float>> k(c.n_seqs), v(c.n_seqs);
  for (int s = 0; s < c.n_seqs; ++s) {
    k[s].resize(c.n_ctx * row);
    v[s].resize(c.n_ctx * row);
    for (auto& x : k[s]) x = dist(rng);
    for (auto& x : v[s]) x = dist(rng);
  }
  std::vector<int32_t> pos(c.n_new);
  std::iota(pos.begin(), pos.end(), c.n_ctx - c.n_new);
  std::vector<float> q(int64_t{c.n_new} * c.n_heads * c.head_dim), out(q.size());
  for (auto& x : q) x = dist(rng);
  Backend& b = bench_backend();
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  for (auto _ : state) {
    for (int s = 0; s < c.n_seqs; ++s) {
      b.attention(q.data(), k[s].data(), v[s].data(), out.data(), c.n_new, pos.data(), c.n_ctx,
                  c.n_heads, c.n_kv_heads, c.head_dim, c.head_dim, scale);
    }
    benchmark::DoNotOptimize(out.data());
  }
  set_counters(state, c);
}

// MLA's absorbed decode (DeepSeek-V3/R1's shape): every head of one token against one
// latent pool whose whole rows [kv_lora | rope] are the keys and whose first kv_lora
// values are the values. Reports multiply-accumulates per second (one per query
// element per key, scores and values) beside the pool bytes read.
struct MlaCase {
  int n_seqs, n_ctx, n_heads, latent, v_dim, block_size;
};

template <typename Elem>
void bm_mla(benchmark::State& state, MlaCase c, DType dtype) {
  // One latent pool: PagedSetup's key pool, one KV head of the latent's width.
  PagedSetup p(Case{c.n_seqs, c.n_ctx, 1, c.n_heads, 1, c.latent, c.block_size});
  const void* pool = p.k_pool.data();
  std::vector<uint8_t> pool8;
  if constexpr (sizeof(Elem) == 2) pool = p.k_pool16.data();
  if constexpr (sizeof(Elem) == 1) {
    pool8.resize(p.k_pool.size());
    for (size_t i = 0; i < pool8.size(); ++i) pool8[i] = f32_to_fp8_e4m3(p.k_pool[i]);
    pool = pool8.data();
  }
  Backend& b = bench_backend();
  for (auto _ : state) {
    b.paged_latent_attention(p.q.data(), dtype, pool, p.out.data(), p.batch, c.n_heads,
                             c.latent, c.v_dim, 0.05f);
    benchmark::DoNotOptimize(p.out.data());
  }
  const double keys = double(state.iterations()) * c.n_seqs * c.n_ctx;
  state.SetBytesProcessed(static_cast<int64_t>(keys * c.latent * sizeof(Elem)));
  state.counters["GMAC/s"] = benchmark::Counter(
      keys * c.n_heads * (c.latent + c.v_dim) * 1e-9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(bench_backend().name()));
}

// MLA's prompt attention at R1's shape: a 512-token prompt whose latents were expanded
// to per-head keys (128 + 64 rope dims) and values (128), causal over itself through
// attention(), as DeepseekModel::attend_expanded_run runs it. Multiply-accumulates per
// second: (192 + 128) per head per visible (query, key) pair.
// k_pad / v_pad: floats added to each position's row of keys / values.
void bm_mla_prefill(benchmark::State& state, int k_pad, int v_pad, bool prompt_kernel) {
  constexpr int kTokens = 512, kHeads = 128, kQk = 192, kV = 128;
  const int64_t k_row = kHeads * kQk + k_pad, v_row = kHeads * kV + v_pad;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  std::vector<float> q(int64_t{kTokens} * kHeads * kQk), k(kTokens * k_row), v(kTokens * v_row),
      out(int64_t{kTokens} * kHeads * kV);
  for (auto* a : {&q, &k, &v}) {
    for (auto& x : *a) x = dist(rng);
  }
  std::vector<int32_t> pos(kTokens);
  std::iota(pos.begin(), pos.end(), 0);
  Backend& b = bench_backend();
  for (auto _ : state) {
    if (prompt_kernel) {
      b.prompt_attention(q.data(), k.data(), v.data(), out.data(), kTokens, pos.data(), kTokens,
                         kHeads, kHeads, kQk, kV, 0.07f, k_row, v_row);
    } else {
      b.attention(q.data(), k.data(), v.data(), out.data(), kTokens, pos.data(), kTokens, kHeads,
                  kHeads, kQk, kV, 0.07f, k_row, v_row);
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double pairs = double(kTokens) * (kTokens + 1) / 2;
  state.counters["GMAC/s"] = benchmark::Counter(
      double(state.iterations()) * pairs * kHeads * (kQk + kV) * 1e-9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(bench_backend().name()));
}

}  // namespace
}  // namespace dserve

int main(int argc, char** argv) {
  using namespace dserve;
  struct Named {
    const char* name;
    Case c;
  };
  const Named cases[] = {
      // One layer of a `bench throughput` step: 32 requests ~80 tokens in.
      {"decode/32x80/h9kv3d64/b16", {32, 80, 1, 9, 3, 64, 16}},
      // The same with K/V small enough for L2: the kernel's arithmetic alone.
      {"decode/2x80/h9kv3d64/b16", {2, 80, 1, 9, 3, 64, 16}},
      // One sequence deep in its context (bench-compare's decode at depth 512).
      {"decode/1x576/h9kv3d64/b16", {1, 576, 1, 9, 3, 64, 16}},
      {"decode/8x2048/h9kv3d64/b16", {8, 2048, 1, 9, 3, 64, 16}},
      {"decode/8x2048/h9kv3d64/b128", {8, 2048, 1, 9, 3, 64, 128}},
      {"decode/32x1024/h32kv8d128/b16", {32, 1024, 1, 32, 8, 128, 16}},
      {"prefill/1x512of2048/h9kv3d64/b16", {1, 2048, 512, 9, 3, 64, 16}},
  };
  auto min_stat = [](const std::vector<double>& v) {
    return *std::min_element(v.begin(), v.end());
  };
  for (const Named& n : cases) {
    const std::pair<const char*, void (*)(benchmark::State&, Case)> kinds[] = {
        {"paged/", bm_paged}, {"paged_f16/", bm_paged_f16}, {"contiguous/", bm_contiguous}};
    for (const auto& [prefix, fn] : kinds) {
      const std::string name = std::string(prefix) + n.name;
      benchmark::RegisterBenchmark(name.c_str(), fn, n.c)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime()
          // On a shared machine the fastest repetition is the least disturbed one:
          // run with --benchmark_repetitions=N and read the "_min" rows.
          ->ComputeStatistics("min", min_stat, benchmark::StatisticUnit::kTime);
    }
  }
  // R1: 128 heads, latent 512 + 64, the values the latent's first 512.
  const std::pair<const char*, MlaCase> mla_cases[] = {
      {"1x4096", {1, 4096, 128, 576, 512, 16}},
      {"1x16384", {1, 16384, 128, 576, 512, 16}},
      {"1x32768", {1, 32768, 128, 576, 512, 16}},
      {"8x4096", {8, 4096, 128, 576, 512, 16}},
      // The scores' share alone: values of 16 of the 576.
      {"1x16384/v16", {1, 16384, 128, 576, 16, 16}},
  };
  for (const auto& [name, c] : mla_cases) {
    const std::pair<const char*, void (*)(benchmark::State&, MlaCase, DType)> kinds[] = {
        {"mla_f16/", [](benchmark::State& s, MlaCase m, DType) { bm_mla<uint16_t>(s, m, DType::kF16); }},
        {"mla_f8/", [](benchmark::State& s, MlaCase m, DType) { bm_mla<uint8_t>(s, m, DType::kF8_E4M3); }},
        {"mla_f32/", [](benchmark::State& s, MlaCase m, DType) { bm_mla<float>(s, m, DType::kF32); }},
    };
    for (const auto& [prefix, fn] : kinds) {
      const std::string full = std::string(prefix) + name;
      benchmark::RegisterBenchmark(full.c_str(), fn, c, DType::kF16)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->ComputeStatistics("min", min_stat, benchmark::StatisticUnit::kTime);
    }
  }
  // Rows of 128 x 192 and 128 x 128 floats are multiples of 4 KiB; "/padded" adds a
  // cache line to each (as DeepseekModel lays them out).
  for (const auto& [name, k_pad, v_pad, prompt] :
       {std::tuple{"mla_prefill/512/h128qk192v128", 0, 0, false},
        std::tuple{"mla_prefill/512/h128qk192v128/padded", 16, 16, false},
        std::tuple{"mla_prefill/512/h128qk192v128/prompt_kernel", 0, 0, true},
        std::tuple{"mla_prefill/512/h128qk192v128/padded/prompt_kernel", 16, 16, true}}) {
    benchmark::RegisterBenchmark(name, bm_mla_prefill, k_pad, v_pad, prompt)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->ComputeStatistics("min", min_stat, benchmark::StatisticUnit::kTime);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
