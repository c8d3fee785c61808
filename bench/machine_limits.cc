// The machine's limits that bound dserve's CPU speed, measured (not a test): the
// DRAM read bandwidth of N threads streaming a buffer far larger than the caches, and
// the int8 multiply-accumulate peak of the instruction the quantised kernels are
// built on, on N threads. Benchmarks report their figures as fractions of these.
//
//   build/bench/machine_limits [--threads N] [--mib 1024]
// prints one line: threads=N dram_read_GBps=.. int8_peak_GMACps=.. int8_insn=..
//   f32_peak_GMACps=.. f32_insn=..
//
// The int8 peak is the rate of the widest integer dot-product instruction this CPU
// has, on independent accumulators (no loads, no dependencies): AVX-512 VNNI
// vpdpbusd (64 MACs per instruction), else AVX2 vpmaddubsw with int16 adds (32 MACs;
// the Q4 kernels' inner step), else NEON sdot (16 MACs), else none measured.
// The f32 peak is the same for fused multiply-adds (AVX-512 16 MACs, AVX2 FMA 8,
// NEON fmla 4): the BF16 and FP8 weights' kernels widen to f32 and run on it.
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

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t peak_vnni() {
  __m512i acc[10];
  for (auto& a : acc) a = _mm512_setzero_si512();
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
  for (int64_t i = 0; i < kPeakIters; ++i) {
    for (auto& x : acc) {
      x = _mm512_dpbusd_epi32(x, a, b);
      __asm__ volatile("" : "+v"(x));
    }
  }
  int64_t s = 0;
  for (auto& x : acc) s += _mm512_reduce_add_epi32(x);
  return s;
}

__attribute__((target("avx2"))) int64_t peak_avx2() {
  __m256i acc[10];
  for (auto& a : acc) a = _mm256_setzero_si256();
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-5);
  for (int64_t i = 0; i < kPeakIters; ++i) {
    for (auto& x : acc) {
      x = _mm256_add_epi16(x, _mm256_maddubs_epi16(a, b));
      __asm__ volatile("" : "+x"(x));
    }
  }
  int64_t s = 0;
  for (auto& x : acc) s += _mm256_extract_epi16(x, 0);
  return s;
}

__attribute__((target("avx512f"))) int64_t peak_fma512() {
  __m512 acc[10];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 a = _mm512_set1_ps(1e-7f), b = _mm512_set1_ps(0.5f);
  for (int64_t i = 0; i < kPeakIters; ++i) {
    for (auto& x : acc) {
      x = _mm512_fmadd_ps(a, b, x);
      __asm__ volatile("" : "+v"(x));
    }
  }
  float s = 0;
  for (auto& x : acc) s += _mm512_cvtss_f32(x);
  return static_cast<int64_t>(s);
}

__attribute__((target("avx2,fma"))) int64_t peak_fma256() {
  __m256 acc[10];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 a = _mm256_set1_ps(1e-7f), b = _mm256_set1_ps(0.5f);
  for (int64_t i = 0; i < kPeakIters; ++i) {
    for (auto& x : acc) {
      x = _mm256_fmadd_ps(a, b, x);
      __asm__ volatile("" : "+x"(x));
    }
  }
  float s = 0;
  for (auto& x : acc) s += _mm256_cvtss_f32(x);
  return static_cast<int64_t>(s);
}
#endif

#if defined(__aarch64__)
int64_t peak_fmla() {
  float32x4_t acc[10];
  for (auto& a : acc) a = vdupq_n_f32(0);
  const float32x4_t a = vdupq_n_f32(1e-7f), b = vdupq_n_f32(0.5f);
  for (int64_t i = 0; i < kPeakIters; ++i) {
    for (auto& x : acc) {
      x = vfmaq_f32(x, a, b);
      __asm__ volatile("" : "+w"(x));
    }
  }
  float s = 0;
  for (auto& x : acc) s += vgetq_lane_f32(x, 0);
  return static_cast<int64_t>(s);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) int64_t peak_sdot() {
  int32x4_t acc[10];
  for (auto& a : acc) a = vdupq_n_s32(0);
  const int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-5);
  for (int64_t i = 0; i < kPeakIters; ++i) {
    for (auto& x : acc) {
      x = vdotq_s32(x, a, b);
      __asm__ volatile("" : "+w"(x));
    }
  }
  int64_t s = 0;
  for (auto& x : acc) s += vgetq_lane_s32(x, 0);
  return s;
}
#endif

struct Peak {
  const char* insn = "none";
  int macs_per_insn = 0;
  int64_t (*fn)() = nullptr;
};

Peak int8_peak_kernel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")) {
    return {"vpdpbusd-zmm", 64, peak_vnni};
  }
  if (__builtin_cpu_supports("avx2")) return {"vpmaddubsw-ymm", 32, peak_avx2};
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
  return static_cast<double>(kPeakIters) * 10 * peak.macs_per_insn * n_threads / best / 1e9;
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
