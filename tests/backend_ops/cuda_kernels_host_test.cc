// The CUDA kernels' code paths that run on the host too (backend/cuda/kernels.h, "need
// no GPU"), checked on every machine that builds the CUDA backend: weight decoding of
// every dtype against tensor/dequantize.h (and the FP8 / W8A8 scale definitions), the
// router against the CPU backend's moe_route, the KV conversions against tensor/half.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernel_args.h"
#include "backend/cuda/kernels.h"
#include "backend_configs.h"
#include "tensor/dequantize.h"
#include "tensor/half.h"
#include "test_weights.h"

namespace dserve {
namespace {

using test::Fp8Weights;
using test::random_floats;
using test::random_weights;
using test::W8A8Weights;

// Rows [first, first + n) of w decoded by the kernels' code against the definition.
void check_decode(const TensorView& w, int64_t first, int64_t n) {
  SCOPED_TRACE(std::string(dtype_name(w.dtype)) + " rows " + std::to_string(first) + "+" +
               std::to_string(n));
  const int64_t k = w.row_length();
  std::vector<float> got(n * k, NAN), want(k);
  cuda::decode_rows_on_host(cuda::matrix_of(w), first, n, got.data());
  int n_bad = 0;
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row(w.dtype, w.row(first + r), want.data(), k);
    for (int64_t j = 0; j < k; ++j) {
      if (w.row_scales != nullptr) want[j] *= w.row_scales[first + r];
      if (w.block_scales.data != nullptr) want[j] *= w.block_scales.at(first + r, j);
      const float g = got[r * k + j];
      if (!(std::fabs(g - want[j]) <= 1e-6f * std::fabs(want[j]) + 1e-12f) && ++n_bad <= 5) {
        ADD_FAILURE() << "row " << first + r << " column " << j << ": decoded " << g << ", want "
                      << want[j];
      }
    }
  }
}

TEST(CudaKernelsOnHostTest, DecodeEveryWeightTypeAsDequantize) {
  std::mt19937 rng(7);
  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                         DType::kQ4_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  for (DType type : types) {
    EXPECT_TRUE(cuda::matmul_dtype_supported(type)) << dtype_name(type);
    const bool plain = type == DType::kF32 || type == DType::kF16 || type == DType::kBF16;
    const int64_t n = 9, k = plain ? 100 : 512;  // plain rows end inside a 32-unit
    const std::vector<uint8_t> bytes = random_weights(type, n, k, rng);
    const TensorView w{type, {n, k}, bytes.data(), bytes.size()};
    check_decode(w, 0, n);
    check_decode(w, 4, 3);
  }
  const W8A8Weights i8(7, 96, rng);
  check_decode(i8.view, 0, 7);
  const Fp8Weights f8(300, 400, 128, 128, rng);
  check_decode(f8.view, 0, 300);
  check_decode(f8.view, 130, 20);
  const Fp8Weights shard(f8, 144, 160);  // columns from inside a block
  check_decode(shard.view, 0, 300);
  EXPECT_FALSE(cuda::matmul_dtype_supported(DType::kQ5_0));
}

TEST(CudaKernelsOnHostTest, RoutingChoosesAsTheCpuBackend) {
  std::mt19937 rng(11);
  CpuBackendOptions options;
  options.n_threads = 1;
  options.check_memory = false;
  std::unique_ptr<Backend> cpu = make_cpu_backend(options);
  struct Case {
    int E, k;
    MoeScoring scoring;
    MoeGroupSelect groups;
    int n_groups, top_groups;
    bool normalize, bias;
  };
  const Case cases[] = {
      {64, 6, MoeScoring::kSoftmax, MoeGroupSelect::kNone, 1, 1, false, false},   // V2-Lite
      {160, 6, MoeScoring::kSoftmax, MoeGroupSelect::kMaxOfGroup, 8, 3, false, false},  // V2
      {256, 8, MoeScoring::kSigmoid, MoeGroupSelect::kTopTwoSum, 8, 4, true, true},  // V3 / R1
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.E) + " experts, top " + std::to_string(c.k));
    const int64_t n_tokens = 13;
    std::vector<float> logits = random_floats(n_tokens * c.E, rng);
    logits[5] = logits[6];  // ties go to the lower id
    logits[c.E + 1] = logits[c.E + 2] = logits[c.E + 3];
    const std::vector<float> bias = random_floats(c.E, rng, 0.05f);
    MoeRouting r;
    r.n_experts = c.E;
    r.top_k = c.k;
    r.scoring = c.scoring;
    r.group_select = c.groups;
    r.n_groups = c.n_groups;
    r.top_groups = c.top_groups;
    r.normalize = c.normalize;
    r.scaling = 2.5f;
    r.correction_bias = c.bias ? bias.data() : nullptr;
    std::vector<int32_t> want_ids(n_tokens * c.k), got_ids(want_ids.size());
    std::vector<float> want_w(want_ids.size()), got_w(want_ids.size());
    cpu->moe_route(logits.data(), n_tokens, r, want_ids.data(), want_w.data());
    cuda::route_on_host(logits.data(), n_tokens, cuda::routing_args_of(r), got_ids.data(),
                        got_w.data());
    EXPECT_EQ(got_ids, want_ids);
    for (size_t i = 0; i < got_w.size(); ++i) {
      EXPECT_NEAR(got_w[i], want_w[i], 1e-6f * std::fabs(want_w[i])) << i;
    }
  }
}

TEST(CudaKernelsOnHostTest, KvConversionsAsHalfH) {
  std::mt19937 rng(3);
  std::vector<float> x = random_floats(4000, rng, 30.0f);
  const float specials[] = {0.0f, -0.0f, 448.0f, 464.0f, 1e6f, -1e6f, 1e-9f, -3e-3f, 0.0009765625f,
                            std::numeric_limits<float>::infinity(), 240.5f, 65504.0f, 70000.0f};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> f8(n);
  std::vector<uint16_t> f16(n);
  std::vector<float> back(n);
  cuda::kv_convert_on_host(DType::kF8_E4M3, x.data(), n, f8.data(), back.data());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(f8[i], f32_to_fp8_e4m3(x[i])) << x[i];
    EXPECT_EQ(back[i], fp8_e4m3_to_f32(f8[i])) << x[i];
  }
  cuda::kv_convert_on_host(DType::kF16, x.data(), n, f16.data(), back.data());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(f16[i], f32_to_f16(x[i])) << x[i];
    EXPECT_EQ(back[i], f16_to_f32(f16[i])) << x[i];
  }
}

}  // namespace
}  // namespace dserve
