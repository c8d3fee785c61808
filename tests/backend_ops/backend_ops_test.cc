// Every Backend op, on every instruction-set level this CPU supports and several
// thread counts, against plain double-precision references written here from
// dequantize_row (the obviously-right path).
//
// Tolerances:
//  - float weights (F32/F16/BF16): the kernels accumulate in FP32 over at most a few
//    thousand terms with several partial sums, so the error is below ~K/16 * 2^-24 of
//    sum|w x|; we allow 1e-5 * sum|w x|.
//  - quantised weights: the kernels quantise activations to int8 (per 32 or per 256).
//    (a) Against a reference that quantises x the same way (bit-identical rounding
//        rule, kernels.h), only FP32 rounding of the per-block scale products and
//        their sum remains: 2e-5 * sum(|w| + max|w|) |xq| covers it with margin, as
//        the Q4_0 / Q4_K offset terms are computed separately before cancelling.
//    (b) Against the pure float product, the rigorous bound is the activation
//        rounding error, |x - xq| <= d/2 per element: sum |w_i| * d_i / 2 (+ (a)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_isa.h"
#include "backend_configs.h"
#include "test_weights.h"
#include "backend/cpu/kernels.h"
#include "tensor/dequantize.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace dserve {
namespace {

using test::all_configs;
using test::BackendConfig;
using test::config_name;
using test::make_backend;
using test::Fp8Weights;
using test::random_floats;
using test::random_weights;
using test::W8A8Weights;

using cpu::CpuIsa;

constexpr DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16,
                               DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                               DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

using test::f16;

// Activation quantisation exactly as the kernels do it (kernels.h): returns x
// rounded to its int8 grid, and d/2 per element (the rounding bound).
void quantize_like_kernels(const float* x, int64_t k, int block, float* xq, float* half_step) {
  for (int64_t b = 0; b < k / block; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(x[b * block + i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < block; ++i) {
      xq[b * block + i] = std::nearbyint(x[b * block + i] * id) * d;
      half_step[b * block + i] = d / 2;
    }
  }
}

int act_block(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return 0;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1: return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return 256;
    case DType::kI8:
    case DType::kF8_E4M3:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kI32:
    case DType::kI64: return 0;
  }
  return 0;
}

class BackendOpsTest : public testing::TestWithParam<BackendConfig> {
 protected:
  void SetUp() override { backend_ = make_backend(GetParam()); }
  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{1234};
};

TEST_P(BackendOpsTest, Name) {
  EXPECT_EQ(backend_->name(), "cpu-" + std::string(cpu::isa_name(GetParam().isa)));
}

void check_matmul(Backend& backend, DType t, int64_t n, int64_t k, int64_t n_tokens, bool with_bias,
                  std::mt19937& rng) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n) + " k=" +
               std::to_string(k) + " tokens=" + std::to_string(n_tokens) +
               (with_bias ? " bias" : ""));
  std::vector<uint8_t> wbytes = random_weights(t, n, k, rng);
  TensorView w{t, {n, k}, wbytes.data(), wbytes.size()};
  std::vector<float> x = random_floats(n_tokens * k, rng);
  x[0] = 4.0f;  // an outlier, as real activations have
  std::vector<float> bias = random_floats(n, rng);
  TensorView bias_view{DType::kF32, {n}, bias.data(), bias.size() * 4};
  std::vector<float> y(n_tokens * n, NAN);
  backend.matmul(w, with_bias ? &bias_view : nullptr, x.data(), n_tokens, y.data());

  std::vector<float> wf(n * k);
  for (int64_t r = 0; r < n; ++r) dequantize_row(t, w.row(r), wf.data() + r * k, k);
  const int block = act_block(t);
  std::vector<float> xq(k), half_step(k, 0.0f);
  int n_bad = 0;
  for (int64_t tok = 0; tok < n_tokens; ++tok) {
    const float* xt = x.data() + tok * k;
    if (block > 0) {
      quantize_like_kernels(xt, k, block, xq.data(), half_step.data());
    } else {
      std::copy(xt, xt + k, xq.begin());
    }
    for (int64_t r = 0; r < n; ++r) {
      const float* wr = wf.data() + r * k;
      double wmax = 0;
      for (int64_t i = 0; i < k; ++i) wmax = std::max(wmax, std::fabs(double{wr[i]}));
      double exact = 0, same_q = 0, abs_sum = 0, q_bound = 0;
      for (int64_t i = 0; i < k; ++i) {
        exact += double{wr[i]} * xt[i];
        same_q += double{wr[i]} * xq[i];
        abs_sum += (std::fabs(double{wr[i]}) + (block > 0 ? wmax : 0)) * std::fabs(xq[i]);
        q_bound += std::fabs(double{wr[i]}) * half_step[i];
      }
      const double b = with_bias ? bias[r] : 0.0;
      const double got = y[tok * n + r];
      const double tol = (block > 0 ? 2e-5 : 1e-5) * abs_sum + 1e-6;
      const bool ok = std::fabs(got - (same_q + b)) <= tol &&
                      std::fabs(got - (exact + b)) <= q_bound * 1.001 + tol;
      if (!ok && ++n_bad <= 5) {
        ADD_FAILURE() << "row " << r << " token " << tok << ": got " << got << ", same-quant ref "
                      << same_q + b << " (tol " << tol << "), float ref " << exact + b
                      << " (bound " << q_bound << ")";
      }
    }
  }
}

TEST_P(BackendOpsTest, MatmulFloatWeights) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t k : {83, 576}) {
      for (int64_t n_tokens : {1, 37}) {
        check_matmul(*backend_, t, 45, k, n_tokens, false, rng_);
      }
    }
    check_matmul(*backend_, t, 70, 64, 70, true, rng_);
  }
}

TEST_P(BackendOpsTest, MatmulBlockQuantised) {
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    // Block counts 3, 13 and 18 reach every tail path of the grouped SIMD kernels.
    for (int64_t k : {96, 416, 576}) {
      for (int64_t n_tokens : {1, 37}) {
        check_matmul(*backend_, t, 45, k, n_tokens, false, rng_);
      }
    }
    check_matmul(*backend_, t, 70, 64, 70, true, rng_);
  }
}

TEST_P(BackendOpsTest, MatmulKQuantised) {
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t k : {256, 768}) {
      for (int64_t n_tokens : {1, 37}) {
        check_matmul(*backend_, t, 45, k, n_tokens, false, rng_);
      }
    }
    check_matmul(*backend_, t, 70, 256, 70, true, rng_);
  }
}

TEST_P(BackendOpsTest, MatmulBatchedEdges) {
  // Levels with batched kernels (kernels.h: matmul_batched) tile 16 rows x 12 tokens
  // and take up to 240 tokens per call: row and token counts on both sides of those
  // edges, one token (the per-row path) and two (the smallest batched call).
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    for (int64_t n : {1, 15, 16, 17, 33}) {
      for (int64_t n_tokens : {1, 2, 5, 11, 12, 13, 24, 31}) {
        check_matmul(*backend_, t, n, 96, n_tokens, false, rng_);
      }
    }
    check_matmul(*backend_, t, 19, 576, 241, true, rng_);
    check_matmul(*backend_, t, 40, 1536, 1, false, rng_);
  }
}

TEST_P(BackendOpsTest, MatmulIsBatchInvariant) {
  // The engine needs a token's result bit-for-bit the same alone and in any batch
  // (a request gives the same tokens alone and among others): each token of a
  // batched call against the same token in a call of its own.
  for (DType t : kAllTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t n = 37, k = 256, n_tokens = 29;
    std::vector<uint8_t> wbytes = random_weights(t, n, k, rng_);
    TensorView w{t, {n, k}, wbytes.data(), wbytes.size()};
    std::vector<float> x = random_floats(n_tokens * k, rng_);
    std::vector<float> y(n_tokens * n), y1(n);
    backend_->matmul(w, nullptr, x.data(), n_tokens, y.data());
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
      backend_->matmul(w, nullptr, x.data() + tok * k, 1, y1.data());
      ASSERT_EQ(std::memcmp(y1.data(), y.data() + tok * n, n * sizeof(float)), 0)
          << "token " << tok;
    }
  }
}

TEST(CpuKernelsTest, BatchedMatmulEqualsPerRowKernels) {
  // A level's batched kernels must give its per-row kernels' results bit for bit
  // (kernels_avx512_gemm.h): block counts with and without tail blocks, token counts
  // around the tile width, rows around the panel height.
  std::mt19937 rng(99);
  for (CpuIsa isa : cpu::supported_isas()) {
    const cpu::KernelTable& kt = cpu::kernels_for(isa);
    for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
      if (kt.matmul_batched[static_cast<int>(t)] == nullptr) continue;
      for (int64_t k : {96, 256, 576, 1536}) {
        for (int64_t n_tokens : {1, 3, 12, 13}) {
          SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + std::string(dtype_name(t)) +
                       " k=" + std::to_string(k) + " tokens=" + std::to_string(n_tokens));
          const int64_t n = 21;
          std::vector<uint8_t> w = random_weights(t, n, k, rng);
          std::vector<float> x = random_floats(n_tokens * k, rng);
          const int64_t x_stride = cpu::act_row_bytes(cpu::ActFormat::kQ8x32, k);
          std::vector<uint8_t> rows(x_stride * n_tokens);
          const int64_t tile = cpu::q8x32_call_tile(kt.matmul_batched_tile, n_tokens);
          std::vector<uint8_t> tiles(cpu::q8x32_tiles_bytes(k, n_tokens, tile));
          for (int64_t i = 0; i < n_tokens; ++i) {
            kt.quantize_q8x32(x.data() + i * k, k, rows.data() + i * x_stride);
            cpu::q8x32_copy_to_tiles(rows.data() + i * x_stride, k, i, tile, tiles.data());
          }
          const size_t w_stride = dtype_bytes(t, k);
          std::vector<float> want(n_tokens * n), got(n_tokens * n);
          kt.matmul[static_cast<int>(t)](w.data(), w_stride, rows.data(), x_stride, k, n,
                                         n_tokens, want.data(), n);
          std::vector<uint8_t> scratch(cpu::matmul_batched_scratch_bytes(k) + 64);
          uint8_t* aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64);
          kt.matmul_batched[static_cast<int>(t)](w.data(), w_stride, tiles.data(), k, n, n_tokens,
                                                 got.data(), n, aligned);
          EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(CpuKernelsTest, BatchedKQuantMatmulEqualsPerRowKernels) {
  // The same for the K-quants (batched kernels over Q8x256 rows) on the levels where
  // both kernels serve calls (matmul_batched_min_tokens > 1: ARM's per-row kernel takes
  // calls of 1-3 tokens; the x86 levels' batched kernels take every call): token counts
  // around ARM's groups of 4 and 16, one and several blocks.
  std::mt19937 rng(7);
  for (CpuIsa isa : cpu::supported_isas()) {
    const cpu::KernelTable& kt = cpu::kernels_for(isa);
    if (kt.matmul_batched_min_tokens <= 1) continue;
    for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
      if (kt.matmul_batched[static_cast<int>(t)] == nullptr) continue;
      for (int64_t k : {256, 768}) {
        for (int64_t n_tokens : {1, 5, 6, 7, 16, 17, 35}) {
          SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + std::string(dtype_name(t)) +
                       " k=" + std::to_string(k) + " tokens=" + std::to_string(n_tokens));
          const int64_t n = 19;
          std::vector<uint8_t> w = random_weights(t, n, k, rng);
          std::vector<float> x = random_floats(n_tokens * k, rng);
          const int64_t x_stride = cpu::act_row_bytes(cpu::ActFormat::kQ8x256, k);
          std::vector<uint8_t> rows(x_stride * n_tokens);
          for (int64_t i = 0; i < n_tokens; ++i) kt.quantize_q8x256(x.data() + i * k, k, rows.data() + i * x_stride);
          const size_t w_stride = dtype_bytes(t, k);
          std::vector<float> want(n_tokens * n), got(n_tokens * n);
          kt.matmul[static_cast<int>(t)](w.data(), w_stride, rows.data(), x_stride, k, n, n_tokens,
                                         want.data(), n);
          std::vector<uint8_t> scratch(cpu::matmul_batched_scratch_bytes(k) + 64);
          uint8_t* aligned = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64);
          kt.matmul_batched[static_cast<int>(t)](w.data(), w_stride, rows.data(), k, n, n_tokens,
                                                 got.data(), n, aligned);
          EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(CpuKernelsTest, KQuantPackedKernelsAgreeAcrossX86Levels) {
  // AVX-512's K-quant panels (16 rows, vpdpbusd) and AVX2's (8-row halves, vpmaddubsw)
  // compute the same exact integer sums and then the same float operations per row and
  // token: the same bits, through matmul_packed on weights packed by each level, for
  // row counts around both panel heights and token counts around both tiles. Needs a
  // machine with both levels.
  const std::vector<CpuIsa> isas = cpu::supported_isas();
  if (std::find(isas.begin(), isas.end(), CpuIsa::kAvx512) == isas.end()) {
    GTEST_SKIP() << "needs an AVX-512 machine";
  }
  const cpu::KernelTable& a = cpu::kernels_for(CpuIsa::kAvx2);
  const cpu::KernelTable& b = cpu::kernels_for(CpuIsa::kAvx512);
  std::mt19937 rng(11);
  auto run = [](const cpu::KernelTable& kt, DType t, const std::vector<uint8_t>& w, const uint8_t* rows,
                int64_t n, int64_t k, int64_t n_tokens) {
    const int ti = static_cast<int>(t);
    const int64_t n_panels = (n + cpu::kMatmulPackRows - 1) / cpu::kMatmulPackRows;
    std::vector<uint8_t> packed(n_panels * kt.packed_layout[ti].panel_bytes(k) + 64);
    uint8_t* aligned = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64);
    kt.pack_weight[ti](w.data(), dtype_bytes(t, k), n, k, aligned);
    std::vector<float> y(n_tokens * n, NAN);
    kt.matmul_packed[ti](aligned, rows, k, n, n_tokens, y.data(), n, nullptr);
    return y;
  };
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    ASSERT_NE(a.matmul_packed[static_cast<int>(t)], nullptr);
    ASSERT_NE(b.matmul_packed[static_cast<int>(t)], nullptr);
    for (int64_t k : {256, 768}) {
      for (int64_t n : {1, 8, 9, 16, 17, 40}) {
        for (int64_t n_tokens : {1, 6, 7, 8, 9, 19}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " k=" + std::to_string(k) + " n=" + std::to_string(n) +
                       " tokens=" + std::to_string(n_tokens));
          std::vector<uint8_t> w = random_weights(t, n, k, rng);
          std::vector<float> x = random_floats(n_tokens * k, rng);
          const int64_t x_stride = cpu::act_row_bytes(cpu::ActFormat::kQ8x256, k);
          std::vector<uint8_t> rows(x_stride * n_tokens);
          for (int64_t i = 0; i < n_tokens; ++i) a.quantize_q8x256(x.data() + i * k, k, rows.data() + i * x_stride);
          const std::vector<float> want = run(a, t, w, rows.data(), n, k, n_tokens);
          const std::vector<float> got = run(b, t, w, rows.data(), n, k, n_tokens);
          EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(CpuKernelsTest, PackedMatmulEqualsPerRowKernels) {
  // Weights packed at load (KernelTable::pack_weight) through matmul_packed, and
  // activations quantised straight into tiles, against the per-row kernels on the
  // plain rows: bit for bit, for row counts around the panel height.
  std::mt19937 rng(7);
  for (CpuIsa isa : cpu::supported_isas()) {
    const cpu::KernelTable& kt = cpu::kernels_for(isa);
    for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
      const int ti = static_cast<int>(t);
      if (kt.matmul_packed[ti] == nullptr) continue;
      for (int64_t k : {96, 576}) {
        for (int64_t n : {1, 16, 17, 40}) {
          for (int64_t n_tokens : {1, 2, 12, 25}) {
            SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + std::string(dtype_name(t)) +
                         " k=" + std::to_string(k) + " n=" + std::to_string(n) +
                         " tokens=" + std::to_string(n_tokens));
            std::vector<uint8_t> w = random_weights(t, n, k, rng);
            std::vector<float> x = random_floats(n_tokens * k, rng);
            std::fill_n(x.begin() + 32, 32, 0.0f);  // an all-zero block: scale 0
            x[70] = 1e4f;                            // and an outlier
            const int64_t tile = cpu::q8x32_call_tile(kt.matmul_batched_tile, n_tokens);
            const int64_t x_stride = cpu::act_row_bytes(cpu::ActFormat::kQ8x32, k);
            std::vector<uint8_t> rows(x_stride * n_tokens);
            std::vector<uint8_t> tiles(cpu::q8x32_tiles_bytes(k, n_tokens, tile), 0);
            std::vector<uint8_t> fused(tiles.size(), 0);
            for (int64_t i = 0; i < n_tokens; ++i) {
              kt.quantize_q8x32(x.data() + i * k, k, rows.data() + i * x_stride);
              cpu::q8x32_copy_to_tiles(rows.data() + i * x_stride, k, i, tile, tiles.data());
              kt.quantize_q8x32_tiles(x.data() + i * k, k, i, tile, fused.data());
            }
            EXPECT_EQ(tiles, fused) << "quantize_q8x32_tiles differs from quantise + copy";
            const size_t w_stride = dtype_bytes(t, k);
            const int64_t n_panels = (n + cpu::kMatmulPackRows - 1) / cpu::kMatmulPackRows;
            std::vector<uint8_t> packed(n_panels * kt.packed_layout[ti].panel_bytes(k) + 64);
            uint8_t* aligned =
                packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64);
            kt.pack_weight[ti](w.data(), w_stride, n, k, aligned);
            std::vector<float> want(n_tokens * n), got(n_tokens * n, NAN);
            kt.matmul[ti](w.data(), w_stride, rows.data(), x_stride, k, n, n_tokens, want.data(),
                          n);
            kt.matmul_packed[ti](aligned, fused.data(), k, n, n_tokens, got.data(), n, nullptr);
            EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
          }
        }
      }
    }
  }
}

TEST_P(BackendOpsTest, PreparedWeightsGiveTheSameBits) {
  // prepare_matmul_weight may keep a packed copy; matmul must give the same bits with
  // it as without, use it only for a view of the same data and shape, and take a
  // second preparation of the same memory (new contents) instead of the old copy.
  std::unique_ptr<Backend> plain = make_backend(GetParam());
  for (DType t : kAllTypes) {
    const int64_t k = act_block(t) == 256 ? 512 : 576;
    for (int64_t n : {16, 45}) {
      for (int64_t n_tokens : {1, 13, 32}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n) +
                     " tokens=" + std::to_string(n_tokens));
        std::vector<uint8_t> wbytes = random_weights(t, n, k, rng_);
        TensorView w{t, {n, k}, wbytes.data(), wbytes.size()};
        std::vector<float> x = random_floats(n_tokens * k, rng_);
        std::vector<float> want(n_tokens * n), got(n_tokens * n, NAN);
        plain->matmul(w, nullptr, x.data(), n_tokens, want.data());
        backend_->prepare_matmul_weight(w);
        backend_->matmul(w, nullptr, x.data(), n_tokens, got.data());
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);

        // The first rows only: another shape over the same data.
        TensorView head{t, {n - 3, k}, wbytes.data(), dtype_bytes(t, (n - 3) * k)};
        std::vector<float> want_head((n - 3) * n_tokens), got_head((n - 3) * n_tokens, NAN);
        plain->matmul(head, nullptr, x.data(), n_tokens, want_head.data());
        backend_->matmul(head, nullptr, x.data(), n_tokens, got_head.data());
        EXPECT_EQ(std::memcmp(want_head.data(), got_head.data(), want_head.size() * 4), 0);

        // New contents in the same memory, prepared again.
        const std::vector<uint8_t> other = random_weights(t, n, k, rng_);
        std::copy(other.begin(), other.end(), wbytes.begin());
        backend_->prepare_matmul_weight(w);
        plain->matmul(w, nullptr, x.data(), n_tokens, want.data());
        backend_->matmul(w, nullptr, x.data(), n_tokens, got.data());
        EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST_P(BackendOpsTest, PreparedWeightBytesCountTheCopies) {
  // Memory budgets count prepared copies: a packed copy holds the rows' quants and
  // scales in whole 16-row panels (scales may widen from F16 to F32: at most 2 more
  // bytes per 32-value block); preparing the same memory again replaces it.
  for (DType t : kAllTypes) {
    const int64_t k = act_block(t) == 256 ? 512 : 576;
    std::unique_ptr<Backend> backend = make_backend(GetParam());
    int64_t total = 0;
    std::vector<std::vector<uint8_t>> keep;
    for (int64_t n : {16, 45}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n=" + std::to_string(n));
      keep.push_back(random_weights(t, n, k, rng_));
      TensorView w{t, {n, k}, keep.back().data(), keep.back().size()};
      backend->prepare_matmul_weight(w);
      const int64_t added = backend->prepared_weight_bytes() - total;
      total += added;
      if (added == 0) continue;  // this level reads this type in place
      const int64_t rows = dtype_bytes(t, (n + 15) / 16 * 16 * k);
      EXPECT_GE(added, rows);
      EXPECT_LE(added, rows + (n + 15) / 16 * 16 * (k / 32) * 2);
      backend->prepare_matmul_weight(w);
      EXPECT_EQ(backend->prepared_weight_bytes(), total);
    }
    // Q4_1 is the default model's type: the fastest level packs it.
    if (t == DType::kQ4_1 && GetParam().isa == cpu::CpuIsa::kAvx512) {
      EXPECT_GT(total, 0);
    }
  }
}

TEST_P(BackendOpsTest, MatmulManyEqualsOneByOne) {
  // One input, several weights of different types (some prepared, one with a bias):
  // each output as its own matmul gives it, bit for bit.
  const int64_t k = 512;
  const std::vector<std::pair<DType, int64_t>> specs = {
      {DType::kQ4_1, 45}, {DType::kQ8_0, 16}, {DType::kF32, 7}, {DType::kQ4_K, 20},
      {DType::kQ4_0, 33}};
  std::vector<std::vector<uint8_t>> wbytes;
  std::vector<TensorView> ws;
  for (const auto& [t, n] : specs) wbytes.push_back(random_weights(t, n, k, rng_));
  for (size_t i = 0; i < specs.size(); ++i) {
    ws.push_back({specs[i].first, {specs[i].second, k}, wbytes[i].data(), wbytes[i].size()});
  }
  backend_->prepare_matmul_weight(ws[0]);
  backend_->prepare_matmul_weight(ws[1]);
  std::vector<float> bias = random_floats(specs[1].second, rng_);
  const TensorView bias_view{DType::kF32, {specs[1].second}, bias.data(), bias.size() * 4};
  for (int64_t n_tokens : {1, 5, 29}) {
    SCOPED_TRACE("tokens=" + std::to_string(n_tokens));
    std::vector<float> x = random_floats(n_tokens * k, rng_);
    std::vector<std::vector<float>> want, got;
    std::vector<MatmulTarget> targets;
    for (size_t i = 0; i < ws.size(); ++i) {
      want.emplace_back(n_tokens * specs[i].second);
      got.emplace_back(n_tokens * specs[i].second, NAN);
      const TensorView* b = i == 1 ? &bias_view : nullptr;
      backend_->matmul(ws[i], b, x.data(), n_tokens, want[i].data());
      targets.push_back({&ws[i], b, got[i].data()});
    }
    backend_->matmul_many(x.data(), n_tokens, targets.data(), static_cast<int>(targets.size()));
    for (size_t i = 0; i < ws.size(); ++i) {
      EXPECT_EQ(std::memcmp(want[i].data(), got[i].data(), want[i].size() * 4), 0)
          << dtype_name(specs[i].first);
    }
  }
}

// One group of matmul_grouped: a weight, its own input of n_tokens tokens.
struct GroupSpec {
  DType t;
  int64_t n, k, n_tokens;
  bool prepare;  // the weight packed at load (prepare_matmul_weight)
};

// matmul_grouped over `specs` gives each output as its own matmul does, bit for bit.
void check_grouped_matmul(Backend& backend, const std::vector<GroupSpec>& specs, std::mt19937& rng) {
  std::vector<std::vector<uint8_t>> wbytes;
  std::vector<TensorView> ws;
  std::vector<std::vector<float>> xs, want, got;
  for (const GroupSpec& s : specs) {
    wbytes.push_back(random_weights(s.t, s.n, s.k, rng));
    xs.push_back(random_floats(std::max<int64_t>(s.n_tokens, 1) * s.k, rng));
    want.emplace_back(s.n_tokens * s.n);
    got.emplace_back(s.n_tokens * s.n, NAN);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    ws.push_back({specs[i].t, {specs[i].n, specs[i].k}, wbytes[i].data(), wbytes[i].size()});
    if (specs[i].prepare) backend.prepare_matmul_weight(ws[i]);
  }
  std::vector<MatmulTarget> targets(specs.size());
  std::vector<MatmulGroup> groups(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].n_tokens > 0) {
      backend.matmul(ws[i], nullptr, xs[i].data(), specs[i].n_tokens, want[i].data());
    }
    targets[i] = {&ws[i], nullptr, got[i].data()};
    groups[i] = {xs[i].data(), specs[i].n_tokens, &targets[i], 1};
  }
  backend.matmul_grouped(groups.data(), static_cast<int>(groups.size()));
  for (size_t i = 0; i < specs.size(); ++i) {
    if (want[i].empty()) continue;  // the group without tokens: nothing to compare
    EXPECT_EQ(std::memcmp(want[i].data(), got[i].data(), want[i].size() * 4), 0)
        << "group " << i << " " << dtype_name(specs[i].t);
  }
}

TEST_P(BackendOpsTest, MatmulGroupedEqualsOneByOne) {
  // Groups with inputs of their own (a MoE layer's experts): row lengths, token
  // counts (one, none, more than a tile) and types that differ between groups, some
  // weights prepared.
  check_grouped_matmul(*backend_,
                       {{DType::kQ8_0, 40, 256, 1, true},  {DType::kQ4_1, 33, 256, 13, true},
                        {DType::kQ4_0, 16, 96, 0, false},  {DType::kQ4_K, 20, 512, 3, false},
                        {DType::kQ4_1, 70, 576, 2, false}, {DType::kF32, 9, 64, 5, false},
                        {DType::kQ8_0, 17, 96, 31, false}},
                       rng_);
}

TEST_P(BackendOpsTest, MatmulGroupedDecodeEqualsOneByOne) {
  // A decode step's grouped job (one token per group: a MoE layer's experts): its
  // tasks run across the ends of targets into the next, each kernel prefetching the
  // next target's panels, which may have another row length or type or no packed
  // form.
  check_grouped_matmul(*backend_,
                       {{DType::kQ8_0, 40, 256, 1, true},  {DType::kQ8_0, 64, 512, 1, true},
                        {DType::kQ4_1, 33, 256, 1, true},  {DType::kQ4_K, 20, 512, 1, true},
                        {DType::kQ4_0, 17, 96, 1, false},  {DType::kF32, 9, 64, 1, false},
                        {DType::kQ4_0, 48, 1024, 1, true}, {DType::kQ6_K, 16, 256, 1, true},
                        {DType::kQ8_0, 1, 64, 1, true}},
                       rng_);
}

TEST_P(BackendOpsTest, MatmulManyRows) {
  // More rows than one task takes, so the split over the pool is exercised.
  check_matmul(*backend_, DType::kQ4_1, 1000, 64, 1, false, rng_);
  check_matmul(*backend_, DType::kQ4_1, 1000, 64, 2, false, rng_);
  check_matmul(*backend_, DType::kQ8_0, 1000, 64, 29, false, rng_);
  check_matmul(*backend_, DType::kF32, 1000, 40, 3, false, rng_);
}

TEST_P(BackendOpsTest, GetRows) {
  for (DType t : kAllTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t n_rows = 20, len = 512;
    std::vector<uint8_t> bytes = random_weights(t, n_rows, len, rng_);
    TensorView table{t, {n_rows, len}, bytes.data(), bytes.size()};
    std::vector<int32_t> ids = {3, 0, 19, 3, 7};
    std::vector<float> out(ids.size() * len), want(len);
    backend_->get_rows(table, ids.data(), ids.size(), out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      dequantize_row(t, table.row(ids[i]), want.data(), len);
      ASSERT_EQ(0, std::memcmp(want.data(), out.data() + i * len, len * 4)) << "id " << i;
    }
  }
}

TEST_P(BackendOpsTest, RmsNorm) {
  for (int64_t n : {7, 64, 576}) {
    for (DType wt : {DType::kF32, DType::kBF16}) {
      const int64_t n_tokens = 37;
      std::vector<float> x = random_floats(n_tokens * n, rng_, 3.0f);
      std::vector<float> wf = random_floats(n, rng_);
      std::vector<uint16_t> wb(n);
      for (int64_t i = 0; i < n; ++i) {
        wb[i] = f32_to_bf16(wf[i]);
        if (wt == DType::kBF16) wf[i] = bf16_to_f32(wb[i]);
      }
      TensorView w = wt == DType::kF32 ? TensorView{wt, {n}, wf.data(), size_t(n) * 4}
                                       : TensorView{wt, {n}, wb.data(), size_t(n) * 2};
      std::vector<float> out(x.size());
      backend_->rms_norm(x.data(), w, 1e-5f, n_tokens, n, out.data());
      for (int64_t t = 0; t < n_tokens; ++t) {
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) ss += double{x[t * n + i]} * x[t * n + i];
        const double r = 1.0 / std::sqrt(ss / n + 1e-5);
        for (int64_t i = 0; i < n; ++i) {
          const double want = x[t * n + i] * r * wf[i];
          ASSERT_NEAR(out[t * n + i], want, 1e-5 * std::fabs(want) + 1e-6) << "t " << t << " i " << i;
        }
      }
      backend_->rms_norm(x.data(), w, 1e-5f, n_tokens, n, x.data());  // in place
      ASSERT_EQ(0, std::memcmp(x.data(), out.data(), out.size() * 4));
    }
  }
}

TEST_P(BackendOpsTest, SiluMulAndAdd) {
  for (int64_t n : {1, 17, 1536, 100003}) {
    std::vector<float> g = random_floats(n, rng_, 4.0f), u = random_floats(n, rng_);
    std::vector<float> out(n);
    backend_->silu_mul(g.data(), u.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const double want = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
      ASSERT_NEAR(out[i], want, 2e-6 * std::fabs(want) + 1e-7) << i;
    }
    std::vector<float> x = g;
    backend_->add_inplace(x.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], g[i] + u[i]) << i;
  }
}

TEST_P(BackendOpsTest, Rope) {
  const int n_heads = 3, head_dim = 16, n_pos = 100;
  for (int rotary_dim : {16, 8}) {
    std::vector<float> cos_t(n_pos * rotary_dim / 2), sin_t(cos_t.size());
    for (int p = 0; p < n_pos; ++p) {
      for (int i = 0; i < rotary_dim / 2; ++i) {
        const double a = p * std::pow(10000.0, -2.0 * i / rotary_dim);
        cos_t[p * rotary_dim / 2 + i] = std::cos(a);
        sin_t[p * rotary_dim / 2 + i] = std::sin(a);
      }
    }
    RopeTable table{rotary_dim, n_pos, cos_t.data(), sin_t.data()};
    for (bool interleaved : {false, true}) {
      for (int n_tokens : {1, 37}) {
        std::vector<int32_t> pos(n_tokens);
        for (int t = 0; t < n_tokens; ++t) pos[t] = (t * 7 + 3) % n_pos;
        std::vector<float> x = random_floats(n_tokens * n_heads * head_dim, rng_);
        std::vector<float> want = x;
        for (int t = 0; t < n_tokens; ++t) {
          for (int h = 0; h < n_heads; ++h) {
            float* v = want.data() + (t * n_heads + h) * head_dim;
            const float* src = x.data() + (t * n_heads + h) * head_dim;
            for (int i = 0; i < rotary_dim / 2; ++i) {
              const int a = interleaved ? 2 * i : i;
              const int b = interleaved ? 2 * i + 1 : i + rotary_dim / 2;
              const double c = cos_t[pos[t] * rotary_dim / 2 + i];
              const double s = sin_t[pos[t] * rotary_dim / 2 + i];
              v[a] = src[a] * c - src[b] * s;
              v[b] = src[a] * s + src[b] * c;
            }
          }
        }
        backend_->rope(x.data(), n_tokens, n_heads, head_dim, pos.data(), table, interleaved);
        for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], want[i], 1e-6) << i;
      }
    }
  }
}

// Causal attention in double precision, from its definition: out[t, h] = sum_j
// softmax_j(scale q[t, h] . k[j, kvh]) v[j, kvh] over keys 0 .. pos[t], kvh = h / group.
struct AttentionCase {
  int64_t n_tokens, first_pos, n_kv;
  int n_heads, n_kv_heads, head_dim, v_dim;
};
std::vector<double> attention_reference(const AttentionCase& c, const std::vector<float>& q,
                                        const std::vector<float>& k, const std::vector<float>& v,
                                        const std::vector<int32_t>& pos, float scale) {
  const int group = c.n_heads / c.n_kv_heads;
  std::vector<double> out(c.n_tokens * c.n_heads * c.v_dim);
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int h = 0; h < c.n_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> s(pos[t] + 1);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= pos[t]; ++j) {
        double d = 0;
        for (int i = 0; i < c.head_dim; ++i) {
          d += double{q[(t * c.n_heads + h) * c.head_dim + i]} *
               k[(j * c.n_kv_heads + kvh) * c.head_dim + i];
        }
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int i = 0; i < c.v_dim; ++i) {
        double want = 0;
        for (int j = 0; j <= pos[t]; ++j) want += s[j] / sum * v[(j * c.n_kv_heads + kvh) * c.v_dim + i];
        out[(t * c.n_heads + h) * c.v_dim + i] = want;
      }
    }
  }
  return out;
}

// attention() or prompt_attention() of one case against the reference, and the same
// keys and values in padded rows (k_row, v_row) giving the same bits. Returns the
// output, with the inputs, for further checks.
struct AttentionRun {
  std::vector<float> q, k, v, out;
  std::vector<int32_t> pos;
  float scale;
};
AttentionRun check_attention(Backend& backend, const AttentionCase& c, bool prompt,
                             std::mt19937& rng) {
  SCOPED_TRACE("tokens " + std::to_string(c.n_tokens) + " n_kv " + std::to_string(c.n_kv) +
               " head_dim " + std::to_string(c.head_dim) + (prompt ? " prompt" : ""));
  AttentionRun r;
  r.q = random_floats(c.n_tokens * c.n_heads * c.head_dim, rng);
  r.k = random_floats(c.n_kv * c.n_kv_heads * c.head_dim, rng);
  r.v = random_floats(c.n_kv * c.n_kv_heads * c.v_dim, rng);
  r.pos.resize(c.n_tokens);
  for (int64_t t = 0; t < c.n_tokens; ++t) r.pos[t] = static_cast<int32_t>(c.first_pos + t);
  r.scale = 1.0f / std::sqrt(float(c.head_dim));
  auto run = [&](const float* k, const float* v, float* out, int64_t k_row, int64_t v_row) {
    auto fn = prompt ? &Backend::prompt_attention : &Backend::attention;
    (backend.*fn)(r.q.data(), k, v, out, c.n_tokens, r.pos.data(), c.n_kv, c.n_heads,
                  c.n_kv_heads, c.head_dim, c.v_dim, r.scale, k_row, v_row);
  };
  r.out.resize(c.n_tokens * c.n_heads * c.v_dim);
  run(r.k.data(), r.v.data(), r.out.data(), 0, 0);
  const std::vector<double> want = attention_reference(c, r.q, r.k, r.v, r.pos, r.scale);
  for (size_t i = 0; i < want.size(); ++i) {
    if (!(std::fabs(r.out[i] - want[i]) <= 1e-5)) {
      ADD_FAILURE() << "output " << i << ": got " << r.out[i] << ", want " << want[i];
      break;
    }
  }
  const int64_t k_len = int64_t{c.n_kv_heads} * c.head_dim, v_len = int64_t{c.n_kv_heads} * c.v_dim;
  const int64_t k_row = k_len + 5, v_row = v_len + 16;
  std::vector<float> k_padded(c.n_kv * k_row, NAN), v_padded(c.n_kv * v_row, NAN);
  for (int64_t j = 0; j < c.n_kv; ++j) {
    std::copy_n(r.k.begin() + j * k_len, k_len, k_padded.begin() + j * k_row);
    std::copy_n(r.v.begin() + j * v_len, v_len, v_padded.begin() + j * v_row);
  }
  std::vector<float> out_padded(r.out.size());
  run(k_padded.data(), v_padded.data(), out_padded.data(), k_row, v_row);
  EXPECT_EQ(out_padded, r.out);
  return r;
}

TEST_P(BackendOpsTest, Attention) {
  for (const AttentionCase& c :
       {AttentionCase{1, 49, 50, 4, 2, 16, 16}, AttentionCase{37, 0, 37, 6, 2, 32, 32},
        AttentionCase{37, 13, 50, 3, 3, 8, 12}, AttentionCase{5, 300, 305, 9, 3, 64, 64}}) {
    check_attention(*backend_, c, /*prompt=*/false, rng_);
  }
}

// prompt_attention against the reference (blocks of queries partly filled, several
// key steps, a cached prefix, GQA, dims that leave vector tails, MLA's expanded shape),
// and each query's output the same bits whatever other queries the call holds: a
// prompt cut into calls at any points gives the whole call's bits.
TEST_P(BackendOpsTest, PromptAttention) {
  for (const AttentionCase& c :
       {AttentionCase{1, 0, 1, 2, 2, 16, 16}, AttentionCase{37, 0, 37, 6, 2, 32, 32},
        AttentionCase{70, 130, 200, 3, 3, 8, 12}, AttentionCase{17, 300, 317, 4, 1, 33, 7},
        AttentionCase{100, 0, 100, 4, 4, 192, 128}}) {
    const AttentionRun r = check_attention(*backend_, c, /*prompt=*/true, rng_);
    const int64_t q_row = int64_t{c.n_heads} * c.head_dim, o_row = int64_t{c.n_heads} * c.v_dim;
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 1}, {c.n_tokens - 1, c.n_tokens},
                              {c.n_tokens / 3, c.n_tokens / 3 + 19}}) {
      end = std::min(end, c.n_tokens);
      std::vector<float> part((end - begin) * o_row);
      backend_->prompt_attention(r.q.data() + begin * q_row, r.k.data(), r.v.data(), part.data(),
                                 end - begin, r.pos.data() + begin, c.n_kv, c.n_heads,
                                 c.n_kv_heads, c.head_dim, c.v_dim, r.scale);
      EXPECT_EQ(0, std::memcmp(part.data(), r.out.data() + begin * o_row, part.size() * 4))
          << "tokens [" << begin << ", " << end << ")";
    }
  }
}

// ---- W8A8 (DType::kI8): int8 rows with one scale each, activations per token ----

// The reference, written from the format's definition rather than from the kernels:
// per token d = max|x| / 127 (or the static scale, values clamped to [-127, 127]),
// q = round half to even of x * (1 / d); y = sum q_w q_x (exact, in int64) times
// w_scale * d.
std::vector<double> w8a8_reference(const W8A8Weights& w, const std::vector<float>& x,
                                   int64_t n_tokens) {
  const int64_t n = w.view.shape[0], k = w.view.shape[1];
  std::vector<double> y(n_tokens * n);
  std::vector<int> xq(k);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x.data() + t * k;
    float d = w.view.input_scale;
    if (d == 0.0f) {
      float amax = 0.0f;
      for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(xt[i]));
      d = amax / 127.0f;
    }
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      xq[i] = std::clamp(static_cast<int>(std::nearbyint(xt[i] * id)), -127, 127);
    }
    for (int64_t r = 0; r < n; ++r) {
      int64_t sum = 0;
      for (int64_t i = 0; i < k; ++i) sum += int64_t{w.q[r * k + i]} * xq[i];
      y[t * n + r] = static_cast<double>(sum) * w.scales[r] * d;
    }
  }
  return y;
}

void check_w8a8(Backend& backend, Backend& scalar, int64_t n, int64_t k, int64_t n_tokens,
                float input_scale, bool prepare, bool with_bias, std::mt19937& rng) {
  SCOPED_TRACE("i8 n=" + std::to_string(n) + " k=" + std::to_string(k) + " tokens=" +
               std::to_string(n_tokens) + " input_scale=" + std::to_string(input_scale) +
               (prepare ? " prepared" : "") + (with_bias ? " bias" : ""));
  W8A8Weights w(n, k, rng, input_scale);
  std::vector<float> x = random_floats(n_tokens * k, rng);
  if (k > 40) std::fill_n(x.begin() + 1, 39, 0.0f);  // zeros
  x[0] = 4.0f;  // an outlier (past a small static scale's range: clamped)
  if (n_tokens > 1) std::fill_n(x.begin() + k, k, 0.0f);  // an all-zero token: scale 0
  std::vector<float> bias = random_floats(n, rng);
  TensorView bias_view{DType::kF32, {n}, bias.data(), bias.size() * 4};
  if (prepare) {
    const int64_t before = backend.prepared_weight_bytes();
    backend.prepare_matmul_weight(w.view);
    // The x86 and neon-dotprod levels pack I8 rows (16-row panels plus their scales)
    // when k allows.
    if (backend.name() != "cpu-scalar" && backend.name() != "cpu-neon" && k % 32 == 0) {
      EXPECT_EQ(backend.prepared_weight_bytes() - before, (n + 15) / 16 * (16 * k + 64));
    }
  }
  std::vector<float> got(n_tokens * n, NAN), want(n_tokens * n, NAN);
  backend.matmul(w.view, with_bias ? &bias_view : nullptr, x.data(), n_tokens, got.data());
  scalar.matmul(w.view, with_bias ? &bias_view : nullptr, x.data(), n_tokens, want.data());
  // Every level gives the scalar level's bits (kernels.h, MatmulI8Fn).
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  const std::vector<double> ref = w8a8_reference(w, x, n_tokens);
  int n_bad = 0;
  for (int64_t i = 0; i < n_tokens * n; ++i) {
    const double b = with_bias ? bias[i % n] : 0.0;
    // Only the float rounding of the int32 sum and the two scale products remains.
    const double tol = 1e-6 * std::fabs(ref[i]) + 1e-7;
    if (!(std::fabs(got[i] - (ref[i] + b)) <= tol) && ++n_bad <= 5) {
      ADD_FAILURE() << "output " << i << ": got " << got[i] << ", want " << ref[i] + b;
    }
  }
}

TEST_P(BackendOpsTest, MatmulW8A8) {
  std::unique_ptr<Backend> scalar = make_backend({CpuIsa::kScalar, 1});
  // Rows around the half panel (8) and panel (16); k with and without a tail of the
  // 32-byte steps (100 cannot be packed: per-row kernels); tokens around the tiles.
  // A prepared weight gets a backend of its own (a new weight may reuse a freed one's
  // address, which prepare_matmul_weight takes as the same weight prepared again).
  auto fresh = [&](bool prepare) { return prepare ? make_backend(GetParam()) : nullptr; };
  for (bool prepare : {false, true}) {
    for (int64_t n : {1, 8, 15, 16, 17, 45}) {
      for (int64_t k : {32, 100, 576}) {
        for (int64_t n_tokens : {1, 2, 7, 13}) {
          auto own = fresh(prepare);
          check_w8a8(own ? *own : *backend_, *scalar, n, k, n_tokens, 0.0f, prepare, false, rng_);
        }
      }
    }
    auto own = fresh(prepare);
    check_w8a8(own ? *own : *backend_, *scalar, 70, 256, 70, 0.0f, prepare, true, rng_);
    // Static input scales: one that clamps the outlier, one that clamps nothing.
    own = fresh(prepare);
    check_w8a8(own ? *own : *backend_, *scalar, 33, 96, 9, 0.01f, prepare, false, rng_);
    own = fresh(prepare);
    check_w8a8(own ? *own : *backend_, *scalar, 33, 96, 9, 0.05f, prepare, true, rng_);
  }
}

TEST_P(BackendOpsTest, MatmulW8A8IsBatchInvariant) {
  W8A8Weights w(37, 256, rng_);
  backend_->prepare_matmul_weight(w.view);
  const int64_t n = 37, k = 256, n_tokens = 29;
  std::vector<float> x = random_floats(n_tokens * k, rng_);
  std::vector<float> y(n_tokens * n), y1(n);
  backend_->matmul(w.view, nullptr, x.data(), n_tokens, y.data());
  for (int64_t tok = 0; tok < n_tokens; ++tok) {
    backend_->matmul(w.view, nullptr, x.data() + tok * k, 1, y1.data());
    ASSERT_EQ(std::memcmp(y1.data(), y.data() + tok * n, n * sizeof(float)), 0) << "token " << tok;
  }
}

TEST_P(BackendOpsTest, MatmulManyW8A8WithDifferentStaticScales) {
  // q/k/v of one input whose checkpoint calibrated different input scales: each
  // product must be what it is alone (the backend quantises x once per scale).
  const int64_t k = 128, n_tokens = 5;
  W8A8Weights a(20, k, rng_, 0.02f), b(24, k, rng_, 0.03f), c(16, k, rng_, 0.0f);
  backend_->prepare_matmul_weight(b.view);
  std::vector<float> x = random_floats(n_tokens * k, rng_);
  std::vector<float> ya(n_tokens * 20), yb(n_tokens * 24), yc(n_tokens * 16);
  const MatmulTarget targets[] = {{&a.view, nullptr, ya.data()},
                                  {&b.view, nullptr, yb.data()},
                                  {&c.view, nullptr, yc.data()}};
  backend_->matmul_many(x.data(), n_tokens, targets, 3);
  for (const auto* w : {&a, &b, &c}) {
    const int64_t n = w->view.shape[0];
    std::vector<float> alone(n_tokens * n);
    backend_->matmul(w->view, nullptr, x.data(), n_tokens, alone.data());
    const std::vector<float>& many = w == &a ? ya : w == &b ? yb : yc;
    EXPECT_EQ(std::memcmp(alone.data(), many.data(), alone.size() * sizeof(float)), 0)
        << "n=" << n;
  }
}

TEST_P(BackendOpsTest, GetRowsW8A8) {
  W8A8Weights w(10, 48, rng_);
  const int32_t ids[] = {3, 0, 9};
  std::vector<float> out(3 * 48);
  backend_->get_rows(w.view, ids, 3, out.data());
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 48; ++j) {
      EXPECT_EQ(out[i * 48 + j], w.q[ids[i] * 48 + j] * w.scales[ids[i]]);
    }
  }
}

// ---- FP8 (DType::kF8_E4M3): one byte per weight with block scales beside the data ----

// Runs w on `backend` and checks every output against the dequantise-then-multiply
// reference in double (each level, the scalar one included) and, when `scalar` is
// given, against the scalar level's result: FP32 accumulation over k terms in a few
// partial sums and one product per block bounds both differences well within
// 1e-5 * sum |w x|.
void check_fp8(Backend& backend, Backend* scalar, const Fp8Weights& w, int64_t n_tokens,
               std::mt19937& rng) {
  const int64_t n = w.view.shape[0], k = w.view.shape[1];
  SCOPED_TRACE("f8_e4m3 n=" + std::to_string(n) + " k=" + std::to_string(k) + " blocks " +
               std::to_string(w.view.block_scales.block_rows) + "x" +
               std::to_string(w.view.block_scales.block_cols) + " tokens=" + std::to_string(n_tokens));
  std::vector<float> x = random_floats(n_tokens * k, rng);
  x[0] = 4.0f;
  std::vector<float> got(n_tokens * n, NAN), want(n_tokens * n, NAN);
  backend.matmul(w.view, nullptr, x.data(), n_tokens, got.data());
  if (scalar != nullptr) scalar->matmul(w.view, nullptr, x.data(), n_tokens, want.data());
  int n_bad = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < n; ++r) {
      double exact = 0, abs_sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double p = w.at(r, j) * x[t * k + j];
        exact += p;
        abs_sum += std::fabs(p);
      }
      const double tol = 1e-5 * abs_sum + 1e-7;
      const double g = got[t * n + r];
      const bool ok = std::fabs(g - exact) <= tol &&
                      (scalar == nullptr || std::fabs(g - double{want[t * n + r]}) <= tol);
      if (!ok && ++n_bad <= 5) {
        ADD_FAILURE() << "row " << r << " token " << t << ": got " << g << ", reference " << exact
                      << ", scalar level " << want[t * n + r] << " (tol " << tol << ")";
      }
    }
  }
}

TEST_P(BackendOpsTest, MatmulFp8) {
  std::unique_ptr<Backend> scalar = make_backend({CpuIsa::kScalar, 1});
  // DeepSeek's 128 x 128 blocks, with short last blocks both ways (k = 200: a last
  // block of 72, off a 16-lane vector boundary); smaller blocks as weight_block_size
  // may say; rows around the register tiles; one token (decode) and many.
  struct Case {
    int64_t n, k, br, bc;
  };
  for (const Case c : {Case{45, 256, 128, 128}, Case{130, 200, 128, 128}, Case{37, 100, 16, 32},
                       Case{9, 48, 4, 16}, Case{64, 576, 32, 64}}) {
    const Fp8Weights w(c.n, c.k, c.br, c.bc, rng_);
    for (int64_t n_tokens : {1, 2, 5, 37}) check_fp8(*backend_, scalar.get(), w, n_tokens, rng_);
  }
}

TEST_P(BackendOpsTest, MatmulFp8IsBatchInvariant) {
  for (const int64_t bc : {128, 48}) {
    const Fp8Weights w(37, 200, 16, bc, rng_);
    const int64_t n = 37, k = 200, n_tokens = 29;
    std::vector<float> x = random_floats(n_tokens * k, rng_);
    std::vector<float> y(n_tokens * n), y1(n);
    backend_->prepare_matmul_weight(w.view);  // no packed form: a no-op
    backend_->matmul(w.view, nullptr, x.data(), n_tokens, y.data());
    for (int64_t tok = 0; tok < n_tokens; ++tok) {
      backend_->matmul(w.view, nullptr, x.data() + tok * k, 1, y1.data());
      ASSERT_EQ(std::memcmp(y1.data(), y.data() + tok * n, n * sizeof(float)), 0)
          << "block_cols " << bc << " token " << tok;
    }
  }
}

TEST_P(BackendOpsTest, MatmulFp8RowSliceOffBlockBoundary) {
  // A view of rows [first, ...) of a bigger FP8 tensor (an expert's rows of a stacked
  // tensor, a tensor-parallel shard) reads its scales through BlockScales::from_row:
  // the same outputs as those rows of the whole product.
  const Fp8Weights w(100, 256, 32, 128, rng_);
  const int64_t k = 256, first = 21, rows = 50, n_tokens = 3;
  TensorView slice = w.view;
  slice.shape = {rows, k};
  slice.data = w.q.data() + first * k;
  slice.n_bytes = rows * k;
  slice.block_scales = w.view.block_scales.from_row(first);
  std::vector<float> x = random_floats(n_tokens * k, rng_);
  std::vector<float> all(n_tokens * 100), part(n_tokens * rows);
  backend_->matmul(w.view, nullptr, x.data(), n_tokens, all.data());
  backend_->matmul(slice, nullptr, x.data(), n_tokens, part.data());
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(part[t * rows + r], all[t * 100 + first + r]) << "row " << r << " token " << t;
    }
  }
}

TEST_P(BackendOpsTest, MatmulFp8ColumnSliceInsideABlock) {
  // A tensor-parallel rank's columns of a row-parallel weight may start inside a
  // block (BlockScales::col0, a multiple of 16): a short first block, then whole ones.
  std::unique_ptr<Backend> scalar = make_backend({CpuIsa::kScalar, 1});
  const Fp8Weights whole(40, 512, 32, 128, rng_);
  for (const auto& [first, n] : {std::pair<int64_t, int64_t>{32, 192}, {48, 300}, {256, 256}, {112, 16}}) {
    const Fp8Weights part(whole, first, n);
    for (int64_t n_tokens : {1, 6}) check_fp8(*backend_, scalar.get(), part, n_tokens, rng_);
  }
}

TEST_P(BackendOpsTest, GetRowsFp8) {
  const Fp8Weights w(40, 64, 16, 32, rng_);
  const int32_t ids[] = {3, 17, 39};
  std::vector<float> out(3 * 64);
  backend_->get_rows(w.view, ids, 3, out.data());
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 64; ++j) EXPECT_EQ(out[i * 64 + j], static_cast<float>(w.at(ids[i], j)));
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, BackendOpsTest, testing::ValuesIn(all_configs()), config_name);

TEST(CpuIsaTest, ParseAndDetect) {
  EXPECT_EQ(cpu::parse_isa("avx2"), CpuIsa::kAvx2);
  EXPECT_EQ(cpu::parse_isa("neon-nope"), std::nullopt);
  EXPECT_TRUE(cpu::isa_supported(CpuIsa::kScalar));
  EXPECT_TRUE(cpu::isa_supported(cpu::best_isa()));
  EXPECT_EQ(cpu::parse_isa("neon-dotprod"), CpuIsa::kNeonDotprod);
  EXPECT_EQ(cpu::isa_name(CpuIsa::kNeonDotprod), "neon-dotprod");
}

// `make test-arm64` runs this under qemu as a Kunpeng-class core (neon-dotprod) and as
// an ARMv8.0 core (neon), and says which level the emulated core must come out as.
TEST(CpuIsaTest, DetectsTheLevelTheCoreHas) {
  const char* expected = std::getenv("DSERVE_EXPECT_BEST_ISA");
  if (expected == nullptr) GTEST_SKIP() << "DSERVE_EXPECT_BEST_ISA not set";
  EXPECT_EQ(cpu::isa_name(cpu::best_isa()), expected);
}

// --isa with a level this machine lacks is refused, naming the ones it has.
TEST(CpuIsaTest, RefusesALevelThisMachineLacks) {
  EXPECT_TRUE(cpu::check_isa("scalar").ok());
  EXPECT_TRUE(cpu::check_isa(cpu::isa_name(cpu::best_isa())).ok());
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kNeon, CpuIsa::kNeonDotprod}) {
    if (cpu::isa_supported(isa)) continue;
    const Status s = cpu::check_isa(cpu::isa_name(isa));
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(cpu::supported_isas_text()), std::string::npos) << s.message();
  }
  const Status bad = cpu::check_isa("sve2");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("unknown"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace dserve
