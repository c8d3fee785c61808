// Matmul micro-benchmarks at SmolLM2-135M shapes, per weight type, for decode
// (1 token: reports the weight bandwidth, "bytes_per_second"), batched decode (8 and
// 32 tokens, as one serving step of that many requests) and prefill (64 tokens); all
// report "GMAC/s".
//
// Each case runs on the weights as loaded ("plain") and after prepare_matmul_weight
// ("prepared", as models do at load: the CPU's packed panels where a level has them).
// The "stream/" cases decode through whole models' worth of distinct weights (a
// DeepSeek-shaped MoE's experts, SmolLM2's 30 layers), more than any cache holds.
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
                             {"vocab_65536x1024", 65536, 1024},
                             // DeepSeek-R1's routed expert (gate/up): rows read in place
                             // ("plain") are transposed per call, as the experts are.
                             {"r1_expert_2048x7168", 2048, 7168}};
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

// Decode over weights larger than the last-level cache, as a model's step reads them:
// many distinct matrices, each read once per step, several to a job, so that what a
// job costs besides streaming its bytes (hand-offs, each matrix's cold start) shows.
// bytes_per_second is the weight bytes read (compare with build/bench/machine_limits).
struct Matrix {
  std::vector<uint8_t> bytes;
  TensorView w;
};

std::unique_ptr<Matrix> make_matrix(DType t, int64_t n, int64_t k, uint32_t seed) {
  auto m = std::make_unique<Matrix>();
  m->bytes = random_weights(t, n, k);
  std::mt19937 rng(seed);  // matrices of one pool differ (same bytes would be fine too)
  for (size_t i = 0; i < m->bytes.size(); i += 4096) m->bytes[i] ^= static_cast<uint8_t>(rng() & 0x3f);
  m->w = TensorView{t, {n, k}, m->bytes.data(), m->bytes.size()};
  bench_backend().prepare_matmul_weight(m->w);
  return m;
}

// A DeepSeek-V3-shaped MoE step (tools/make_moe_gguf.py, Q8_0): 8 layers, each routing
// one token to 6 of 64 experts (512 x 1024 gate and up, 1024 x 512 down; one pool of
// 64 serves every layer) plus its own shared expert (1024 wide); gate/up of all 7 as
// one grouped job, down as another, as DeepseekModel::run_moe.
void bm_stream_moe(benchmark::State& state) {
  constexpr int kExperts = 64, kTopK = 6, kLayers = 8;
  constexpr int64_t kHidden = 1024, kInter = 512, kShared = 1024;
  const DType t = DType::kQ8_0;
  struct Mlp {
    std::unique_ptr<Matrix> gate, up, down;
  };
  // Made once: the backend keeps each weight's packed copy for the process.
  static std::vector<Mlp> routed(kExperts), shared(kLayers);
  if (routed[0].gate == nullptr) {
    uint32_t seed = 1;
    for (Mlp& e : routed) {
      e = {make_matrix(t, kInter, kHidden, seed++), make_matrix(t, kInter, kHidden, seed++),
           make_matrix(t, kHidden, kInter, seed++)};
    }
    for (Mlp& e : shared) {
      e = {make_matrix(t, kShared, kHidden, seed++), make_matrix(t, kShared, kHidden, seed++),
           make_matrix(t, kHidden, kShared, seed++)};
    }
  }
  std::vector<float> x((kTopK + 1) * kShared, 0.5f), gate((kTopK + 1) * kShared),
      up((kTopK + 1) * kShared), out((kTopK + 1) * kHidden);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (auto& v : x) v = dist(rng);
  Backend& b = bench_backend();
  int64_t bytes = 0, step = 0;
  for (auto _ : state) {
    for (int l = 0; l < kLayers; ++l, ++step) {
      std::vector<MatmulTarget> gate_up, down;
      std::vector<MatmulGroup> gu_groups, down_groups;
      gate_up.reserve(2 * (kTopK + 1));
      down.reserve(kTopK + 1);
      for (int i = 0; i <= kTopK; ++i) {
        // Distinct experts per layer (11 i mod 64 differ for i < 6), moving every step.
        const Mlp& e = i < kTopK ? routed[(step * 13 + i * 11) % kExperts] : shared[l];
        gate_up.push_back({&e.gate->w, nullptr, gate.data() + i * kShared});
        gate_up.push_back({&e.up->w, nullptr, up.data() + i * kShared});
        down.push_back({&e.down->w, nullptr, out.data() + i * kHidden});
        bytes += static_cast<int64_t>(e.gate->bytes.size() + e.up->bytes.size() + e.down->bytes.size());
      }
      for (int i = 0; i <= kTopK; ++i) {
        gu_groups.push_back({x.data() + i * kHidden, 1, &gate_up[2 * i], 2});
        down_groups.push_back({gate.data() + i * kShared, 1, &down[i], 1});
      }
      b.matmul_grouped(gu_groups.data(), static_cast<int>(gu_groups.size()));
      b.matmul_grouped(down_groups.data(), static_cast<int>(down_groups.size()));
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(bytes);
  state.SetLabel(std::string(b.name()));
}

// SmolLM2-135M's 30 layers (Q4_1, hidden 576, 9 heads / 3 KV heads of 64, FFN 1536):
// q/k/v as one job, o, gate/up as one job, down: four jobs a layer, as LlamaModel.
void bm_stream_layers(benchmark::State& state) {
  constexpr int kLayers = 30;
  constexpr int64_t kHidden = 576, kKv = 192, kInter = 1536;
  const DType t = DType::kQ4_1;
  struct Layer {
    std::unique_ptr<Matrix> q, k, v, o, gate, up, down;
  };
  static std::vector<Layer> layers(kLayers);  // made once, as above
  if (layers[0].q == nullptr) {
    uint32_t seed = 1;
    for (Layer& l : layers) {
      l = {make_matrix(t, kHidden, kHidden, seed++), make_matrix(t, kKv, kHidden, seed++),
           make_matrix(t, kKv, kHidden, seed++),     make_matrix(t, kHidden, kHidden, seed++),
           make_matrix(t, kInter, kHidden, seed++),  make_matrix(t, kInter, kHidden, seed++),
           make_matrix(t, kHidden, kInter, seed++)};
    }
  }
  int64_t layer_bytes = 0;  // all layers'
  for (const Layer& l : layers) {
    for (const Matrix* m : {l.q.get(), l.k.get(), l.v.get(), l.o.get(), l.gate.get(), l.up.get(), l.down.get()}) {
      layer_bytes += static_cast<int64_t>(m->bytes.size());
    }
  }
  std::vector<float> x(kHidden), q(kHidden), k(kKv), v(kKv), o(kHidden), gate(kInter), up(kInter);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (auto& e : x) e = dist(rng);
  Backend& b = bench_backend();
  for (auto _ : state) {
    for (const Layer& l : layers) {
      const MatmulTarget qkv[] = {{&l.q->w, nullptr, q.data()}, {&l.k->w, nullptr, k.data()},
                                  {&l.v->w, nullptr, v.data()}};
      b.matmul_many(x.data(), 1, qkv, 3);
      b.matmul(l.o->w, nullptr, q.data(), 1, o.data());
      const MatmulTarget gate_up[] = {{&l.gate->w, nullptr, gate.data()}, {&l.up->w, nullptr, up.data()}};
      b.matmul_many(x.data(), 1, gate_up, 2);
      b.matmul(l.down->w, nullptr, gate.data(), 1, o.data());
    }
    benchmark::DoNotOptimize(o.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * layer_bytes);
  state.SetLabel(std::string(b.name()));
}

// DeepSeek-R1's routed experts, n_tokens each: 16 in a prompt (a 512-token prompt's
// average: 512 x 8 of 256 experts), 1 in decoding; gate and up 2048 x 7168, down
// 7168 x 2048, Q8_0 rows read in place from 24 experts' 1.1 GB, more than any cache
// ("prepared": the packed copies a model makes where memory allows). GMAC/s against
// build/bench/machine_limits' int8 peak.
void bm_stream_r1_experts(benchmark::State& state, int64_t n_tokens, bool prepared) {
  constexpr int kExperts = 24;
  constexpr int64_t kHidden = 7168, kInter = 2048;
  const DType t = DType::kQ8_0;
  static std::vector<std::vector<uint8_t>> weights;  // gate, up, down per expert
  if (weights.empty()) {
    std::vector<uint8_t> proto = random_weights(t, kInter, kHidden);
    for (int i = 0; i < 3 * kExperts; ++i) {
      weights.push_back(proto);  // distinct copies: each is read from memory
      weights.back()[static_cast<size_t>(i) * 64] ^= 1;
    }
  }
  auto view = [&](int i) {
    const bool down = i % 3 == 2;
    return TensorView{t, {down ? kHidden : kInter, down ? kInter : kHidden}, weights[i].data(),
                      weights[i].size()};
  };
  std::vector<float> x(n_tokens * kHidden), g(n_tokens * kInter), u(n_tokens * kInter),
      o(n_tokens * kHidden);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  for (auto& v : x) v = dist(rng);
  Backend& b = bench_backend();
  if (prepared) {
    for (int i = 0; i < 3 * kExperts; ++i) b.prepare_matmul_weight(view(i));
  }
  for (auto _ : state) {
    for (int e = 0; e < kExperts; ++e) {
      b.matmul(view(3 * e), nullptr, x.data(), n_tokens, g.data());
      b.matmul(view(3 * e + 1), nullptr, x.data(), n_tokens, u.data());
      b.matmul(view(3 * e + 2), nullptr, g.data(), n_tokens, o.data());
    }
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["GMAC/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kExperts * 3 * n_tokens * kInter * kHidden * 1e-9,
      benchmark::Counter::kIsRate);
  state.SetLabel(std::string(b.name()));
}

}  // namespace
}  // namespace dserve

int main(int argc, char** argv) {
  using namespace dserve;
  // On a shared machine the fastest repetition is the least disturbed one: run with
  // --benchmark_repetitions=N and read the "_min" rows.
  auto min_of = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
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
            ->ComputeStatistics("min", min_of, benchmark::StatisticUnit::kTime);
        }
      }
    }
  }
  for (auto* b : {benchmark::RegisterBenchmark("stream/moe_q8_0_8x7_experts", bm_stream_moe),
                  benchmark::RegisterBenchmark("stream/layers_q4_1_30x576", bm_stream_layers),
                  benchmark::RegisterBenchmark("stream/r1_experts_q8_0_16_tokens",
                                               bm_stream_r1_experts, 16, false),
                  benchmark::RegisterBenchmark("stream/r1_experts_q8_0_16_tokens/prepared",
                                               bm_stream_r1_experts, 16, true),
                  benchmark::RegisterBenchmark("stream/r1_experts_q8_0_1_token",
                                               bm_stream_r1_experts, 1, false),
                  benchmark::RegisterBenchmark("stream/r1_experts_q8_0_1_token/prepared",
                                               bm_stream_r1_experts, 1, true)}) {
    b->Unit(benchmark::kMicrosecond)->UseRealTime()->ComputeStatistics("min", min_of, benchmark::StatisticUnit::kTime);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
