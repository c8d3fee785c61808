// The machine's limits that bound dserve's CPU speed, measured (not a test): the
// DRAM read bandwidth of N threads streaming a buffer far larger than the caches, and
// the int8 multiply-accumulate peak of the instruction the quantised kernels are
// built on, on N threads. Benchmarks report their figures as fractions of these.
//
//   build/bench/machine_limits [--threads N] [--mib 1024]
// prints one line: threads=N dram_read_GBps=.. int8_peak_GMACps=.. int8_insn=..
//   f32_peak_GMACps=.. f32_insn=..
//
// The int8 peak is the rate of the widest int8 dot product into int32 this CPU has,
// on independent accumulators held in registers (no loads): AVX-512 VNNI vpdpbusd
// (64 MACs per instruction), else AVX2's vpmaddubsw + vpmaddwd + vpaddd (32 MACs),
// else NEON sdot (16 MACs), else none measured. The f32 peak is the same for fused
// multiply-adds (AVX-512 16 MACs, AVX2 FMA 8, NEON fmla 4): the BF16 and FP8
// weights' kernels widen to f32 and run on it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

// Runs fn(thread) on n threads started together; returns the wall seconds of the
// slowest.
template <typename Fn>
double run_threads(int n, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load()) {
      }
      fn(i);
    });
  }
  while (ready.load() < n) {
  }
  const auto t0 = Clock::now();
  go.store(true);
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sums 64-bit words: the compiler vectorises it; the loads are what it costs.
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  return a + b + c + d;
}

double dram_read_gbps(int n_threads, size_t bytes) {
  const size_t words = bytes / 8;
  std::vector<uint64_t> buf(words);
  // Touch every page on the thread that will read it (first-touch NUMA placement).
  const size_t per = words / n_threads;
  run_threads(n_threads, [&](int t) {
    std::memset(buf.data() + t * per, t + 1, per * 8);
  });
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double s = run_threads(n_threads, [&](int t) {
      sink.fetch_add(sum_words(buf.data() + t * per, per));
    });
    best = std::max(best, static_cast<double>(per * n_threads * 8) / s / 1e9);
  }
  if (sink.load() == 42) std::puts("");  // keep the sums alive
  return best;
}

constexpr int64_t kPeakIters = 20'000'000;
// Independent accumulators per thread: enough to cover each instruction's latency on
// every core dserve targets (latency 4-5 x 2 pipes), few enough to stay in registers.
constexpr int kChains = 8;

// Eight named accumulators (an array would live in memory: GCC then stores every
// step, and the store port, not the multiplier, sets the rate). STEP(c) updates one;
// the empty asm makes each c "changed" so that no step is folded or hoisted.
#define DS_PEAK_LOOP(T, CONSTRAINT, ZERO, STEP, SUM)                    \
  T c0 = ZERO, c1 = ZERO, c2 = ZERO, c3 = ZERO, c4 = ZERO, c5 = ZERO,   \
    c6 = ZERO, c7 = ZERO;                                               \
  for (int64_t i = 0; i < kPeakIters; ++i) {                            \
    STEP(c0) STEP(c1) STEP(c2) STEP(c3) STEP(c4) STEP(c5) STEP(c6) STEP(c7) \
    __asm__ volatile("" : "+" CONSTRAINT(c0), "+" CONSTRAINT(c1), "+" CONSTRAINT(c2), \
                     "+" CONSTRAINT(c3), "+" CONSTRAINT(c4), "+" CONSTRAINT(c5), \
                     "+" CONSTRAINT(c6), "+" CONSTRAINT(c7));           \
  }                                                                     \
  return SUM(c0) + SUM(c1) + SUM(c2) + SUM(c3) + SUM(c4) + SUM(c5) + SUM(c6) + SUM(c7);

#if defined(__x86_64__)
// One vpdpbusd: 64 u8 x s8 products added into 16 int32 lanes.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t peak_vnni() {
  const __m512i b = _mm512_set1_epi8(-5);
#define STEP(c) c = _mm512_dpbusd_epi32(c, c, b);
#define SUM(c) _mm_cvtsi128_si32(_mm512_castsi512_si128(c))
  DS_PEAK_LOOP(__m512i, "v", _mm512_set1_epi8(3), STEP, SUM)
#undef STEP
#undef SUM
}

// AVX2 has no int8 dot product into int32: vpmaddubsw (32 u8 x s8 products, pairs
// added into int16) then vpmaddwd by ones (pairs into int32) and vpaddd, the three
// instructions each 32 multiply-accumulates of the quantised kernels cost at least.
// Each of the 6 steps has its own weights (b0..b5) and the activations `a` change
// every iteration, so none is merged with another or hoisted; 6 chains (not 8): 16
// ymm registers hold 6 sums, 6 weights, a and the ones.
constexpr int kAvx2Chains = 6;
__attribute__((target("avx2"))) int64_t peak_avx2() {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i b0 = _mm256_set1_epi8(-1), b1 = _mm256_set1_epi8(-2), b2 = _mm256_set1_epi8(-3),
                b3 = _mm256_set1_epi8(-4), b4 = _mm256_set1_epi8(-5), b5 = _mm256_set1_epi8(-6);
  __m256i a = _mm256_set1_epi8(3);
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  for (int64_t i = 0; i < kPeakIters; ++i) {
    __asm__ volatile("" : "+x"(a));
    c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b0), ones));
    c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b1), ones));
    c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b2), ones));
    c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b3), ones));
    c4 = _mm256_add_epi32(c4, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b4), ones));
    c5 = _mm256_add_epi32(c5, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b5), ones));
    __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5));
  }
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                       _mm256_add_epi32(c4, c5));
  return _mm_cvtsi128_si32(_mm256_castsi256_si128(sum));
}

__attribute__((target("avx512f"))) int64_t peak_fma512() {
  const __m512 a = _mm512_set1_ps(1e-7f), b = _mm512_set1_ps(0.5f);
#define STEP(c) c = _mm512_fmadd_ps(a, b, c);
#define SUM(c) static_cast<int64_t>(_mm512_cvtss_f32(c))
  DS_PEAK_LOOP(__m512, "v", _mm512_setzero_ps(), STEP, SUM)
#undef STEP
#undef SUM
}

__attribute__((target("avx2,fma"))) int64_t peak_fma256() {
  const __m256 a = _mm256_set1_ps(1e-7f), b = _mm256_set1_ps(0.5f);
#define STEP(c) c = _mm256_fmadd_ps(a, b, c);
#define SUM(c) static_cast<int64_t>(_mm256_cvtss_f32(c))
  DS_PEAK_LOOP(__m256, "x", _mm256_setzero_ps(), STEP, SUM)
#undef STEP
#undef SUM
}
#endif

#if defined(__aarch64__)
int64_t peak_fmla() {
  const float32x4_t a = vdupq_n_f32(1e-7f), b = vdupq_n_f32(0.5f);
#define STEP(c) c = vfmaq_f32(c, a, b);
#define SUM(c) static_cast<int64_t>(vgetq_lane_f32(c, 0))
  DS_PEAK_LOOP(float32x4_t, "w", vdupq_n_f32(0), STEP, SUM)
#undef STEP
#undef SUM
}

__attribute__((target("arch=armv8.2-a+dotprod"))) int64_t peak_sdot() {
  const int8x16_t b = vdupq_n_s8(-5);
#define STEP(c) c = vdotq_s32(c, vreinterpretq_s8_s32(c), b);
#define SUM(c) vgetq_lane_s32(c, 0)
  DS_PEAK_LOOP(int32x4_t, "w", vdupq_n_s32(3), STEP, SUM)
#undef STEP
#undef SUM
}
#endif

struct Peak {
  const char* insn = "none";
  int macs_per_insn = 0;  // per step of one chain
  int64_t (*fn)() = nullptr;
  int chains = kChains;   // steps per iteration
};

Peak int8_peak_kernel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) {
    return {"vpdpbusd-zmm", 64, peak_vnni};
  }
  if (__builtin_cpu_supports("avx2")) return {"vpmaddubsw+vpmaddwd-ymm", 32, peak_avx2, kAvx2Chains};
#endif
#if defined(__aarch64__) && defined(HWCAP_ASIMDDP)
  if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) return {"sdot-q", 16, peak_sdot};
#endif
  return {};
}

Peak f32_peak_kernel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {"vfmadd-zmm", 16, peak_fma512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {"vfmadd-ymm", 8, peak_fma256};
  }
#endif
#if defined(__aarch64__)
  return {"fmla-q", 4, peak_fmla};
#endif
  return {};
}

// Multiply-accumulates per second of `peak` on n threads (best of 3), 0 without one.
double peak_gmacs(const Peak& peak, int n_threads) {
  if (peak.fn == nullptr) return 0;
  std::atomic<int64_t> sink{0};
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    best = std::min(best, run_threads(n_threads, [&](int) { sink.fetch_add(peak.fn()); }));
  }
  if (sink.load() == 42) std::puts("");
  return static_cast<double>(kPeakIters) * peak.chains * peak.macs_per_insn * n_threads / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int n_threads = static_cast<int>(std::thread::hardware_concurrency());
  size_t mib = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") {
      n_threads = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--mib") {
      mib = static_cast<size_t>(std::max(64, std::atoi(argv[i + 1])));
    } else {
      std::fprintf(stderr, "usage: machine_limits [--threads N] [--mib M]\n");
      return 2;
    }
  }
  const double gbps = dram_read_gbps(n_threads, mib << 20);
  const Peak i8 = int8_peak_kernel(), f32 = f32_peak_kernel();
  const double i8_gmacs = peak_gmacs(i8, n_threads), f32_gmacs = peak_gmacs(f32, n_threads);
  std::printf("threads=%d dram_read_GBps=%.1f int8_peak_GMACps=%.1f int8_insn=%s "
              "f32_peak_GMACps=%.1f f32_insn=%s\n",
              n_threads, gbps, i8_gmacs, i8.insn, f32_gmacs, f32.insn);
  return 0;
}
