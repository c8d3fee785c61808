// CpuBackend: the Backend on the host CPU. Owns the thread pool and per-thread
// scratch memory; the arithmetic lives in the kernel table chosen once at
// construction (kernels.h). Each op is split over the pool where that pays.
//
// Thread-safety: as Backend: one driving thread at a time.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/scratch.h"
#include "base/thread_pool.h"

namespace dserve::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend(CpuIsa isa, int n_threads, bool pin_threads);
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string_view name() const override { return name_; }
  CpuIsa isa() const { return kernels_.isa; }
  int n_threads() const { return pool_.n_threads(); }

  // matmul, matmul_many, matmul_grouped and prepare_matmul_weight are in matmul.cc.
  void matmul(const TensorView& w, const TensorView* bias, const float* x, int64_t n_tokens,
              float* y) override;
  void matmul_many(const float* x, int64_t n_tokens, const MatmulTarget* targets,
                   int n_targets) override;
  void matmul_grouped(const MatmulGroup* groups, int n_groups) override;
  bool prepare_matmul_weight(const TensorView& w) override;
  int64_t prepared_weight_bytes() const override { return prepared_bytes_; }
  ThreadPool* host_thread_pool() override { return &pool_; }
  // Memory ops, in memory.cc: host memory (alloc_huge), transfers are copies.
  BackendBuffer alloc(size_t bytes) override;
  void release(void* data, size_t bytes) override;
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill_zero(void* dst, size_t bytes) override;
  void copy_strided(float* dst, const float* src, const StridedCopy& shape) override;
  void gather_rows(const float* x, int64_t row_length, const int32_t* rows, int64_t n,
                   float* out) override;
  void get_rows(const TensorView& table, const int32_t* ids, int64_t n_ids,
                float* out) override;
  void get_rows_shard(const TensorView& table, const int32_t* ids, int64_t n_ids,
                      int64_t first_id, float* out) override;
  // Mixture-of-experts ops, in moe.cc.
  void moe_route(const float* logits, int64_t n_tokens, const MoeRouting& routing, int32_t* ids,
                 float* weights) override;
  void moe_experts(const float* x, int64_t n_tokens, const int32_t* ids, const float* weights,
                   int k, const MoeExperts& experts, float* out, int64_t* counters) override;
  void rms_norm(const float* x, const TensorView& weight, float eps, int64_t n_tokens,
                int64_t n, float* out) override;
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override;
  void add_inplace(float* x, const float* y, int64_t n) override;
  void rope(float* x, int64_t n_tokens, int n_heads, int head_dim, const int32_t* positions,
            const RopeTable& table, bool pairs_interleaved) override;
  void attention(const float* q, const float* k, const float* v, float* out, int64_t n_tokens,
                 const int32_t* positions, int64_t n_kv, int n_heads, int n_kv_heads,
                 int head_dim, int v_dim, float scale, int64_t k_row = 0,
                 int64_t v_row = 0) override;
  void prompt_attention(const float* q, const float* k, const float* v, float* out,
                        int64_t n_tokens, const int32_t* positions, int64_t n_kv, int n_heads,
                        int n_kv_heads, int head_dim, int v_dim, float scale, int64_t k_row = 0,
                        int64_t v_row = 0) override;
  // Paged KV cache ops, in paged_attention.cc.
  void kv_store(DType kv_dtype, void* pool, int64_t row, const float* x, const int64_t* slots,
                int64_t n) override;
  void kv_gather(DType kv_dtype, const void* pool, int64_t row, const int64_t* slots, int64_t n,
                 float* out) override;
  void paged_attention(const float* q, DType kv_dtype, const void* k_pool, const void* v_pool,
                       float* out, const PagedBatch& batch, int n_heads, int n_kv_heads,
                       int head_dim, int v_dim, float scale) override;
  void paged_latent_attention(const float* q, DType kv_dtype, const void* pool, float* out,
                              const PagedBatch& batch, int n_heads, int latent_dim, int v_dim,
                              float scale) override;

 private:
  // A float copy of a small vector parameter (norm weight, bias) in any float dtype;
  // F32 tensors are returned in place.
  const float* as_f32(const TensorView& t, ScratchBuffer& buf);

  // A weight's packed copy (KernelTable::pack_weight), keyed by the original's data.
  struct PackedWeight {
    DType dtype;
    int64_t n_rows, k;
    const float* row_scales;  // I8: the scales packed with the rows
    ScratchBuffer storage;
    const uint8_t* panels;
    int64_t bytes;  // of the panels
  };
  // The packed copy made for a view of w's data, dtype and shape; null if none.
  const uint8_t* packed_for(const TensorView& w) const;
  // matmul_grouped's steps, in matmul.cc, which defines MatmulCall: what they share of
  // one call (its plan, its activation buffers, its tasks).
  struct MatmulCall;
  [[nodiscard]] bool plan_matmul(MatmulCall& call);  // false: no group has tokens
  void quantize_matmul_inputs(MatmulCall& call);
  void split_matmul_job(MatmulCall& call);
  void run_matmul_job(const MatmulCall& call);
  void add_matmul_biases(const MatmulCall& call);

  const KernelTable& kernels_;
  std::string name_;
  ThreadPool pool_;
  std::unordered_map<const void*, PackedWeight> packed_;  // see prepare_matmul_weight
  int64_t prepared_bytes_ = 0;                            // their storage, in all
  ScratchBuffer act_rows_[kNumActFormats];  // quantised activations, per ActFormat
  ScratchBuffer act_tiles_;                 // Q8x32 activations in tiles (batched kernels)
  ScratchBuffer matmul_tasks_;              // matmul_grouped's task list
  ScratchBuffer matmul_plan_;               // and its per-target / per-group plan
  ScratchBuffer param_;                     // float copies of norm weights / biases
  // moe_experts' per-call buffers: slots sorted by expert, their inputs, activations.
  struct MoeScratch {
    std::vector<int64_t> start, fill, slot_token;
    std::vector<float> slot_weight;
    ScratchBuffer expert_in, gate, up, expert_out;
    std::vector<MatmulTarget> gate_up, down;
    std::vector<MatmulGroup> groups;
  } moe_;
  std::vector<ScratchBuffer> per_thread_;  // [n_threads] attention scores etc.

  // paged_attention's steps, in paged_attention.cc, which defines PagedAttentionCall:
  // one call's inputs, shapes and tiles.
  struct PagedAttentionCall;
  // paged_attention with the pools' strides (elements between slots) given.
  void run_paged_attention(const float* q, DType kv_dtype, const void* k_pool, const void* v_pool,
                           float* out, const PagedBatch& batch, int n_heads, int n_kv_heads,
                           int head_dim, int v_dim, int64_t k_stride, int64_t v_stride,
                           float scale);
  void run_group_tasks(const PagedAttentionCall& call);
  void run_split_tasks(const PagedAttentionCall& call, int64_t n_splits, float* partials);

  // A paged_attention tile: tokens [t0, t0 + n_tokens) of the batch (one sequence)
  // times heads [h0, h0 + n_heads) (one KV group), reading keys 0..max_ctx - 1.
  struct Tile {
    int64_t t0;
    int n_tokens;
    int h0;
    int n_heads;
    int64_t max_ctx;
  };
  ScratchBuffer tiles_;     // [n_tiles] Tile, rebuilt by each paged_attention call
  ScratchBuffer partials_;  // softmax state per (tile, key split) of paged_attention
  ScratchBuffer contiguous_table_;  // attention()'s identity block table
  ScratchBuffer contiguous_seqs_;   // and its sequence of every token (all 0)
};

}  // namespace dserve::cpu
