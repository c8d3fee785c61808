// Backend: the one interface between model code and hardware. The model describes
// a forward pass as a sequence of these operations; a backend (CPU today; CUDA and
// Ascend as further implementations in their own folders) carries them out.
//
// Every pointer an operation takes (activations, scratch, KV pools, RoPE tables,
// token ids, positions, block tables, routing) points into the backend's memory:
// buffers from alloc(), filled by upload() and read back by download(), the only
// places where data crosses between host and backend. The CPU backend's memory is
// host memory, but model, engine and parallel code never touch it directly, so that
// an accelerator's backend (device memory, asynchronous streams) runs the same
// forward with one upload of a step's inputs and one download of its logits. The
// checking backend (make_cpu_backend with check_memory) enforces this on the CPU.
// Weights are TensorViews as the loader produced them (any DType); the CPU backend
// reads them in place unless the model prepared them at load (prepare_matmul_weight),
// an accelerator copies them to its memory there.
//
// Shapes are written [outer, ..., inner], row-major, contiguous unless a stride is
// given. All reductions (norms, softmax, dot products) accumulate in FP32.
//
// Thread-safety: one backend is driven by one thread (the engine thread); the
// backend parallelises internally.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backend/backend_buffer.h"
#include "base/status.h"
#include "dist/communicator.h"
#include "tensor/tensor_view.h"

namespace dserve {

class ThreadPool;

// Precomputed RoPE rotation for one model: for each position p < n_positions and
// each pair i < head_dim/2 (rotary dims only), cos/sin of p * inv_freq[i] * scale,
// including any attention-factor scaling (YaRN's mscale) folded into the values.
struct RopeTable {
  int rotary_dim = 0;      // number of leading dims of each head that rotate
  int64_t n_positions = 0;
  const float* cos = nullptr;  // [n_positions, rotary_dim / 2]
  const float* sin = nullptr;  // [n_positions, rotary_dim / 2]
};

// Where each token of a ragged batch lives in a paged KV cache.
struct PagedBatch {
  int64_t n_tokens = 0;
  const int32_t* positions = nullptr;     // [n_tokens]
  const int32_t* seq_of_token = nullptr;  // [n_tokens], index into the sequences below
  int64_t n_seqs = 0;
  // Sequence s's block table is block_tables[block_table_offsets[s] ..
  // block_table_offsets[s + 1]): [n_seqs + 1] offsets into a flat array of block ids.
  const int32_t* block_tables = nullptr;
  const int64_t* block_table_offsets = nullptr;
  int block_size = 16;
};

// One product of Backend::matmul_many: y[n_tokens, w.shape[0]] = x · wᵀ (+ bias).
struct MatmulTarget {
  const TensorView* w = nullptr;
  const TensorView* bias = nullptr;  // optional
  float* y = nullptr;
};

// One input of Backend::matmul_grouped and the products that read it.
struct MatmulGroup {
  const float* x = nullptr;  // [n_tokens, k], k the row length of every target's w
  int64_t n_tokens = 0;
  const MatmulTarget* targets = nullptr;
  int n_targets = 0;
};

// Backend::copy_strided's shape: n0 x n1 runs of len floats,
// dst[i * dst_stride0 + j * dst_stride1 + x] = src[i * src_stride0 + j * src_stride1 + x].
struct StridedCopy {
  int64_t n0 = 1, n1 = 1, len = 0;
  int64_t dst_stride0 = 0, dst_stride1 = 0;
  int64_t src_stride0 = 0, src_stride1 = 0;
};

// How a mixture-of-experts router turns its logits into choices (DeepSeekMoE's gate):
//   scores = softmax(logits) or sigmoid(logits)                        [E]
//   choice = scores + correction_bias (when given)
//   group selection (n_groups groups of E / n_groups experts): keep the top_groups
//     groups ranked by their best choice (kMaxOfGroup) or by the sum of their two
//     best (kTopTwoSum); kNone keeps every expert;
//   top_k of choice among the kept experts (ties to the lower id);
//   weights = scores at the chosen experts, / their sum (+1e-20) when normalize,
//             times scaling.
enum class MoeScoring { kSoftmax, kSigmoid };
enum class MoeGroupSelect { kNone, kMaxOfGroup, kTopTwoSum };
struct MoeRouting {
  int n_experts = 0;
  int top_k = 0;
  MoeScoring scoring = MoeScoring::kSoftmax;
  MoeGroupSelect group_select = MoeGroupSelect::kNone;
  int n_groups = 1;
  int top_groups = 1;
  bool normalize = false;
  float scaling = 1.0f;
  const float* correction_bias = nullptr;  // [n_experts] in backend memory, or null
};

// One SwiGLU feed-forward: down(silu(gate x) * up x).
struct SwigluWeights {
  const TensorView* gate = nullptr;  // [inter, hidden]
  const TensorView* up = nullptr;    // [inter, hidden]
  const TensorView* down = nullptr;  // [hidden, inter]
};

// The experts of one MoE layer as Backend::moe_experts runs them.
struct MoeExperts {
  const SwigluWeights* experts = nullptr;  // [n_experts], host array of weight views
  int n_experts = 0;
  int first = 0, end = 0;  // the experts this rank holds: [first, end)
  int64_t hidden = 0;
  int64_t inter = 0;                       // every routed expert's width
  const SwigluWeights* shared = nullptr;   // shared experts over every token, or null
  int64_t shared_inter = 0;
};

// Routed-expert work counted by moe_experts (int64 counters in backend memory).
enum MoeCounter { kMoeRoutedSlots, kMoeExpertRuns, kMoeExpertRows, kMoeExpertIdle, kNumMoeCounters };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;  // "cpu-avx512", "cpu-avx2", "cpu-scalar", ...

  // --- Memory ---------------------------------------------------------------------
  // bytes of backend memory (contents undefined; bytes may be 0: a null buffer).
  virtual BackendBuffer alloc(size_t bytes) = 0;
  // Frees what alloc() returned; BackendBuffer calls it.
  virtual void release(void* data, size_t bytes) = 0;
  // Host -> backend, backend -> host and backend -> backend copies of `bytes` bytes.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Float runs between strided layouts (StridedCopy): per-head transposes, row slices.
  virtual void copy_strided(float* dst, const float* src, const StridedCopy& shape) = 0;
  // out[i] = x[rows[i]] for x [*, row_length], out [n, row_length].
  virtual void gather_rows(const float* x, int64_t row_length, const int32_t* rows, int64_t n,
                           float* out) = 0;

  // --- Collectives over backend buffers -------------------------------------------
  // The Communicator's collectives on this backend's memory. The defaults hand the
  // pointers to comm (host memory: gloo); an accelerator pairs with a communicator on
  // its device (NCCL, HCCL) or stages through the host.
  virtual Status all_reduce_sum(dist::Communicator& comm, float* data, int64_t n) {
    return comm.all_reduce_sum({data, static_cast<size_t>(n)});
  }
  // out [comm.size() * bytes] = every rank's `in` [bytes], in rank order.
  virtual Status all_gather(dist::Communicator& comm, const void* in, size_t bytes, void* out) {
    return comm.all_gather({static_cast<const std::byte*>(in), bytes},
                           {static_cast<std::byte*>(out), bytes * static_cast<size_t>(comm.size())});
  }

  // y[n_tokens, n_out] = x[n_tokens, n_in] · w[n_out, n_in]ᵀ, then + bias[n_out] if
  // bias is non-null (bias F32/F16/BF16). w may be any DType.
  virtual void matmul(const TensorView& w, const TensorView* bias, const float* x,
                      int64_t n_tokens, float* y) = 0;

  // matmul of one input by several weights (q/k/v, gate/up), each with its own output:
  // a backend may prepare x once for all of them and run them as one job. Every w
  // must have x's row length. Default: one matmul per target.
  virtual void matmul_many(const float* x, int64_t n_tokens, const MatmulTarget* targets,
                           int n_targets) {
    for (int i = 0; i < n_targets; ++i) {
      matmul(*targets[i].w, targets[i].bias, x, n_tokens, targets[i].y);
    }
  }

  // Several matmul_many calls, each group with its own input (and row length): the
  // experts of a mixture-of-experts layer, each over the tokens routed to it, and the
  // shared experts over all. A backend may run them as one job, its work spread over
  // its threads by weight bytes rather than one job per expert. Each output is what
  // matmul would give. Default: one matmul_many per group.
  virtual void matmul_grouped(const MatmulGroup* groups, int n_groups) {
    for (int g = 0; g < n_groups; ++g) {
      matmul_many(groups[g].x, groups[g].n_tokens, groups[g].targets, groups[g].n_targets);
    }
  }

  // Optional, at model load: lets the backend keep its own copy of weight matrix w
  // laid out for its kernels (the CPU's 16-row panels), made once here instead of on
  // every call. matmul then uses the copy whenever it is given a view of the same data,
  // dtype and shape, with the same results as without it. w's memory must stay alive
  // and unchanged while the backend is used with it; preparing the same data again
  // replaces the copy. Returns true when the backend's matmuls will read the copy
  // alone, never w's memory again (its owner may then drop those pages, loader/
  // model_files.h's release_pages; they must stay mapped and unchanged). Default:
  // nothing (weights are read in place), false.
  virtual bool prepare_matmul_weight(const TensorView& w) {
    (void)w;
    return false;
  }
  // Bytes the copies made by prepare_matmul_weight hold (memory on top of the weights
  // as loaded, which memory budgets must count). Default: 0.
  virtual int64_t prepared_weight_bytes() const { return 0; }

  // Where the backend's memory is a device's own (a GPU), what it holds, for sizing the
  // KV pool from the card (--gpu-memory-utilization) rather than from host memory.
  // Default: nullopt (the backend's memory is host memory).
  struct DeviceMemory {
    int64_t total = 0;           // the device's memory
    int64_t free = 0;            // not yet taken, by this process or any other
    int64_t weight_bytes = 0;    // of what this backend took, its copies of weights
    std::string description;     // "GPU 0, NVIDIA H200" (for the start-up log)
  };
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }

  // Optional: the host threads this backend computes with, for host-side work between
  // its operations (sampling the step's logits) on the thread that drives the backend.
  // Sharing them keeps that work from competing with the backend's threads for cores.
  // Default: none (null); the caller then works on its own thread.
  virtual ThreadPool* host_thread_pool() { return nullptr; }

  // out[i] = table[ids[i]] as float: out[n_ids, row_length].
  virtual void get_rows(const TensorView& table, const int32_t* ids, int64_t n_ids,
                        float* out) = 0;
  // A vocabulary shard's embedding: out[i] = table[ids[i] - first_id] as float when
  // first_id <= ids[i] < first_id + table rows, else zeros.
  virtual void get_rows_shard(const TensorView& table, const int32_t* ids, int64_t n_ids,
                              int64_t first_id, float* out) = 0;

  // --- Mixture of experts ---------------------------------------------------------
  // ids [n_tokens, top_k], weights [n_tokens, top_k] from the router's logits
  // [n_tokens, n_experts] (see MoeRouting), in FP32.
  virtual void moe_route(const float* logits, int64_t n_tokens, const MoeRouting& routing,
                         int32_t* ids, float* weights) = 0;
  // out[t] = sum over t's slots j whose expert e = ids[t, j] this rank holds, in
  // increasing e, of weights[t, j] * expert_e(x[t]); then + shared(x[t]) when the
  // layer has shared experts. x, out [n_tokens, hidden]; ids, weights [n_tokens, k].
  // Each expert runs once over the tokens routed to it; experts no token chose are not
  // touched. counters (int64 [kNumMoeCounters] in backend memory, or null) accumulate
  // the work done.
  virtual void moe_experts(const float* x, int64_t n_tokens, const int32_t* ids,
                           const float* weights, int k, const MoeExperts& experts, float* out,
                           int64_t* counters) = 0;

  // out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, for x, out [n_tokens, n].
  // out may alias x.
  virtual void rms_norm(const float* x, const TensorView& weight, float eps, int64_t n_tokens,
                        int64_t n, float* out) = 0;

  // out = silu(gate) * up elementwise, n values. out may alias gate.
  virtual void silu_mul(const float* gate, const float* up, int64_t n, float* out) = 0;

  // x += y elementwise, n values.
  virtual void add_inplace(float* x, const float* y, int64_t n) = 0;

  // Rotates, in place, the first table.rotary_dim dims of each head of
  // x[n_tokens, n_heads, head_dim], token t at position positions[t].
  // pairs_interleaved: rotate (x[2i], x[2i+1]) (GPT-J / GGUF-Llama layout);
  // otherwise rotate (x[i], x[i + rotary_dim/2]) (Hugging Face "rotate_half").
  virtual void rope(float* x, int64_t n_tokens, int n_heads, int head_dim,
                    const int32_t* positions, const RopeTable& table, bool pairs_interleaved) = 0;

  // Causal attention of one sequence over a contiguous KV store.
  //   q   [n_tokens, n_heads, head_dim]        queries, token t at position positions[t]
  //   k   [n_kv, n_kv_heads, head_dim]         keys for positions 0..n_kv-1
  //   v   [n_kv, n_kv_heads, v_dim]            values
  //   out [n_tokens, n_heads, v_dim]
  // Token t attends to keys 0..positions[t]. Head h uses kv head h / (n_heads / n_kv_heads).
  // Softmax in FP32 with the given scale. k_row / v_row: floats from one position's keys
  // (values) to the next, at least n_kv_heads * head_dim (v_dim); 0 means exactly that.
  // A padded row keeps a head's keys from falling into one cache set when the row is a
  // multiple of 4 KiB (128 heads of 192 floats).
  virtual void attention(const float* q, const float* k, const float* v, float* out,
                         int64_t n_tokens, const int32_t* positions, int64_t n_kv, int n_heads,
                         int n_kv_heads, int head_dim, int v_dim, float scale, int64_t k_row = 0,
                         int64_t v_row = 0) = 0;

  // attention() for a prompt's many queries (MLA's expanded form): the same contract,
  // by a kernel that may suit many queries better and whose arithmetic may differ
  // from attention()'s; a query's output is the same whatever other queries the call
  // has, so a prompt gives the same bits however it is cut into calls.
  virtual void prompt_attention(const float* q, const float* k, const float* v, float* out,
                                int64_t n_tokens, const int32_t* positions, int64_t n_kv,
                                int n_heads, int n_kv_heads, int head_dim, int v_dim,
                                float scale, int64_t k_row = 0, int64_t v_row = 0) {
    attention(q, k, v, out, n_tokens, positions, n_kv, n_heads, n_kv_heads, head_dim, v_dim,
              scale, k_row, v_row);
  }

  // --- Paged KV cache -------------------------------------------------------------
  // A KV pool is n_slots = n_blocks * block_size token slots, each holding `row`
  // elements of kv_dtype (keys: n_kv_heads * head_dim; values: n_kv_heads * v_dim; an
  // MLA latent: kv_lora_rank + qk_rope_head_dim). Slot of position p of a sequence with
  // block table T: T[p / block_size] * block_size + p % block_size.
  // kv_dtype is F32 or F16 (IEEE half: stores round to nearest even, reads convert
  // exactly; all arithmetic stays FP32).

  // pool[slots[t]] = x[t] (converted to kv_dtype) for x [n, row]. Slots are distinct.
  virtual void kv_store(DType kv_dtype, void* pool, int64_t row, const float* x,
                        const int64_t* slots, int64_t n) = 0;

  // out[i] = pool[slots[i]] as float, for out [n, row].
  virtual void kv_gather(DType kv_dtype, const void* pool, int64_t row, const int64_t* slots,
                         int64_t n, float* out) = 0;

  // Causal attention for a ragged batch of tokens from several sequences over paged
  // K/V pools of kv_dtype (k_pool [n_slots, n_kv_heads, head_dim], v_pool [n_slots,
  // n_kv_heads, v_dim]). q [n_tokens, n_heads, head_dim], out [n_tokens, n_heads,
  // v_dim]. Token t belongs to sequence batch.seq_of_token[t] and attends to that
  // sequence's positions 0..batch.positions[t], whose keys must already be stored. GQA
  // and softmax as in attention(). An F16 pool gives bit for bit the output of an F32
  // pool holding the same (F16-representable) values.
  virtual void paged_attention(const float* q, DType kv_dtype, const void* k_pool,
                               const void* v_pool, float* out, const PagedBatch& batch,
                               int n_heads, int n_kv_heads, int head_dim, int v_dim,
                               float scale) = 0;

  // MLA's absorbed attention (DeepSeek): one paged latent pool [n_slots, latent_dim] of
  // kv_dtype, whose whole rows are the keys and whose first v_dim elements the values,
  // shared by all n_heads query heads. q [n_tokens, n_heads, latent_dim], out
  // [n_tokens, n_heads, v_dim]. Bit for bit the first v_dim values of each output row
  // of paged_attention(q, pool, pool, n_heads, 1 kv head, latent_dim, latent_dim), so
  // causal and batch-invariant as it is; the values' tail (MLA's rope part) is never
  // read.
  virtual void paged_latent_attention(const float* q, DType kv_dtype, const void* pool,
                                      float* out, const PagedBatch& batch, int n_heads,
                                      int latent_dim, int v_dim, float scale) = 0;
};

inline void BackendBuffer::reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->release(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

template <typename T>
T* DeviceArray<T>::ensure(int64_t n) {
  if (n > size()) {
    buf_.reset();
    // Geometric growth, so that a batch growing a little each step reallocates rarely.
    const int64_t grown = n + n / 2;
    buf_ = backend_->alloc(static_cast<size_t>(grown) * sizeof(T));
  }
  return get();
}

template <typename T>
T* DeviceArray<T>::upload(const T* host, int64_t n) {
  T* dst = ensure(n);
  backend_->upload(dst, host, static_cast<size_t>(n) * sizeof(T));
  return dst;
}

// DSERVE_CHECK_BACKEND_MEMORY=1 in the environment.
bool check_memory_from_environment();

struct CpuBackendOptions {
  int n_threads = 0;  // 0: one per online CPU
  bool pin_threads = false;
  // Force an instruction set ("scalar", "avx2", "avx512"); empty: best available.
  std::string isa;
  // The checking backend: the CPU backend with its memory unreadable outside its own
  // operations and every pointer an operation takes checked against its buffers, so
  // that any host access to backend memory fails loudly (tests). Defaults to on when
  // the environment variable DSERVE_CHECK_BACKEND_MEMORY is 1, so that a test suite
  // runs every process it starts with it.
  bool check_memory = check_memory_from_environment();
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

// Wraps `inner` (a host-memory backend) as the checking backend described at
// CpuBackendOptions::check_memory.
std::unique_ptr<Backend> make_checking_backend(std::unique_ptr<Backend> inner);

}  // namespace dserve
