// Sampling micro-benchmarks at Qwen2's vocabulary (152,064): the cost of one token for
// one request under each processor, next to a full sort of the vocabulary (what the
// partial selections avoid). Run: build/bench/sampling_bench
//
// One shared x86 core (baseline ISA, Release): greedy 0.10 ms, temperature 0.23 ms,
// top_k 50 0.15 ms, top_p 0.9 0.9 ms (these logits are flat: ~15k ids can be in the
// nucleus), top_k + top_p + min_p 0.06 ms, penalties + top_p + 20 logprobs 1.3 ms;
// the full sort alone 10 ms.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "sampling/sampler.h"

namespace dserve {
namespace {

constexpr int kVocab = 152064;

std::vector<float> random_logits() {
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = normal(gen);
  return logits;
}

void run(benchmark::State& bench, SamplingOptions o) {
  const std::vector<float> logits = random_logits();
  o.max_tokens = 1 << 30;
  Result<SamplingParams> params = SamplingParams::create(o);
  std::vector<int32_t> prompt(512);
  for (int i = 0; i < 512; ++i) prompt[i] = (i * 7919) % kVocab;
  SamplingState state(std::move(params).value(), prompt, {});
  for (int i = 0; i < 256; ++i) (void)state.accept((i * 104729) % kVocab);
  Sampler sampler;
  for (auto _ : bench) benchmark::DoNotOptimize(sampler.sample(state, logits).token);
}

void BM_greedy(benchmark::State& s) { run(s, {.temperature = 0.0f}); }
void BM_temperature(benchmark::State& s) { run(s, {.temperature = 0.8f}); }
void BM_top_k_50(benchmark::State& s) { run(s, {.temperature = 0.8f, .top_k = 50}); }
void BM_top_p_0_9(benchmark::State& s) { run(s, {.temperature = 0.8f, .top_p = 0.9f}); }
void BM_top_p_0_95_top_k_50_min_p(benchmark::State& s) {
  run(s, {.temperature = 0.8f, .top_p = 0.95f, .top_k = 50, .min_p = 0.05f});
}
void BM_penalties_logprobs_20(benchmark::State& s) {
  run(s, {.temperature = 0.8f,
          .top_p = 0.9f,
          .repetition_penalty = 1.1f,
          .frequency_penalty = 0.5f,
          .presence_penalty = 0.5f,
          .logprobs = 20});
}
// The baseline the sampler avoids: sorting every (logit, id) pair.
void BM_full_sort_baseline(benchmark::State& bench) {
  const std::vector<float> logits = random_logits();
  std::vector<std::pair<float, int32_t>> pairs(kVocab);
  for (auto _ : bench) {
    for (int i = 0; i < kVocab; ++i) pairs[i] = {logits[i], i};
    std::sort(pairs.begin(), pairs.end(), std::greater<>());
    benchmark::DoNotOptimize(pairs[0]);
  }
}

BENCHMARK(BM_greedy);
BENCHMARK(BM_temperature);
BENCHMARK(BM_top_k_50);
BENCHMARK(BM_top_p_0_9);
BENCHMARK(BM_top_p_0_95_top_k_50_min_p);
BENCHMARK(BM_penalties_logprobs_20);
BENCHMARK(BM_full_sort_baseline);

}  // namespace
}  // namespace dserve

BENCHMARK_MAIN();
