// The checking backend: a host-memory backend (the CPU's) whose memory only its own
// operations can touch. Every buffer is an anonymous mapping kept PROT_NONE between
// operations; an operation opens every buffer for its duration and closes them after.
// Model, engine or parallel code that reads or writes backend memory directly
// therefore dies at once with SIGSEGV at the offending line, instead of working on
// the CPU and failing on an accelerator. Every pointer an operation takes (weights
// aside) must also lie inside a live buffer: a host array handed to an operation
// aborts with the operation's name.
//
// Thread-safety: as Backend (one driving thread).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/check.h"

namespace dserve {
namespace {

class CheckingBackend final : public Backend {
 public:
  explicit CheckingBackend(std::unique_ptr<Backend> inner)
      : inner_(std::move(inner)), name_(std::string(inner_->name()) + "-checked") {}
  ~CheckingBackend() override = default;

  std::string_view name() const override { return name_; }

  BackendBuffer alloc(size_t bytes) override {
    if (bytes == 0) return {};
    void* p = map_region(bytes);
    regions_[reinterpret_cast<uintptr_t>(p)] = {round_to_pages(bytes), bytes};
    return BackendBuffer(this, p, bytes);
  }
  void release(void* data, size_t bytes) override {
    auto it = regions_.find(reinterpret_cast<uintptr_t>(data));
    DS_CHECK_MSG(it != regions_.end(), "checking backend: release of memory it did not allocate");
    munmap(data, it->second.mapped);
    regions_.erase(it);
    (void)bytes;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    check(dst, bytes, "upload");
    Open open(*this);
    std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    check(src, bytes, "download");
    Open open(*this);
    std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check(dst, bytes, "copy");
    check(src, bytes, "copy");
    Open open(*this);
    inner_->copy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    check(dst, bytes, "fill_zero");
    Open open(*this);
    inner_->fill_zero(dst, bytes);
  }
  void copy_strided(float* dst, const float* src, const StridedCopy& c) override {
    check(dst, 0, "copy_strided");
    check(src, 0, "copy_strided");
    Open open(*this);
    inner_->copy_strided(dst, src, c);
  }
  void gather_rows(const float* x, int64_t row_length, const int32_t* rows, int64_t n,
                   float* out) override {
    check(x, 0, "gather_rows");
    check(rows, n * sizeof(int32_t), "gather_rows");
    check(out, n * row_length * sizeof(float), "gather_rows");
    Open open(*this);
    inner_->gather_rows(x, row_length, rows, n, out);
  }

  Status all_reduce_sum(dist::Communicator& comm, float* data, int64_t n) override {
    check(data, n * sizeof(float), "all_reduce_sum");
    Open open(*this);
    return inner_->all_reduce_sum(comm, data, n);
  }
  Status all_gather(dist::Communicator& comm, const void* in, size_t bytes, void* out) override {
    check(in, bytes, "all_gather");
    check(out, bytes * comm.size(), "all_gather");
    Open open(*this);
    return inner_->all_gather(comm, in, bytes, out);
  }

  void matmul(const TensorView& w, const TensorView* bias, const float* x, int64_t n_tokens,
              float* y) override {
    check(x, 0, "matmul");
    check(y, 0, "matmul");
    Open open(*this);
    inner_->matmul(w, bias, x, n_tokens, y);
  }
  void matmul_many(const float* x, int64_t n_tokens, const MatmulTarget* targets,
                   int n_targets) override {
    check(x, 0, "matmul_many");
    for (int i = 0; i < n_targets; ++i) check(targets[i].y, 0, "matmul_many");
    Open open(*this);
    inner_->matmul_many(x, n_tokens, targets, n_targets);
  }
  void matmul_grouped(const MatmulGroup* groups, int n_groups) override {
    for (int g = 0; g < n_groups; ++g) {
      check(groups[g].x, 0, "matmul_grouped");
      for (int i = 0; i < groups[g].n_targets; ++i) check(groups[g].targets[i].y, 0, "matmul_grouped");
    }
    Open open(*this);
    inner_->matmul_grouped(groups, n_groups);
  }
  bool prepare_matmul_weight(const TensorView& w) override { return inner_->prepare_matmul_weight(w); }
  int64_t prepared_weight_bytes() const override { return inner_->prepared_weight_bytes(); }
  ThreadPool* host_thread_pool() override { return inner_->host_thread_pool(); }

  void get_rows(const TensorView& table, const int32_t* ids, int64_t n_ids, float* out) override {
    check(ids, n_ids * sizeof(int32_t), "get_rows");
    check(out, 0, "get_rows");
    Open open(*this);
    inner_->get_rows(table, ids, n_ids, out);
  }
  void get_rows_shard(const TensorView& table, const int32_t* ids, int64_t n_ids, int64_t first_id,
                      float* out) override {
    check(ids, n_ids * sizeof(int32_t), "get_rows_shard");
    check(out, 0, "get_rows_shard");
    Open open(*this);
    inner_->get_rows_shard(table, ids, n_ids, first_id, out);
  }
  void rms_norm(const float* x, const TensorView& weight, float eps, int64_t n_tokens, int64_t n,
                float* out) override {
    check(x, n_tokens * n * sizeof(float), "rms_norm");
    check(out, n_tokens * n * sizeof(float), "rms_norm");
    Open open(*this);
    inner_->rms_norm(x, weight, eps, n_tokens, n, out);
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    check(gate, n * sizeof(float), "silu_mul");
    check(up, n * sizeof(float), "silu_mul");
    check(out, n * sizeof(float), "silu_mul");
    Open open(*this);
    inner_->silu_mul(gate, up, n, out);
  }
  void add_inplace(float* x, const float* y, int64_t n) override {
    check(x, n * sizeof(float), "add_inplace");
    check(y, n * sizeof(float), "add_inplace");
    Open open(*this);
    inner_->add_inplace(x, y, n);
  }
  void rope(float* x, int64_t n_tokens, int n_heads, int head_dim, const int32_t* positions,
            const RopeTable& table, bool pairs_interleaved) override {
    check(x, 0, "rope");
    check(positions, n_tokens * sizeof(int32_t), "rope");
    check(table.cos, 0, "rope");
    check(table.sin, 0, "rope");
    Open open(*this);
    inner_->rope(x, n_tokens, n_heads, head_dim, positions, table, pairs_interleaved);
  }
  void attention(const float* q, const float* k, const float* v, float* out, int64_t n_tokens,
                 const int32_t* positions, int64_t n_kv, int n_heads, int n_kv_heads, int head_dim,
                 int v_dim, float scale, int64_t k_row = 0, int64_t v_row = 0) override {
    check_attention_args(q, k, v, out, positions, n_tokens, "attention");
    Open open(*this);
    inner_->attention(q, k, v, out, n_tokens, positions, n_kv, n_heads, n_kv_heads, head_dim, v_dim,
                      scale, k_row, v_row);
  }
  void prompt_attention(const float* q, const float* k, const float* v, float* out,
                        int64_t n_tokens, const int32_t* positions, int64_t n_kv, int n_heads,
                        int n_kv_heads, int head_dim, int v_dim, float scale, int64_t k_row = 0,
                        int64_t v_row = 0) override {
    check_attention_args(q, k, v, out, positions, n_tokens, "prompt_attention");
    Open open(*this);
    inner_->prompt_attention(q, k, v, out, n_tokens, positions, n_kv, n_heads, n_kv_heads,
                             head_dim, v_dim, scale, k_row, v_row);
  }
  void kv_store(DType kv_dtype, void* pool, int64_t row, const float* x, const int64_t* slots,
                int64_t n) override {
    check(pool, 0, "kv_store");
    check(x, n * row * sizeof(float), "kv_store");
    check(slots, n * sizeof(int64_t), "kv_store");
    Open open(*this);
    inner_->kv_store(kv_dtype, pool, row, x, slots, n);
  }
  void kv_gather(DType kv_dtype, const void* pool, int64_t row, const int64_t* slots, int64_t n,
                 float* out) override {
    check(pool, 0, "kv_gather");
    check(slots, n * sizeof(int64_t), "kv_gather");
    check(out, n * row * sizeof(float), "kv_gather");
    Open open(*this);
    inner_->kv_gather(kv_dtype, pool, row, slots, n, out);
  }
  void paged_attention(const float* q, DType kv_dtype, const void* k_pool, const void* v_pool,
                       float* out, const PagedBatch& batch, int n_heads, int n_kv_heads,
                       int head_dim, int v_dim, float scale) override {
    check(q, 0, "paged_attention");
    check(k_pool, 0, "paged_attention");
    check(v_pool, 0, "paged_attention");
    check(out, 0, "paged_attention");
    check(batch.positions, batch.n_tokens * sizeof(int32_t), "paged_attention");
    check(batch.seq_of_token, batch.n_tokens * sizeof(int32_t), "paged_attention");
    check(batch.block_tables, 0, "paged_attention");
    check(batch.block_table_offsets, (batch.n_seqs + 1) * sizeof(int64_t), "paged_attention");
    Open open(*this);
    inner_->paged_attention(q, kv_dtype, k_pool, v_pool, out, batch, n_heads, n_kv_heads, head_dim,
                            v_dim, scale);
  }
  void paged_latent_attention(const float* q, DType kv_dtype, const void* pool, float* out,
                              const PagedBatch& batch, int n_heads, int latent_dim, int v_dim,
                              float scale) override {
    const char* op = "paged_latent_attention";
    check(q, batch.n_tokens * n_heads * latent_dim * sizeof(float), op);
    check(pool, 0, op);
    check(out, batch.n_tokens * n_heads * v_dim * sizeof(float), op);
    check(batch.positions, batch.n_tokens * sizeof(int32_t), op);
    check(batch.seq_of_token, batch.n_tokens * sizeof(int32_t), op);
    check(batch.block_tables, 0, op);
    check(batch.block_table_offsets, (batch.n_seqs + 1) * sizeof(int64_t), op);
    Open open(*this);
    inner_->paged_latent_attention(q, kv_dtype, pool, out, batch, n_heads, latent_dim, v_dim,
                                   scale);
  }
  void moe_route(const float* logits, int64_t n_tokens, const MoeRouting& routing, int32_t* ids,
                 float* weights) override {
    check(logits, n_tokens * routing.n_experts * sizeof(float), "moe_route");
    check(ids, n_tokens * routing.top_k * sizeof(int32_t), "moe_route");
    check(weights, n_tokens * routing.top_k * sizeof(float), "moe_route");
    if (routing.correction_bias != nullptr) {
      check(routing.correction_bias, routing.n_experts * sizeof(float), "moe_route");
    }
    Open open(*this);
    inner_->moe_route(logits, n_tokens, routing, ids, weights);
  }
  void moe_experts(const float* x, int64_t n_tokens, const int32_t* ids, const float* weights, int k,
                   const MoeExperts& experts, float* out, int64_t* counters) override {
    check(x, n_tokens * experts.hidden * sizeof(float), "moe_experts");
    check(ids, n_tokens * k * sizeof(int32_t), "moe_experts");
    check(weights, n_tokens * k * sizeof(float), "moe_experts");
    check(out, n_tokens * experts.hidden * sizeof(float), "moe_experts");
    if (counters != nullptr) check(counters, kNumMoeCounters * sizeof(int64_t), "moe_experts");
    Open open(*this);
    inner_->moe_experts(x, n_tokens, ids, weights, k, experts, out, counters);
  }

 private:
  // The buffers the operation's pointers lie in (as check() found them), readable and
  // writable while it runs. Opening only those keeps the cost per operation to its own
  // buffers (a KV pool of gigabytes is not reprotected by every norm).
  class Open {
   public:
    explicit Open(CheckingBackend& b) : b_(b) { b_.protect_touched(PROT_READ | PROT_WRITE); }
    ~Open() {
      b_.protect_touched(PROT_NONE);
      b_.touched_.clear();
    }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    CheckingBackend& b_;
  };

  // An anonymous PROT_NONE mapping of bytes (whole pages). Large ones are 2 MiB
  // aligned and advised onto transparent huge pages, so that reprotecting a KV pool of
  // gigabytes changes thousands of page-table entries, not millions.
  static void* map_region(size_t bytes) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t mapped = round_to_pages(bytes);
    if (mapped < kHuge) {
      void* p = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      DS_CHECK_MSG(p != MAP_FAILED, "checking backend: mmap of %zu bytes failed", mapped);
      return p;
    }
    const size_t span = mapped + kHuge;
    void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    DS_CHECK_MSG(raw != MAP_FAILED, "checking backend: mmap of %zu bytes failed", span);
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = start + span, used_end = aligned + mapped;
    if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
#ifdef MADV_HUGEPAGE
    madvise(reinterpret_cast<void*>(aligned), mapped, MADV_HUGEPAGE);
#endif
    return reinterpret_cast<void*>(aligned);
  }
  static size_t round_to_pages(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }
  void protect_touched(int prot) {
    for (uintptr_t base : touched_) {
      DS_CHECK_MSG(mprotect(reinterpret_cast<void*>(base), regions_.at(base).mapped, prot) == 0,
                   "checking backend: mprotect failed");
    }
  }
  // p (and p + bytes, when bytes > 0) must lie in one live buffer. A null pointer is
  // an operation's "absent" argument only where bytes is 0 and the op allows it.
  void check(const void* p, size_t bytes, const char* op) {
    const auto addr = reinterpret_cast<uintptr_t>(p);
    if (p == nullptr && bytes == 0) return;
    auto it = regions_.upper_bound(addr);
    DS_CHECK_MSG(it != regions_.begin(),
                 "checking backend: %s was given a pointer outside backend memory (%p)", op, p);
    --it;
    DS_CHECK_MSG(addr >= it->first && addr + bytes <= it->first + it->second.bytes,
                 "checking backend: %s was given a pointer outside backend memory (%p, %zu bytes)",
                 op, p, bytes);
    if (std::find(touched_.begin(), touched_.end(), it->first) == touched_.end()) {
      touched_.push_back(it->first);
    }
  }
  // attention's and prompt_attention's pointers: q, k, v, out and the positions.
  void check_attention_args(const float* q, const float* k, const float* v, const float* out,
                            const int32_t* positions, int64_t n_tokens, const char* op) {
    check(q, 0, op);
    check(k, 0, op);
    check(v, 0, op);
    check(out, 0, op);
    check(positions, n_tokens * sizeof(int32_t), op);
  }

  std::unique_ptr<Backend> inner_;
  std::string name_;
  struct Region {
    size_t mapped;  // whole pages
    size_t bytes;   // as allocated: the end an operation may reach
  };
  std::map<uintptr_t, Region> regions_;  // every live buffer, by its base
  std::vector<uintptr_t> touched_;       // the current operation's buffers
};

}  // namespace

std::unique_ptr<Backend> make_checking_backend(std::unique_ptr<Backend> inner) {
  return std::make_unique<CheckingBackend>(std::move(inner));
}

}  // namespace dserve
