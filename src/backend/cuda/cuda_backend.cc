// CudaBackend: the Backend interface on one NVIDIA GPU. Backend memory is device
// memory (cudaMalloc); every operation is a kernel launch on one stream (kernels.h),
// so a step runs without waiting for the GPU until its logits are downloaded. Weights
// arrive as TensorViews of host memory (the mapped model files): the first use of a
// view (or prepare_matmul_weight, at load) copies it to the device, where it stays,
// found again by its address, size and dtype.
//
// Thread-safety: one driving thread (backend.h).
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend_registry.h"
#include "backend/cuda/kernel_args.h"
#include "backend/cuda/kernels.h"
#include "base/check.h"
#include "base/log.h"
#include "tensor/dequantize.h"

namespace dserve {
namespace {

static_assert(int{kMoeRoutedSlots} == cuda::kMoeRoutedSlotsIndex &&
              int{kMoeExpertRuns} == cuda::kMoeExpertRunsIndex &&
              int{kMoeExpertRows} == cuda::kMoeExpertRowsIndex &&
              int{kMoeExpertIdle} == cuda::kMoeExpertIdleIndex &&
              int{kNumMoeCounters} == cuda::kMoeCounterCount);

#define DS_CUDA_CHECK(call)                                                                 \
  do {                                                                                     \
    const cudaError_t err_ = (call);                                                       \
    DS_CHECK_MSG(err_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(err_));          \
  } while (0)

class CudaBackend final : public Backend {
 public:
  CudaBackend(int gpu, std::string description) : gpu_(gpu), description_(std::move(description)) {
    DS_CUDA_CHECK(cudaSetDevice(gpu_));
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    act_q_.bind(this);
    act_scale_.bind(this);
    moe_h_.bind(this);
    moe_slot_out_.bind(this);
    moe_shared_.bind(this);
  }
  ~CudaBackend() override {
    // Buffers owned here go before the stream; the caller's buffers are theirs.
    act_q_ = {};
    act_scale_ = {};
    moe_h_ = {};
    moe_slot_out_ = {};
    moe_shared_ = {};
    moe_tables_.clear();
    weights_.clear();
    cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "cuda"; }

  // --- Memory ---------------------------------------------------------------------
  BackendBuffer alloc(size_t bytes) override {
    if (bytes == 0) return {};
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    DS_CHECK_MSG(err == cudaSuccess, "GPU out of memory allocating %zu bytes: %s", bytes,
                 cudaGetErrorString(err));
    return BackendBuffer(this, p, bytes);
  }
  void release(void* data, size_t bytes) override {
    (void)bytes;
    DS_CUDA_CHECK(cudaFree(data));
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    // Synchronous: the host buffer may change once this returns.
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    const auto* d = static_cast<const char*>(dst);
    const auto* s = static_cast<const char*>(src);
    if (d < s + bytes && s < d + bytes) {  // overlapping (memmove): through a temporary
      BackendBuffer tmp = alloc(bytes);
      DS_CUDA_CHECK(cudaMemcpyAsync(tmp.data(), src, bytes, cudaMemcpyDeviceToDevice, stream_));
      src = tmp.data();
      DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
      DS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // before tmp is freed
      return;
    }
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes > 0) DS_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void copy_strided(float* dst, const float* src, const StridedCopy& c) override {
    cuda::copy_strided(dst, src, c.n0, c.n1, c.len, c.dst_stride0, c.dst_stride1, c.src_stride0,
                       c.src_stride1, stream_);
    check_launch();
  }
  void gather_rows(const float* x, int64_t row_length, const int32_t* rows, int64_t n,
                   float* out) override {
    cuda::gather_rows(x, row_length, rows, n, out, stream_);
    check_launch();
  }

  // --- Collectives: staged through host memory (NCCL pairs with GPUs directly). ---
  Status all_reduce_sum(dist::Communicator& comm, float* data, int64_t n) override {
    std::vector<float> host(static_cast<size_t>(n));
    download(host.data(), data, host.size() * sizeof(float));
    DS_RETURN_IF_ERROR(comm.all_reduce_sum({host.data(), host.size()}));
    upload(data, host.data(), host.size() * sizeof(float));
    return Status();
  }
  Status all_gather(dist::Communicator& comm, const void* in, size_t bytes, void* out) override {
    std::vector<std::byte> mine(bytes), all(bytes * static_cast<size_t>(comm.size()));
    download(mine.data(), in, bytes);
    DS_RETURN_IF_ERROR(comm.all_gather({mine.data(), mine.size()}, {all.data(), all.size()}));
    upload(out, all.data(), all.size());
    return Status();
  }

  // --- Weights and matmuls ----------------------------------------------------------
  void matmul(const TensorView& w, const TensorView* bias, const float* x, int64_t n_tokens,
              float* y) override {
    const cuda::DeviceMatrix& m = matrix(w);
    const float* b = bias != nullptr ? floats(*bias) : nullptr;
    int8_t* q = nullptr;
    float* q_scale = nullptr;
    if (m.dtype == DType::kI8) {
      q = act_q_.ensure(n_tokens * m.n_cols);
      q_scale = act_scale_.ensure(n_tokens);
    }
    cuda::matmul(m, b, x, n_tokens, y, q, q_scale, stream_);
    check_launch();
  }
  bool prepare_matmul_weight(const TensorView& w) override {
    matrix(w);  // copied to the device at load rather than on the first step
    return false;
  }
  std::optional<DeviceMemory> device_memory() const override {
    size_t free = 0, total = 0;
    DS_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    DeviceMemory m;
    m.total = static_cast<int64_t>(total);
    m.free = static_cast<int64_t>(free);
    m.weight_bytes = weight_bytes_;
    m.description = description_;
    return m;
  }

  void get_rows(const TensorView& table, const int32_t* ids, int64_t n_ids, float* out) override {
    get_rows_shard(table, ids, n_ids, 0, out);
  }
  void get_rows_shard(const TensorView& table, const int32_t* ids, int64_t n_ids, int64_t first_id,
                      float* out) override {
    cuda::get_rows(matrix(table), ids, n_ids, first_id, out, stream_);
    check_launch();
  }

  // --- Mixture of experts -----------------------------------------------------------
  void moe_route(const float* logits, int64_t n_tokens, const MoeRouting& r, int32_t* ids,
                 float* weights) override {
    DS_CHECK_MSG(r.n_experts <= cuda::kMaxRoutedExperts, "%d routed experts: at most %d on CUDA",
                 r.n_experts, cuda::kMaxRoutedExperts);
    DS_CHECK_MSG(r.group_select == MoeGroupSelect::kNone || r.n_groups <= cuda::kMaxExpertGroups,
                 "%d expert groups: at most %d on CUDA", r.n_groups, cuda::kMaxExpertGroups);
    cuda::moe_route(logits, n_tokens, cuda::routing_args_of(r), ids, weights, stream_);
    check_launch();
  }
  void moe_experts(const float* x, int64_t n_tokens, const int32_t* ids, const float* weights,
                   int k, const MoeExperts& spec, float* out, int64_t* counters) override;

  // --- Element-wise ---------------------------------------------------------------
  void rms_norm(const float* x, const TensorView& weight, float eps, int64_t n_tokens, int64_t n,
                float* out) override {
    DS_CHECK(weight.n_elements() == n);
    cuda::rms_norm(x, floats(weight), eps, n_tokens, n, out, stream_);
    check_launch();
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    cuda::silu_mul(gate, up, n, out, stream_);
    check_launch();
  }
  void add_inplace(float* x, const float* y, int64_t n) override {
    cuda::add_inplace(x, y, n, stream_);
    check_launch();
  }
  void rope(float* x, int64_t n_tokens, int n_heads, int head_dim, const int32_t* positions,
            const RopeTable& table, bool pairs_interleaved) override {
    DS_CHECK(table.rotary_dim % 2 == 0 && table.rotary_dim <= head_dim);
    cuda::rope(x, n_tokens, n_heads, head_dim, positions, table.rotary_dim, table.n_positions,
               table.cos, table.sin, pairs_interleaved, stream_);
    check_launch();
  }

  // --- Attention --------------------------------------------------------------------
  void attention(const float* q, const float* k, const float* v, float* out, int64_t n_tokens,
                 const int32_t* positions, int64_t n_kv, int n_heads, int n_kv_heads, int head_dim,
                 int v_dim, float scale, int64_t k_row, int64_t v_row) override {
    (void)n_kv;
    DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    cuda::AttentionArgs a = attention_args(q, out, n_tokens, positions, n_heads, n_kv_heads,
                                           head_dim, v_dim, scale);
    a.k = k;
    a.v = v;
    a.k_row = k_row != 0 ? k_row : int64_t{n_kv_heads} * head_dim;
    a.v_row = v_row != 0 ? v_row : int64_t{n_kv_heads} * v_dim;
    cuda::attention(a, stream_);
    check_launch();
  }
  void kv_store(DType kv_dtype, void* pool, int64_t row, const float* x, const int64_t* slots,
                int64_t n) override {
    check_kv_dtype(kv_dtype);
    cuda::kv_store(kv_dtype, pool, row, x, slots, n, stream_);
    check_launch();
  }
  void kv_gather(DType kv_dtype, const void* pool, int64_t row, const int64_t* slots, int64_t n,
                 float* out) override {
    check_kv_dtype(kv_dtype);
    cuda::kv_gather(kv_dtype, pool, row, slots, n, out, stream_);
    check_launch();
  }
  void paged_attention(const float* q, DType kv_dtype, const void* k_pool, const void* v_pool,
                       float* out, const PagedBatch& batch, int n_heads, int n_kv_heads,
                       int head_dim, int v_dim, float scale) override {
    check_kv_dtype(kv_dtype);
    DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    cuda::AttentionArgs a = attention_args(q, out, batch.n_tokens, batch.positions, n_heads,
                                           n_kv_heads, head_dim, v_dim, scale);
    a.k = k_pool;
    a.v = v_pool;
    a.kv_dtype = kv_dtype;
    a.k_row = int64_t{n_kv_heads} * head_dim;
    a.v_row = int64_t{n_kv_heads} * v_dim;
    set_paging(batch, &a);
    cuda::attention(a, stream_);
    check_launch();
  }
  void paged_latent_attention(const float* q, DType kv_dtype, const void* pool, float* out,
                              const PagedBatch& batch, int n_heads, int latent_dim, int v_dim,
                              float scale) override {
    check_kv_dtype(kv_dtype);
    cuda::AttentionArgs a = attention_args(q, out, batch.n_tokens, batch.positions, n_heads, 1,
                                           latent_dim, v_dim, scale);
    a.k = pool;
    a.v = pool;
    a.kv_dtype = kv_dtype;
    a.k_row = latent_dim;
    a.v_row = latent_dim;
    set_paging(batch, &a);
    cuda::attention(a, stream_);
    check_launch();
  }

 private:
  // One weight on the device: its bytes and scales, and the matrix the kernels read.
  struct DeviceWeight {
    BackendBuffer data, row_scales, row_bias, scales;
    BackendBuffer as_floats;  // floats(): the values as F32 (norm weights, biases)
    cuda::DeviceMatrix matrix;
  };
  using WeightKey = std::tuple<const void*, size_t, int>;

  // A launch's configuration errors show at once; errors inside kernels at the next
  // synchronisation (a download).
  void check_launch() { DS_CUDA_CHECK(cudaGetLastError()); }

  static void check_kv_dtype(DType t) {
    DS_CHECK_MSG(t == DType::kF32 || t == DType::kF16 || t == DType::kF8_E4M3,
                 "paged KV cache of %s: only f32, f16 and f8_e4m3 are supported",
                 std::string(dtype_name(t)).c_str());
  }

  static cuda::AttentionArgs attention_args(const float* q, float* out, int64_t n_tokens,
                                            const int32_t* positions, int n_heads, int n_kv_heads,
                                            int head_dim, int v_dim, float scale) {
    DS_CHECK_MSG(v_dim <= cuda::kMaxAttentionVDim, "attention value width %d: at most %d on CUDA",
                 v_dim, cuda::kMaxAttentionVDim);
    cuda::AttentionArgs a;
    a.q = q;
    a.out = out;
    a.n_tokens = n_tokens;
    a.positions = positions;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.v_dim = v_dim;
    a.scale = scale;
    return a;
  }
  static void set_paging(const PagedBatch& batch, cuda::AttentionArgs* a) {
    DS_CHECK(batch.block_size > 0);
    a->seq_of_token = batch.seq_of_token;
    a->block_tables = batch.block_tables;
    a->block_table_offsets = batch.block_table_offsets;
    a->block_size = batch.block_size;
  }

  DeviceWeight& weight(const TensorView& w);
  const cuda::DeviceMatrix& matrix(const TensorView& w) { return weight(w).matrix; }
  const float* floats(const TensorView& t);
  BackendBuffer upload_copy(const void* src, size_t bytes) {
    BackendBuffer b = alloc(bytes);
    upload(b.data(), src, bytes);
    weight_bytes_ += static_cast<int64_t>(bytes);
    return b;
  }
  const cuda::DeviceMatrix* expert_table(const MoeExperts& spec, DType* dtype);

  int gpu_;
  std::string description_;
  cudaStream_t stream_ = nullptr;
  std::map<WeightKey, DeviceWeight> weights_;
  int64_t weight_bytes_ = 0;
  DeviceArray<int8_t> act_q_;
  DeviceArray<float> act_scale_;
  // A MoE layer's experts as the kernels read them, per (experts array, first, end).
  std::map<std::tuple<const void*, int, int>, std::pair<BackendBuffer, DType>> moe_tables_;
  DeviceArray<float> moe_h_, moe_slot_out_, moe_shared_;
};

CudaBackend::DeviceWeight& CudaBackend::weight(const TensorView& w) {
  const WeightKey key{w.data, w.n_bytes, static_cast<int>(w.dtype)};
  auto it = weights_.find(key);
  if (it != weights_.end()) return it->second;
  DS_CHECK_MSG(cuda::matmul_dtype_supported(w.dtype), "a %s weight: no CUDA kernel reads it",
               std::string(dtype_name(w.dtype)).c_str());
  DeviceWeight d;
  cuda::DeviceMatrix& m = d.matrix;
  m = cuda::matrix_of(w);  // host pointers, replaced by the device copies' below
  d.data = upload_copy(w.data, w.n_bytes);
  m.data = d.data.as<uint8_t>();
  const size_t row_floats = static_cast<size_t>(m.n_rows) * sizeof(float);
  if (w.row_scales != nullptr) {
    d.row_scales = upload_copy(w.row_scales, row_floats);
    m.row_scales = d.row_scales.as<float>();
  }
  if (w.row_bias != nullptr) {
    d.row_bias = upload_copy(w.row_bias, row_floats);
    m.row_bias = d.row_bias.as<float>();
  }
  if (w.block_scales.data != nullptr) {
    d.scales = upload_copy(w.block_scales.data,
                           static_cast<size_t>(cuda::block_scale_floats(w)) * sizeof(float));
    m.scales = d.scales.as<float>();
  }
  return weights_.emplace(key, std::move(d)).first->second;
}

const float* CudaBackend::floats(const TensorView& t) {
  DeviceWeight& d = weight(t);
  if (t.dtype == DType::kF32) return d.data.as<float>();
  if (d.as_floats.data() == nullptr) {
    std::vector<float> host(static_cast<size_t>(t.n_elements()));
    dequantize_row(t.dtype, t.data, host.data(), t.n_elements());
    d.as_floats = upload_copy(host.data(), host.size() * sizeof(float));
  }
  return d.as_floats.as<float>();
}

const cuda::DeviceMatrix* CudaBackend::expert_table(const MoeExperts& spec, DType* dtype) {
  const std::tuple<const void*, int, int> key{spec.experts, spec.first, spec.end};
  auto it = moe_tables_.find(key);
  if (it == moe_tables_.end()) {
    std::vector<cuda::DeviceMatrix> table(3 * static_cast<size_t>(spec.n_experts));
    DType first_dtype = spec.experts[spec.first].gate->dtype;
    for (int e = spec.first; e < spec.end; ++e) {
      const SwigluWeights& ex = spec.experts[e];
      const TensorView* parts[3] = {ex.gate, ex.up, ex.down};
      for (int p = 0; p < 3; ++p) {
        DS_CHECK_MSG(parts[p]->dtype == first_dtype,
                     "experts of one layer in %s and %s: the CUDA kernels take one dtype",
                     std::string(dtype_name(first_dtype)).c_str(),
                     std::string(dtype_name(parts[p]->dtype)).c_str());
        table[3 * e + p] = matrix(*parts[p]);
      }
    }
    BackendBuffer buf = alloc(table.size() * sizeof(cuda::DeviceMatrix));
    upload(buf.data(), table.data(), table.size() * sizeof(cuda::DeviceMatrix));
    it = moe_tables_.emplace(key, std::make_pair(std::move(buf), first_dtype)).first;
  }
  *dtype = it->second.second;
  return it->second.first.as<cuda::DeviceMatrix>();
}

void CudaBackend::moe_experts(const float* x, int64_t n_tokens, const int32_t* ids,
                              const float* weights, int k, const MoeExperts& spec, float* out,
                              int64_t* counters) {
  DS_CHECK(spec.first >= 0 && spec.first < spec.end && spec.end <= spec.n_experts);
  DS_CHECK_MSG(spec.n_experts <= cuda::kMaxRoutedExperts, "%d routed experts: at most %d on CUDA",
               spec.n_experts, cuda::kMaxRoutedExperts);
  cuda::MoeArgs a;
  a.x = x;
  a.n_tokens = n_tokens;
  a.ids = ids;
  a.weights = weights;
  a.k = k;
  a.experts = expert_table(spec, &a.dtype);
  a.n_experts = spec.n_experts;
  a.first = spec.first;
  a.end = spec.end;
  a.hidden = spec.hidden;
  a.inter = spec.inter;
  a.h = moe_h_.ensure(std::max<int64_t>(n_tokens * k * spec.inter, 1));
  a.slot_out = moe_slot_out_.ensure(std::max<int64_t>(n_tokens * k * spec.hidden, 1));
  a.out = out;
  a.counters = counters;
  cuda::moe_experts(a, stream_);
  check_launch();
  if (spec.shared == nullptr || n_tokens == 0) return;
  // The shared experts over every token, added after the routed sum (as the CPU).
  const int64_t si = spec.shared_inter;
  float* gate = moe_shared_.ensure(n_tokens * (2 * si + spec.hidden));
  float* up = gate + n_tokens * si;
  float* down = up + n_tokens * si;
  matmul(*spec.shared->gate, nullptr, x, n_tokens, gate);
  matmul(*spec.shared->up, nullptr, x, n_tokens, up);
  silu_mul(gate, up, n_tokens * si, gate);
  matmul(*spec.shared->down, nullptr, gate, n_tokens, down);
  add_inplace(out, down, n_tokens * spec.hidden);
}

std::string device_text(int gpu) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, gpu) != cudaSuccess) return "GPU " + std::to_string(gpu);
  return "GPU " + std::to_string(gpu) + ", " + prop.name + ", sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor);
}

}  // namespace

bool cuda_backend_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(int gpu) {
  int n = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&n); err != cudaSuccess) {
    // Without a driver the runtime reports "insufficient driver": say what it means.
    return unimplemented(std::string("--device cuda: no usable GPU (no NVIDIA driver for CUDA 13 "
                                     "or no GPU found; the CUDA runtime says: ") +
                         cudaGetErrorString(err) + ")");
  }
  if (gpu < 0 || gpu >= n) {
    return invalid_argument("GPU " + std::to_string(gpu) + ": this machine has " +
                            std::to_string(n) + (n == 1 ? " GPU" : " GPUs"));
  }
  std::string description = device_text(gpu);
  DS_LOG_INFO("CUDA backend: {}", description);
  return std::unique_ptr<Backend>(new CudaBackend(gpu, std::move(description)));
}

}  // namespace dserve
