// The Backend's memory and data-movement operations (alloc, upload, download,
// copy_strided, gather_rows, get_rows_shard), the mixture-of-experts op moe_experts
// against the same experts run one token and one expert at a time, and the checking
// backend: host access to its memory must die, and host arrays handed to its
// operations must be refused. Every case runs on every instruction set; the data
// lives in backend buffers, so it runs unchanged on the checking backend too.
//
// (moe_route is checked against transformers' routers in the DeepSeek reference
// tests: greedy, group_limited_greedy and noaux_tc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend_configs.h"

namespace dserve {
namespace {

using test::all_configs;
using test::BackendConfig;
using test::config_name;
using test::random_floats;

// The backend under test: the plain one (false) or the checking one (true).
std::unique_ptr<Backend> backend_for(const BackendConfig& c, bool checked) {
  CpuBackendOptions options;
  options.n_threads = c.n_threads;
  options.isa = std::string(cpu::isa_name(c.isa));
  options.check_memory = checked;
  return make_cpu_backend(options);
}

template <typename T>
std::vector<T> download(Backend& b, const DeviceArray<T>& a, int64_t n) {
  std::vector<T> out(n);
  b.download(out.data(), a.get(), n * sizeof(T));
  return out;
}

class BackendMemoryTest : public testing::TestWithParam<std::tuple<BackendConfig, bool>> {
 protected:
  void SetUp() override { backend_ = backend_for(std::get<0>(GetParam()), std::get<1>(GetParam())); }
  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{99};
};

TEST_P(BackendMemoryTest, CopyStridedTransposesHeads) {
  // [n, H, d] -> [H, n, d], the absorbed MLA's per-head gather, and a broadcast (a
  // zero source stride) of one row over the heads.
  const int64_t n = 5, H = 3, d = 7;
  const std::vector<float> x = random_floats(n * H * d, rng_);
  DeviceArray<float> src(backend_.get()), dst(backend_.get());
  src.upload(x.data(), n * H * d);
  dst.ensure(n * H * d);
  backend_->copy_strided(dst.get(), src.get(),
                         {.n0 = H, .n1 = n, .len = d, .dst_stride0 = n * d, .dst_stride1 = d,
                          .src_stride0 = d, .src_stride1 = H * d});
  std::vector<float> got = download(*backend_, dst, n * H * d);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < d; ++i) ASSERT_EQ(got[(h * n + t) * d + i], x[(t * H + h) * d + i]);
    }
  }
  backend_->copy_strided(dst.get(), src.get(),
                         {.n0 = n, .n1 = H, .len = d, .dst_stride0 = H * d, .dst_stride1 = d,
                          .src_stride0 = H * d, .src_stride1 = 0});
  got = download(*backend_, dst, n * H * d);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < d; ++i) ASSERT_EQ(got[(t * H + h) * d + i], x[t * H * d + i]);
    }
  }
}

TEST_P(BackendMemoryTest, GatherRowsAndVocabularyShards) {
  const int64_t n_rows = 10, len = 64;
  const std::vector<float> x = random_floats(n_rows * len, rng_);
  const std::vector<int32_t> rows = {9, 0, 4, 4};
  DeviceArray<float> src(backend_.get()), out(backend_.get());
  DeviceArray<int32_t> ids(backend_.get());
  src.upload(x.data(), n_rows * len);
  ids.upload(rows.data(), 4);
  out.ensure(4 * len);
  backend_->gather_rows(src.get(), len, ids.get(), 4, out.get());
  std::vector<float> got = download(*backend_, out, 4 * len);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(0, std::memcmp(&got[i * len], &x[rows[i] * len], len * sizeof(float)));
  }
  // A shard holding vocabulary rows [4, 8): its rows' values, zeros for the others'.
  TensorView shard{DType::kF32, {4, len}, x.data() + 4 * len, 4 * len * sizeof(float)};
  const std::vector<int32_t> tokens = {3, 4, 7, 8, 5};
  ids.upload(tokens.data(), 5);
  out.ensure(5 * len);
  backend_->get_rows_shard(shard, ids.get(), 5, 4, out.get());
  got = download(*backend_, out, 5 * len);
  for (int i = 0; i < 5; ++i) {
    const bool mine = tokens[i] >= 4 && tokens[i] < 8;
    for (int64_t j = 0; j < len; ++j) {
      ASSERT_EQ(got[i * len + j], mine ? x[tokens[i] * len + j] : 0.0f) << "token " << tokens[i];
    }
  }
}

// moe_experts over a batch equals, bit for bit, each token's experts run alone with
// matmul / silu_mul / add_inplace, weighted and summed in increasing expert order,
// then the shared experts added: for this rank's experts [first, end) only.
TEST_P(BackendMemoryTest, MoeExpertsEqualsExpertByExpert) {
  const int E = 6, k = 2;
  // (Widths a multiple of 16 floats: silu_mul's vector and tail code round alike only
  // there, and real models' widths are.)
  const int64_t hidden = 32, inter = 16, shared_inter = 48, n = 7;
  std::vector<std::vector<float>> storage;
  auto weight = [&](int64_t rows, int64_t cols) {
    storage.push_back(random_floats(rows * cols, rng_, 0.2f));
    return TensorView{DType::kF32, {rows, cols}, storage.back().data(), storage.back().size() * 4};
  };
  storage.reserve(3 * (E + 1));
  std::vector<TensorView> views;
  views.reserve(3 * (E + 1));
  for (int e = 0; e <= E; ++e) {
    const int64_t width = e < E ? inter : shared_inter;
    views.push_back(weight(width, hidden));
    views.push_back(weight(width, hidden));
    views.push_back(weight(hidden, width));
  }
  std::vector<SwigluWeights> experts(E);
  for (int e = 0; e < E; ++e) experts[e] = {&views[3 * e], &views[3 * e + 1], &views[3 * e + 2]};
  const SwigluWeights shared = {&views[3 * E], &views[3 * E + 1], &views[3 * E + 2]};
  // Token t picks experts (t, t + 3) mod E in an unsorted order for odd t.
  std::vector<int32_t> ids(n * k);
  std::vector<float> weights(n * k);
  for (int64_t t = 0; t < n; ++t) {
    ids[t * k] = static_cast<int32_t>((t % 2 ? t + 3 : t) % E);
    ids[t * k + 1] = static_cast<int32_t>((t % 2 ? t : t + 3) % E);
    weights[t * k] = 0.25f + 0.1f * t;
    weights[t * k + 1] = 0.75f - 0.05f * t;
  }
  const std::vector<float> x = random_floats(n * hidden, rng_);
  DeviceArray<float> x_dev(backend_.get()), out(backend_.get()), w_dev(backend_.get());
  DeviceArray<int32_t> ids_dev(backend_.get());
  DeviceArray<int64_t> counters(backend_.get());
  x_dev.upload(x.data(), n * hidden);
  ids_dev.upload(ids.data(), n * k);
  w_dev.upload(weights.data(), n * k);
  counters.ensure(kNumMoeCounters);
  backend_->fill_zero(counters.get(), kNumMoeCounters * sizeof(int64_t));
  out.ensure(n * hidden);
  MoeExperts spec{experts.data(), E, 1, 5, hidden, inter, &shared, shared_inter};
  backend_->moe_experts(x_dev.get(), n, ids_dev.get(), w_dev.get(), k, spec, out.get(), counters.get());
  const std::vector<float> got = download(*backend_, out, n * hidden);

  // One token through one SwiGLU.
  DeviceArray<float> gate(backend_.get()), up(backend_.get()), y(backend_.get()), acc(backend_.get());
  DeviceArray<float> scaled(backend_.get());
  auto run = [&](const SwigluWeights& m, int64_t width, const float* xt) {
    gate.ensure(width);
    up.ensure(width);
    y.ensure(hidden);
    backend_->matmul(*m.gate, nullptr, xt, 1, gate.get());
    backend_->matmul(*m.up, nullptr, xt, 1, up.get());
    backend_->silu_mul(gate.get(), up.get(), width, gate.get());
    backend_->matmul(*m.down, nullptr, gate.get(), 1, y.get());
    return download(*backend_, y, hidden);
  };
  int64_t routed_here = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int> order = {0, 1};
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[t * k + a] < ids[t * k + b]; });
    std::vector<float> want(hidden, 0.0f);
    for (int j : order) {
      const int e = ids[t * k + j];
      if (e < spec.first || e >= spec.end) continue;
      ++routed_here;
      const std::vector<float> ye = run(experts[e], inter, x_dev.get() + t * hidden);
      for (int64_t d = 0; d < hidden; ++d) want[d] += weights[t * k + j] * ye[d];
    }
    const std::vector<float> ys = run(shared, shared_inter, x_dev.get() + t * hidden);
    acc.upload(want.data(), hidden);
    scaled.upload(ys.data(), hidden);
    backend_->add_inplace(acc.get(), scaled.get(), hidden);
    want = download(*backend_, acc, hidden);
    ASSERT_EQ(0, std::memcmp(want.data(), &got[t * hidden], hidden * sizeof(float))) << "token " << t;
  }
  const std::vector<int64_t> c = download(*backend_, counters, kNumMoeCounters);
  EXPECT_EQ(c[kMoeRoutedSlots], n * k);
  EXPECT_EQ(c[kMoeExpertRows], routed_here);
  EXPECT_EQ(c[kMoeExpertRuns] + c[kMoeExpertIdle], spec.end - spec.first);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, BackendMemoryTest,
                         testing::Combine(testing::ValuesIn(all_configs()), testing::Bool()),
                         [](const testing::TestParamInfo<std::tuple<BackendConfig, bool>>& info) {
                           return config_name({std::get<0>(info.param), 0}) +
                                  (std::get<1>(info.param) ? "_checked" : "");
                         });

// The checking backend makes host access to its memory die at the access, and refuses
// host arrays handed to its operations by name.
TEST(CheckingBackendDeathTest, HostAccessToBackendMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto make = [] { return backend_for({cpu::CpuIsa::kScalar, 1}, true); };
  EXPECT_DEATH(
      {
        std::unique_ptr<Backend> b = make();
        BackendBuffer buf = b->alloc(64);
        buf.as<float>()[0] = 1.0f;  // a host write
      },
      "");
  EXPECT_DEATH(
      {
        std::unique_ptr<Backend> b = make();
        BackendBuffer buf = b->alloc(64);
        volatile float v = buf.as<float>()[3];  // a host read
        (void)v;
      },
      "");
  EXPECT_DEATH(
      {
        std::unique_ptr<Backend> b = make();
        BackendBuffer buf = b->alloc(16 * sizeof(float));
        std::vector<float> host(16, 1.0f);
        b->add_inplace(buf.as<float>(), host.data(), 16);
      },
      "add_inplace was given a pointer outside backend memory");
  EXPECT_DEATH(
      {
        std::unique_ptr<Backend> b = make();
        BackendBuffer buf = b->alloc(8 * sizeof(float));
        std::vector<float> host(16);
        b->download(host.data(), buf.data(), 16 * sizeof(float));  // past the buffer's end
      },
      "download was given a pointer outside backend memory");
}

TEST(CheckingBackendTest, TransfersAndOperationsWork) {
  std::unique_ptr<Backend> b = backend_for({cpu::CpuIsa::kScalar, 1}, true);
  const std::vector<float> x = {1, 2, 3, 4}, y = {10, 20, 30, 40};
  DeviceArray<float> xd(b.get()), yd(b.get());
  xd.upload(x.data(), 4);
  yd.upload(y.data(), 4);
  b->add_inplace(xd.get(), yd.get(), 4);
  EXPECT_EQ(download(*b, xd, 4), (std::vector<float>{11, 22, 33, 44}));
  EXPECT_NE(b->name().find("checked"), std::string_view::npos);
}

}  // namespace
}  // namespace dserve
