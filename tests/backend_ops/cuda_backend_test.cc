// The CUDA backend's operations against the CPU backend's results and against
// double-precision references from the formats' definitions (dequantize_row, the FP8
// and W8A8 definitions). On a machine without a GPU (or a binary built without the
// backend) every test is skipped with the reason; tools/gpu_check.sh runs them on one.
//
// Tolerances, per op:
//  - matmul with GGUF, F16/BF16 and FP8 weights: the GPU multiplies the decoded weights
//    by the FP32 activations, so against the double reference only FP32 accumulation
//    remains: 1e-5 * sum |w x|. The CPU backend quantises activations to int8 for the
//    GGUF block types, so against it the bound is that rounding: 3e-2 of max |y|.
//  - W8A8 (kI8): both quantise activations by the same rule, so the int32 sums agree
//    exactly and only the scale products' rounding differs: 1e-5 relative.
//  - element-wise ops, RoPE, attention, experts: FP32 with other summation orders,
//    1e-4 (5e-3 for experts, whose Q8_0 products carry the activation rounding).
//  - KV stores and reads, row gathers and copies, routing choices: exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/backend_registry.h"
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

class CudaBackendTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_backend_built()) GTEST_SKIP() << "this binary was built without the CUDA backend";
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU on this machine";
    Result<std::unique_ptr<Backend>> gpu = make_cuda_backend(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status().message();
    gpu_ = std::move(gpu).value();
    CpuBackendOptions options;
    options.n_threads = 2;
    options.check_memory = false;  // the CPU side is handed host arrays
    cpu_ = make_cpu_backend(options);
  }

  // A device copy of v.
  template <typename T>
  BackendBuffer put(const std::vector<T>& v) {
    BackendBuffer b = gpu_->alloc(v.size() * sizeof(T));
    gpu_->upload(b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }
  template <typename T>
  std::vector<T> get(const BackendBuffer& b, size_t n) {
    std::vector<T> v(n);
    gpu_->download(v.data(), b.data(), n * sizeof(T));
    return v;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::mt19937 rng_{2024};
};

// max |got - want| <= tol * max(max |want|, floor).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const std::string& what, double floor = 1e-6) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = floor, worst = 0;
  size_t at = 0;
  for (float w : want) scale = std::max(scale, std::fabs(double{w}));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << what << ": worst at " << at << ", got " << got[at] << ", want "
                                 << want[at] << " (max |want| " << scale << ")";
}

// The double-precision product with the dequantised rows, and sum |w x| per output.
void float_reference(const TensorView& w, const std::vector<float>& x, int64_t n_tokens,
                     std::vector<double>* y, std::vector<double>* abs_sum) {
  const int64_t n = w.n_rows(), k = w.row_length();
  std::vector<float> row(k);
  y->assign(n_tokens * n, 0.0);
  abs_sum->assign(n_tokens * n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row(w.dtype, w.row(r), row.data(), k);
    if (w.block_scales.data != nullptr) {
      for (int64_t j = 0; j < k; ++j) row[j] *= w.block_scales.at(r, j);
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const double p = double{row[j]} * x[t * k + j];
        (*y)[t * n + r] += p;
        (*abs_sum)[t * n + r] += std::fabs(p);
      }
    }
  }
}

// Runs w on both backends for each token count and checks the GPU's outputs against
// the float reference (tight) and the CPU backend's (cpu_tol of max |y|).
void check_matmul(Backend& gpu, Backend& cpu, const TensorView& w,
                  double cpu_tol, std::mt19937& rng, bool reference = true) {
  const int64_t n = w.n_rows(), k = w.row_length();
  for (int64_t n_tokens : {1, 3, 8, 19}) {
    SCOPED_TRACE(std::string(dtype_name(w.dtype)) + " n=" + std::to_string(n) + " k=" +
                 std::to_string(k) + " tokens=" + std::to_string(n_tokens));
    const std::vector<float> x = random_floats(n_tokens * k, rng);
    const std::vector<float> bias = random_floats(n, rng);
    const TensorView bias_view{DType::kF32, {n}, bias.data(), bias.size() * sizeof(float)};
    std::vector<float> want(n_tokens * n);
    cpu.matmul(w, &bias_view, x.data(), n_tokens, want.data());
    BackendBuffer dx = gpu.alloc(x.size() * 4), dy = gpu.alloc(want.size() * 4);
    gpu.upload(dx.data(), x.data(), x.size() * 4);
    gpu.matmul(w, &bias_view, dx.as<float>(), n_tokens, dy.as<float>());
    std::vector<float> got(want.size());
    gpu.download(got.data(), dy.data(), got.size() * 4);
    expect_close(got, want, cpu_tol, "against the CPU backend");
    if (!reference) continue;
    std::vector<double> ref, abs_sum;
    float_reference(w, x, n_tokens, &ref, &abs_sum);
    int n_bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double exact = ref[i] + bias[i % n];
      if (!(std::fabs(got[i] - exact) <= 1e-5 * abs_sum[i] + 1e-6) && ++n_bad <= 5) {
        ADD_FAILURE() << "output " << i << ": got " << got[i] << ", reference " << exact;
      }
    }
  }
}

TEST_F(CudaBackendTest, MatmulEveryGgufType) {
  const DType types[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                         DType::kQ4_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  for (DType type : types) {
    const bool plain = type == DType::kF32 || type == DType::kF16 || type == DType::kBF16;
    // Rows off the 4-warp blocks; plain rows also off the 32-element units.
    const int64_t n = 67, k = plain ? 200 : 512;
    const std::vector<uint8_t> bytes = random_weights(type, n, k, rng_);
    const TensorView w{type, {n, k}, bytes.data(), bytes.size()};
    check_matmul(*gpu_, *cpu_, w, plain ? 1e-5 : 3e-2, rng_);
  }
}

TEST_F(CudaBackendTest, MatmulW8A8) {
  for (const float input_scale : {0.0f, 0.02f}) {
    const W8A8Weights w(45, 256, rng_, input_scale);
    check_matmul(*gpu_, *cpu_, w.view, 1e-5, rng_, /*reference=*/false);
  }
}

TEST_F(CudaBackendTest, MatmulFp8) {
  const Fp8Weights whole(70, 384, 128, 128, rng_);
  check_matmul(*gpu_, *cpu_, whole.view, 1e-5, rng_);
  // A tensor-parallel shard starting inside a block of columns.
  const Fp8Weights shard(whole, 144, 160);
  check_matmul(*gpu_, *cpu_, shard.view, 1e-5, rng_);
}

TEST_F(CudaBackendTest, GetRowsEveryType) {
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_1,
                         DType::kQ4_K, DType::kQ6_K};
  for (DType type : types) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    const int64_t n = 50, k = 256;
    const std::vector<uint8_t> bytes = random_weights(type, n, k, rng_);
    const TensorView table{type, {n, k}, bytes.data(), bytes.size()};
    // ids of another shard (first_id 10: ids below 10 and from 60 are zeros).
    const std::vector<int32_t> ids = {10, 59, 3, 25, 60, 10};
    std::vector<float> want(ids.size() * k);
    cpu_->get_rows_shard(table, ids.data(), ids.size(), 10, want.data());
    BackendBuffer d_ids = put(ids), d_out = gpu_->alloc(want.size() * 4);
    gpu_->get_rows_shard(table, d_ids.as<int32_t>(), ids.size(), 10, d_out.as<float>());
    expect_close(get<float>(d_out, want.size()), want, 1e-6, "rows");
  }
}

TEST_F(CudaBackendTest, NormActivationsRope) {
  const int64_t n_tokens = 5, n = 384;
  const std::vector<float> x = random_floats(n_tokens * n, rng_), y = random_floats(n_tokens * n, rng_);
  const std::vector<float> w = random_floats(n, rng_);
  const TensorView wv{DType::kF32, {n}, w.data(), w.size() * 4};
  BackendBuffer dx = put(x), dy = put(y), dout = gpu_->alloc(x.size() * 4);
  std::vector<float> want(x.size());

  cpu_->rms_norm(x.data(), wv, 1e-6f, n_tokens, n, want.data());
  gpu_->rms_norm(dx.as<float>(), wv, 1e-6f, n_tokens, n, dout.as<float>());
  expect_close(get<float>(dout, want.size()), want, 1e-5, "rms_norm");

  cpu_->silu_mul(x.data(), y.data(), x.size(), want.data());
  gpu_->silu_mul(dx.as<float>(), dy.as<float>(), x.size(), dout.as<float>());
  expect_close(get<float>(dout, want.size()), want, 1e-5, "silu_mul");

  want = x;
  cpu_->add_inplace(want.data(), y.data(), want.size());
  gpu_->copy(dout.data(), dx.data(), x.size() * 4);
  gpu_->add_inplace(dout.as<float>(), dy.as<float>(), x.size());
  expect_close(get<float>(dout, want.size()), want, 1e-6, "add_inplace");

  // RoPE over 6 heads of 64 with 32 rotated dims, both pair layouts.
  const int n_heads = 6, head_dim = 64, rot = 32, n_pos = 100;
  std::vector<float> cos(n_pos * rot / 2), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) {
    cos[i] = std::cos(0.01f * static_cast<float>(i));
    sin[i] = std::sin(0.01f * static_cast<float>(i));
  }
  const std::vector<int32_t> pos = {0, 7, 42, 99, 50};
  BackendBuffer dcos = put(cos), dsin = put(sin), dpos = put(pos);
  for (const bool interleaved : {false, true}) {
    RopeTable host{rot, n_pos, cos.data(), sin.data()}, dev{rot, n_pos, dcos.as<float>(), dsin.as<float>()};
    want = x;
    cpu_->rope(want.data(), n_tokens, n_heads, head_dim, pos.data(), host, interleaved);
    gpu_->copy(dout.data(), dx.data(), x.size() * 4);
    gpu_->rope(dout.as<float>(), n_tokens, n_heads, head_dim, dpos.as<int32_t>(), dev, interleaved);
    expect_close(get<float>(dout, want.size()), want, 1e-6, interleaved ? "rope gptj" : "rope neox");
  }
}

TEST_F(CudaBackendTest, CopiesAndGathersAreExact) {
  const std::vector<float> src = random_floats(4 * 6 * 10, rng_);
  BackendBuffer dsrc = put(src), ddst = gpu_->alloc(src.size() * 4);
  gpu_->fill_zero(ddst.data(), src.size() * 4);
  // Transpose [4, 6, 10] -> [6, 4, 10].
  StridedCopy c{4, 6, 10, 10, 40, 60, 10};
  std::vector<float> want(src.size(), 0.0f);
  cpu_->copy_strided(want.data(), src.data(), c);
  gpu_->copy_strided(ddst.as<float>(), dsrc.as<float>(), c);
  EXPECT_EQ(get<float>(ddst, want.size()), want);
  const std::vector<int32_t> rows = {3, 0, 23, 3};
  BackendBuffer drows = put(rows), dout = gpu_->alloc(rows.size() * 10 * 4);
  std::vector<float> gathered(rows.size() * 10);
  cpu_->gather_rows(src.data(), 10, rows.data(), rows.size(), gathered.data());
  gpu_->gather_rows(dsrc.as<float>(), 10, drows.as<int32_t>(), rows.size(), dout.as<float>());
  EXPECT_EQ(get<float>(dout, gathered.size()), gathered);
}

TEST_F(CudaBackendTest, KvStoreAndGatherConvertAsTheCpu) {
  const int64_t row = 96, n_slots = 64;
  std::vector<float> x = random_floats(5 * row, rng_, 40.0f);
  x[0] = 1e6f;  // saturates in FP8, infinite in no format here
  x[1] = 1e-9f;  // subnormal or zero
  const std::vector<int64_t> slots = {7, 0, 63, 12, 30};
  for (const DType kv : {DType::kF32, DType::kF16, DType::kF8_E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(kv)));
    const size_t bytes = static_cast<size_t>(n_slots * row) * (kv == DType::kF32 ? 4 : kv == DType::kF16 ? 2 : 1);
    std::vector<uint8_t> pool(bytes, 0);
    cpu_->kv_store(kv, pool.data(), row, x.data(), slots.data(), slots.size());
    BackendBuffer dpool = gpu_->alloc(bytes), dx = put(x), dslots = put(slots);
    gpu_->fill_zero(dpool.data(), bytes);
    gpu_->kv_store(kv, dpool.data(), row, dx.as<float>(), dslots.as<int64_t>(), slots.size());
    EXPECT_EQ(get<uint8_t>(dpool, bytes), pool);
    std::vector<float> want(slots.size() * row);
    cpu_->kv_gather(kv, pool.data(), row, slots.data(), slots.size(), want.data());
    BackendBuffer dout = gpu_->alloc(want.size() * 4);
    gpu_->kv_gather(kv, dpool.data(), row, dslots.as<int64_t>(), slots.size(), dout.as<float>());
    EXPECT_EQ(get<float>(dout, want.size()), want);
  }
}

TEST_F(CudaBackendTest, ContiguousAttentionGqaWithPaddedRows) {
  const int n_heads = 8, n_kv_heads = 2, head_dim = 64, v_dim = 48;
  const int64_t n_kv = 300, n_tokens = 4, k_row = n_kv_heads * head_dim + 16;
  const std::vector<float> q = random_floats(n_tokens * n_heads * head_dim, rng_);
  const std::vector<float> k = random_floats(n_kv * k_row, rng_), v = random_floats(n_kv * n_kv_heads * v_dim, rng_);
  const std::vector<int32_t> pos = {0, 130, 255, 299};
  std::vector<float> want(n_tokens * n_heads * v_dim);
  cpu_->attention(q.data(), k.data(), v.data(), want.data(), n_tokens, pos.data(), n_kv, n_heads,
                  n_kv_heads, head_dim, v_dim, 0.125f, k_row, 0);
  BackendBuffer dq = put(q), dk = put(k), dv = put(v), dpos = put(pos), dout = gpu_->alloc(want.size() * 4);
  gpu_->attention(dq.as<float>(), dk.as<float>(), dv.as<float>(), dout.as<float>(), n_tokens,
                  dpos.as<int32_t>(), n_kv, n_heads, n_kv_heads, head_dim, v_dim, 0.125f, k_row, 0);
  expect_close(get<float>(dout, want.size()), want, 1e-4, "attention");
}

// Two sequences in one batch over a shuffled block table: GQA pools in F16, and MLA's
// latent pool (576 = 512 + 64, values the first 512) in FP8.
TEST_F(CudaBackendTest, PagedAttentionAndLatentAttention) {
  const int block = 16;
  const std::vector<int32_t> tables = {5, 2, 9, 0, 7, 1, 3};  // seq 0: 4 blocks, seq 1: 3
  const std::vector<int64_t> offsets = {0, 4, 7};
  const std::vector<int32_t> seq_of_token = {0, 0, 1, 1, 1};
  const std::vector<int32_t> pos = {40, 63, 0, 17, 47};
  const int64_t n_tokens = 5, n_slots = 10 * block;
  BackendBuffer dtables = put(tables), doffsets = put(offsets), dseq = put(seq_of_token), dpos = put(pos);
  auto batch_of = [&](bool device) {
    PagedBatch b;
    b.n_tokens = n_tokens;
    b.positions = device ? dpos.as<int32_t>() : pos.data();
    b.seq_of_token = device ? dseq.as<int32_t>() : seq_of_token.data();
    b.n_seqs = 2;
    b.block_tables = device ? dtables.as<int32_t>() : tables.data();
    b.block_table_offsets = device ? doffsets.as<int64_t>() : offsets.data();
    b.block_size = block;
    return b;
  };
  // Every slot filled through kv_store, so both pools hold the same converted values.
  std::vector<int64_t> all_slots(n_slots);
  for (int64_t i = 0; i < n_slots; ++i) all_slots[i] = i;
  BackendBuffer dslots = put(all_slots);
  auto fill = [&](DType kv, int64_t row, std::vector<uint8_t>* host, BackendBuffer* dev) {
    const std::vector<float> x = random_floats(n_slots * row, rng_);
    const size_t bytes = static_cast<size_t>(n_slots * row) * (kv == DType::kF16 ? 2 : 1);
    host->assign(bytes, 0);
    cpu_->kv_store(kv, host->data(), row, x.data(), all_slots.data(), n_slots);
    *dev = gpu_->alloc(bytes);
    BackendBuffer dx = put(x);
    gpu_->kv_store(kv, dev->data(), row, dx.as<float>(), dslots.as<int64_t>(), n_slots);
  };
  {
    const int n_heads = 6, n_kv_heads = 3, head_dim = 32, v_dim = 40;
    std::vector<uint8_t> kp, vp;
    BackendBuffer dk, dv;
    fill(DType::kF16, n_kv_heads * head_dim, &kp, &dk);
    fill(DType::kF16, n_kv_heads * v_dim, &vp, &dv);
    const std::vector<float> q = random_floats(n_tokens * n_heads * head_dim, rng_);
    std::vector<float> want(n_tokens * n_heads * v_dim);
    cpu_->paged_attention(q.data(), DType::kF16, kp.data(), vp.data(), want.data(), batch_of(false),
                          n_heads, n_kv_heads, head_dim, v_dim, 0.2f);
    BackendBuffer dq = put(q), dout = gpu_->alloc(want.size() * 4);
    gpu_->paged_attention(dq.as<float>(), DType::kF16, dk.data(), dv.data(), dout.as<float>(),
                          batch_of(true), n_heads, n_kv_heads, head_dim, v_dim, 0.2f);
    expect_close(get<float>(dout, want.size()), want, 1e-4, "paged attention");
  }
  {
    const int n_heads = 16, latent = 576, v_dim = 512;
    std::vector<uint8_t> pool;
    BackendBuffer dpool;
    fill(DType::kF8_E4M3, latent, &pool, &dpool);
    const std::vector<float> q = random_floats(n_tokens * n_heads * latent, rng_, 0.1f);
    std::vector<float> want(n_tokens * n_heads * v_dim);
    cpu_->paged_latent_attention(q.data(), DType::kF8_E4M3, pool.data(), want.data(),
                                 batch_of(false), n_heads, latent, v_dim, 0.07f);
    BackendBuffer dq = put(q), dout = gpu_->alloc(want.size() * 4);
    gpu_->paged_latent_attention(dq.as<float>(), DType::kF8_E4M3, dpool.data(), dout.as<float>(),
                                 batch_of(true), n_heads, latent, v_dim, 0.07f);
    expect_close(get<float>(dout, want.size()), want, 1e-4, "latent attention");
  }
}

TEST_F(CudaBackendTest, MoeRoutingChoosesAsTheCpu) {
  const int64_t n_tokens = 9;
  for (const bool deepseek_v3 : {false, true}) {
    SCOPED_TRACE(deepseek_v3 ? "sigmoid, groups, bias" : "softmax");
    MoeRouting r;
    r.n_experts = deepseek_v3 ? 256 : 64;
    r.top_k = deepseek_v3 ? 8 : 6;
    const std::vector<float> bias = random_floats(r.n_experts, rng_, 0.1f);
    BackendBuffer dbias = put(bias);
    if (deepseek_v3) {
      r.scoring = MoeScoring::kSigmoid;
      r.group_select = MoeGroupSelect::kTopTwoSum;
      r.n_groups = 8;
      r.top_groups = 4;
      r.normalize = true;
      r.scaling = 2.5f;
    }
    std::vector<float> logits = random_floats(n_tokens * r.n_experts, rng_);
    logits[3] = logits[4];  // a tie, broken toward the lower id
    std::vector<int32_t> ids(n_tokens * r.top_k);
    std::vector<float> weights(ids.size());
    r.correction_bias = deepseek_v3 ? bias.data() : nullptr;
    cpu_->moe_route(logits.data(), n_tokens, r, ids.data(), weights.data());
    BackendBuffer dlogits = put(logits), dids = gpu_->alloc(ids.size() * 4), dw = gpu_->alloc(ids.size() * 4);
    r.correction_bias = deepseek_v3 ? dbias.as<float>() : nullptr;
    gpu_->moe_route(dlogits.as<float>(), n_tokens, r, dids.as<int32_t>(), dw.as<float>());
    EXPECT_EQ(get<int32_t>(dids, ids.size()), ids);
    expect_close(get<float>(dw, weights.size()), weights, 1e-6, "routing weights");
  }
}

// Eight Q8_0 experts of which this "rank" holds [2, 6), plus a shared expert; outputs
// and work counters as the CPU backend's.
TEST_F(CudaBackendTest, MoeExpertsAsTheCpu) {
  const int E = 8, k = 3;
  const int64_t hidden = 256, inter = 128, shared_inter = 160, n_tokens = 6;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
  views.reserve(3 * E + 3);
  auto add = [&](int64_t n, int64_t kk) {
    bytes.push_back(random_weights(DType::kQ8_0, n, kk, rng_));
    views.push_back(TensorView{DType::kQ8_0, {n, kk}, bytes.back().data(), bytes.back().size()});
  };
  for (int e = 0; e < E; ++e) {
    add(inter, hidden);
    add(inter, hidden);
    add(hidden, inter);
  }
  add(shared_inter, hidden);
  add(shared_inter, hidden);
  add(hidden, shared_inter);
  std::vector<SwigluWeights> experts(E);
  for (int e = 0; e < E; ++e) experts[e] = {&views[3 * e], &views[3 * e + 1], &views[3 * e + 2]};
  const SwigluWeights shared = {&views[3 * E], &views[3 * E + 1], &views[3 * E + 2]};
  MoeExperts spec{experts.data(), E, 2, 6, hidden, inter, &shared, shared_inter};

  const std::vector<float> x = random_floats(n_tokens * hidden, rng_);
  std::vector<int32_t> ids(n_tokens * k);
  for (int64_t t = 0; t < n_tokens; ++t) {  // distinct experts per token, unordered
    for (int j = 0; j < k; ++j) ids[t * k + j] = static_cast<int32_t>((t * 5 + (k - j) * 3) % E);
  }
  const std::vector<float> w = random_floats(ids.size(), rng_, 0.5f);
  std::vector<float> want(n_tokens * hidden);
  std::vector<int64_t> counters(kNumMoeCounters, 0);
  cpu_->moe_experts(x.data(), n_tokens, ids.data(), w.data(), k, spec, want.data(), counters.data());
  BackendBuffer dx = put(x), dids = put(ids), dw = put(w), dout = gpu_->alloc(want.size() * 4);
  BackendBuffer dcounters = put(std::vector<int64_t>(kNumMoeCounters, 0));
  gpu_->moe_experts(dx.as<float>(), n_tokens, dids.as<int32_t>(), dw.as<float>(), k, spec,
                    dout.as<float>(), dcounters.as<int64_t>());
  expect_close(get<float>(dout, want.size()), want, 5e-3, "experts");
  EXPECT_EQ(get<int64_t>(dcounters, kNumMoeCounters), counters);
}

TEST(CudaBackendAbsentTest, CpuIsTheDefaultWithoutAGpu) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  Result<std::unique_ptr<Backend>> b = make_backend(BackendOptions{});
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b.value()->name().substr(0, 4), "cpu-");
  BackendOptions cuda;
  cuda.device = "cuda";
  Result<std::unique_ptr<Backend>> c = make_backend(cuda);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--device cuda"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace dserve
