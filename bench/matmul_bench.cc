// Matmul micro-benchmarks at SmolLM2-135M shapes, per weight type, for decode
// (1 token: reports the weight bandwidth, "bytes_per_second"), batched decode (8 and
// 32 tokens, as one serving step of that many requests) and prefill (64 tokens); all
// report "GMAC/s".
//
// Each case runs on the weights as loaded ("plain") and after prepare_matmul_weight
// ("prepared", as models do at load: the CPU's packed panels where a level has them).
//
// Environment: DSERVE_BENCH_ISA (scalar / avx2 / avx512; default: best available),
// DSERVE_BENCH_THREADS (default: all cores), DSERVE_BENCH_TOKENS (comma-separated
// token counts; default 1,8,32,64).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_backend.h"
#include "tensor/dtype.h"
#include "tensor/half.h"

namespace dserve {
namespace {

struct Shape {
  const char* name;
  int64_t n_out, n_in;
};
constexpr Shape kShapes[] = {{"attn_576x576", 576, 576},
                             {"ffn_up_1536x576", 1536, 576},
                             {"ffn_down_576x1536", 576, 1536},
                             {"vocab_49152x576", 49152, 576},
                             // DeepSeek-V3-shaped (tools/make_moe_gguf.py): a vocabulary
                             // projection larger than any cache, with K-quant-sized rows.
                             {"vocab_65536x1024", 65536, 1024}};
constexpr DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16,
                            DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                            DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Random bytes with every f16 value forced finite (scales of quantised blocks land
// anywhere in a block, so simply clear the top exponent bit of every 16-bit word).
std::vector<uint8_t> random_weights(DType t, int64_t n, int64_t k) {
  std::vector<uint8_t> w(dtype_bytes(t, n * k));
  std::mt19937 rng(42);
  for (size_t i = 0; i + 1 < w.size(); i += 2) {
    uint16_t v = static_cast<uint16_t>(rng()) & 0xbfffu;
    if (t == DType::kF32 && (i / 2) % 2 == 1) v &= 0x3fffu;  // keep f32 exponents small
    std::memcpy(w.data() + i, &v, 2);
  }
  return w;
}

void bm_matmul(benchmark::State& state, DType t, Shape shape, int64_t n_tokens, bool prepared) {
  std::vector<uint8_t> bytes = random_weights(t, shape.n_out, shape.n_in);
  TensorView w{t, {shape.n_out, shape.n_in}, bytes.data(), bytes.size()};
  if (prepared) bench_backend().prepare_matmul_weight(w);
  std::vector<float> x(n_tokens * shape.n_in), y(n_tokens * shape.n_out);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (auto& v : x) v = dist(rng);
  Backend& b = bench_backend();
  for (auto _ : state) {
    b.matmul(w, nullptr, x.data(), n_tokens, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes.size());
  state.counters["GMAC/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * n_tokens * shape.n_out * shape.n_in * 1e-9,
      benchmark::Counter::kIsRate);
  state.SetLabel(std::string(b.name()));
}

}  // namespace
}  // namespace dserve

int main(int argc, char** argv) {
  using namespace dserve;
  std::vector<int64_t> token_counts = {1, 8, 32, 64};
  if (const char* list = std::getenv("DSERVE_BENCH_TOKENS")) {
    token_counts.clear();
    for (const char* p = list; *p != '\0';) {
      char* end = nullptr;
      const long v = std::strtol(p, &end, 10);
      if (end == p) break;
      if (v > 0) token_counts.push_back(v);
      p = *end == ',' ? end + 1 : end;
    }
  }
  for (int64_t n_tokens : token_counts) {
    for (DType t : kTypes) {
      for (const Shape& s : kShapes) {
        // K-quant rows are whole 256-blocks: only n_in = 1536 and 1024 qualify here.
        if (s.n_in % dtype_info(t).block_size != 0) continue;
        const std::string kind = n_tokens == 1    ? "decode/"
                                 : n_tokens == 64 ? "prefill64/"
                                                  : "batch" + std::to_string(n_tokens) + "/";
        for (bool prepared : {false, true}) {
        std::string name = kind + std::string(dtype_name(t)) + "/" + s.name +
                           (prepared ? "/prepared" : "/plain");
        benchmark::RegisterBenchmark(name.c_str(), bm_matmul, t, s, n_tokens, prepared)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime()
            // On a shared machine the fastest repetition is the least disturbed one:
            // run with --benchmark_repetitions=N and read the "_min" rows.
            ->ComputeStatistics("min", [](const std::vector<double>& v) {
              return *std::min_element(v.begin(), v.end());
            }, benchmark::StatisticUnit::kTime);
        }
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
