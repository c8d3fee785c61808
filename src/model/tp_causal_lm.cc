#include "model/tp_causal_lm.h"

#include <map>
#include <string>
#include <vector>

#include "base/log.h"

namespace dserve {
namespace {

enum class Op : int32_t {
  kShutdown = 0,
  kNewCache,      // id
  kDropCache,     // id
  kClearCache,    // id
  kForward,       // id, a = LogitsFor, payload: tokens, positions
  kNewPaged,      // id, a = n_blocks, b = block_size, c = dtype
  kDropPaged,     // id
  kCopyBlock,     // id, a = src, b = dst, c = n_tokens
  kForwardBatch,  // id, payload: tokens, positions, seq_of_token, block_tables, logits_rows (int32);
                  //     then block_table_offsets (int64), prompt_lens (int32)
  kForwardIdle,   // (no arguments) this engine's part of the expert-parallel exchanges, no tokens
  kEnableMtp,     // (no arguments)
  kForwardMtp,    // id, a = prev_is_target, payload: as kForwardBatch, then prev_rows (int32)
};

// One call as broadcast from rank 0: a fixed header, then `payload_bytes` of arrays.
struct CallHeader {
  int32_t op = 0;
  int32_t id = 0;
  int64_t a = 0, b = 0, c = 0;
  int64_t lengths[8] = {};  // element counts of the payload's arrays, in order
  int64_t payload_bytes = 0;
};

std::span<std::byte> bytes_of(CallHeader& h) { return {reinterpret_cast<std::byte*>(&h), sizeof h}; }

// Packs int32/int64 arrays one after the other.
class Payload {
 public:
  template <typename T>
  void add(std::span<const T> v, int64_t* length) {
    *length = static_cast<int64_t>(v.size());
    const auto* p = reinterpret_cast<const std::byte*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size_bytes());
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

// Reads the arrays back in the same order.
class PayloadReader {
 public:
  explicit PayloadReader(const std::vector<std::byte>& bytes) : bytes_(bytes) {}
  template <typename T>
  Result<std::span<const T>> next(int64_t length) {
    const size_t n = static_cast<size_t>(length) * sizeof(T);
    if (length < 0 || at_ + n > bytes_.size()) return internal_error("tensor-parallel call payload is truncated");
    std::span<const T> out(reinterpret_cast<const T*>(bytes_.data() + at_), static_cast<size_t>(length));
    at_ += n;
    return out;
  }

 private:
  const std::vector<std::byte>& bytes_;
  size_t at_ = 0;
};

class TpDriver;

class TpSequenceCache final : public SequenceCache {
 public:
  TpSequenceCache(TpDriver* driver, int id, std::unique_ptr<SequenceCache> local)
      : driver_(driver), id_(id), local_(std::move(local)) {}
  ~TpSequenceCache() override;
  int64_t n_tokens() const override { return local_->n_tokens(); }
  int64_t capacity() const override { return local_->capacity(); }
  void clear() override;
  size_t bytes_per_token() const override { return local_->bytes_per_token(); }
  size_t total_bytes() const override { return local_->total_bytes(); }
  int id() const { return id_; }
  SequenceCache& local() { return *local_; }

 private:
  TpDriver* driver_;
  int id_;
  std::unique_ptr<SequenceCache> local_;
};

class TpPagedCache final : public PagedCache {
 public:
  TpPagedCache(TpDriver* driver, int id, std::unique_ptr<PagedCache> local)
      : driver_(driver), id_(id), local_(std::move(local)) {}
  ~TpPagedCache() override;
  int n_blocks() const override { return local_->n_blocks(); }
  int block_size() const override { return local_->block_size(); }
  DType dtype() const override { return local_->dtype(); }
  size_t bytes_per_token() const override { return local_->bytes_per_token(); }
  size_t total_bytes() const override { return local_->total_bytes(); }
  void copy_block(int src, int dst, int n_tokens) override;
  int id() const { return id_; }
  PagedCache& local() { return *local_; }

 private:
  TpDriver* driver_;
  int id_;
  std::unique_ptr<PagedCache> local_;
};

class TpDriver final : public CausalLm {
 public:
  TpDriver(std::unique_ptr<CausalLm> local, std::unique_ptr<dist::Communicator> comm,
           std::unique_ptr<RankWatcher> watcher, std::unique_ptr<dist::Communicator> expert_comm)
      : comm_(std::move(comm)),
        watcher_(std::move(watcher)),
        expert_comm_(std::move(expert_comm)),
        local_(std::move(local)) {}
  ~TpDriver() override {
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kShutdown);
    (void)send(h, nullptr);
    local_.reset();
    expert_comm_.reset();
    // Closing our connections ends any worker that missed the shutdown (the group
    // broke), so waiting for the worker processes below cannot hang.
    comm_.reset();
    watcher_.reset();  // e.g. waits for the worker processes to exit
  }

  const ModelInfo& info() const override { return local_->info(); }
  std::unique_ptr<SequenceCache> new_cache() const override {
    auto* self = const_cast<TpDriver*>(this);  // the call log is not model state
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kNewCache);
    h.id = self->next_id_++;
    (void)self->send(h, nullptr);
    return std::make_unique<TpSequenceCache>(self, h.id, local_->new_cache());
  }
  Status forward(std::span<const int32_t> tokens, std::span<const int32_t> positions, SequenceCache& cache,
                 LogitsFor which, std::vector<float>* logits) override {
    auto& c = static_cast<TpSequenceCache&>(cache);
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kForward);
    h.id = c.id();
    h.a = static_cast<int64_t>(which);
    Payload p;
    p.add(tokens, &h.lengths[0]);
    p.add(positions, &h.lengths[1]);
    DS_RETURN_IF_ERROR(send(h, &p));
    return named(local_->forward(tokens, positions, c.local(), which, logits));
  }
  size_t paged_bytes_per_token(DType dtype) const override { return local_->paged_bytes_per_token(dtype); }
  Result<std::unique_ptr<PagedCache>> new_paged_cache(int n_blocks, int block_size, DType dtype) const override {
    auto* self = const_cast<TpDriver*>(this);
    DS_ASSIGN_OR_RETURN(std::unique_ptr<PagedCache> local, local_->new_paged_cache(n_blocks, block_size, dtype));
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kNewPaged);
    h.id = self->next_id_++;
    h.a = n_blocks;
    h.b = block_size;
    h.c = static_cast<int64_t>(dtype);
    DS_RETURN_IF_ERROR(self->send(h, nullptr));
    return std::unique_ptr<PagedCache>(new TpPagedCache(self, h.id, std::move(local)));
  }
  Status forward_batch(const ModelBatch& batch, PagedCache& cache, std::vector<float>* logits) override {
    auto& c = static_cast<TpPagedCache&>(cache);
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kForwardBatch);
    h.id = c.id();
    Payload p;
    add_batch(batch, &p, &h);
    DS_RETURN_IF_ERROR(send(h, &p));
    return named(local_->forward_batch(batch, c.local(), logits));
  }
  static void add_batch(const ModelBatch& batch, Payload* p, CallHeader* h) {
    p->add(batch.tokens, &h->lengths[0]);
    p->add(batch.positions, &h->lengths[1]);
    p->add(batch.seq_of_token, &h->lengths[2]);
    p->add(batch.block_tables, &h->lengths[3]);
    p->add(batch.logits_rows, &h->lengths[4]);
    p->add(batch.block_table_offsets, &h->lengths[5]);
    p->add(batch.prompt_lens, &h->lengths[7]);  // forward_mtp's rows (lengths[6]) follow
  }
  bool has_mtp_layer() const override { return local_->has_mtp_layer(); }
  Status enable_mtp() override {
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kEnableMtp);
    DS_RETURN_IF_ERROR(send(h, nullptr));
    return named(local_->enable_mtp());
  }
  Status forward_mtp(const ModelBatch& batch, PagedCache& cache, std::span<const int32_t> prev_rows,
                     bool prev_is_target, std::vector<float>* logits) override {
    auto& c = static_cast<TpPagedCache&>(cache);
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kForwardMtp);
    h.id = c.id();
    h.a = prev_is_target ? 1 : 0;
    Payload p;
    add_batch(batch, &p, &h);
    p.add(prev_rows, &h.lengths[6]);
    DS_RETURN_IF_ERROR(send(h, &p));
    return named(local_->forward_mtp(batch, c.local(), prev_rows, prev_is_target, logits));
  }
  Status forward_idle() override {
    CallHeader h;
    h.op = static_cast<int32_t>(Op::kForwardIdle);
    DS_RETURN_IF_ERROR(send(h, nullptr));
    return named(local_->forward_idle());
  }
  size_t weight_bytes_per_token() const override { return local_->weight_bytes_per_token(); }
  int64_t released_weight_bytes() const override { return local_->released_weight_bytes(); }
  std::string stats() const override {
    std::string s = local_->stats();
    const std::string comm = comm_ ? comm_->stats() : std::string();
    return s.empty() ? comm : comm.empty() ? s : s + "; " + comm;
  }

  // Broadcasts one call. After a failure every later call fails with the same error,
  // so the caller sees the first cause.
  Status send(CallHeader& h, Payload* p) {
    if (!broken_.ok()) return broken_;
    h.payload_bytes = p != nullptr ? static_cast<int64_t>(p->bytes().size()) : 0;
    Status s = comm_->broadcast(bytes_of(h), 0);
    if (s.ok() && h.payload_bytes > 0) s = comm_->broadcast(p->bytes(), 0);
    if (!s.ok()) broken_ = named(s);
    return broken_;
  }
  // A failed collective (kIoError) with the ranks the watcher saw die.
  Status named(Status s) {
    if (s.ok() || s.code() != StatusCode::kIoError || watcher_ == nullptr) return s;
    if (std::string dead = watcher_->dead_ranks(); !dead.empty()) {
      return Status(s.code(), dead + "; " + s.message());
    }
    return s;
  }
  void send_simple(Op op, int id, int64_t a = 0, int64_t b = 0, int64_t c = 0) {
    CallHeader h;
    h.op = static_cast<int32_t>(op);
    h.id = id;
    h.a = a;
    h.b = b;
    h.c = c;
    (void)send(h, nullptr);  // a failure is reported by the next forward
  }

 private:
  // The destructor releases these in the order: model, expert group, communicator,
  // watcher.
  std::unique_ptr<dist::Communicator> comm_;
  std::unique_ptr<RankWatcher> watcher_;
  std::unique_ptr<dist::Communicator> expert_comm_;  // borrowed by local_
  std::unique_ptr<CausalLm> local_;
  int next_id_ = 1;
  Status broken_;
};

TpSequenceCache::~TpSequenceCache() { driver_->send_simple(Op::kDropCache, id_); }
void TpSequenceCache::clear() {
  driver_->send_simple(Op::kClearCache, id_);
  local_->clear();
}
TpPagedCache::~TpPagedCache() { driver_->send_simple(Op::kDropPaged, id_); }
void TpPagedCache::copy_block(int src, int dst, int n_tokens) {
  driver_->send_simple(Op::kCopyBlock, id_, src, dst, n_tokens);
  local_->copy_block(src, dst, n_tokens);
}

}  // namespace

std::unique_ptr<CausalLm> make_tp_driver(std::unique_ptr<CausalLm> local, std::unique_ptr<dist::Communicator> comm,
                                         std::unique_ptr<RankWatcher> watcher,
                                         std::unique_ptr<dist::Communicator> expert_comm) {
  return std::make_unique<TpDriver>(std::move(local), std::move(comm), std::move(watcher), std::move(expert_comm));
}

// A call that rank 0 itself rejects (a bad token id, say) fails here the same way,
// before any collective, and rank 0 reports it to its caller: the worker carries on.
// A failed collective (kIoError) ends the worker.
static Status survivable(Status s) { return s.ok() || s.code() != StatusCode::kIoError ? Status::Ok() : s; }

Status run_tp_worker(CausalLm& local, dist::Communicator& comm) {
  std::map<int, std::unique_ptr<SequenceCache>> caches;
  std::map<int, std::unique_ptr<PagedCache>> paged;
  std::vector<std::byte> payload;
  std::vector<float> logits;
  const std::chrono::milliseconds step_timeout = comm.timeout();
  auto missing = [&](int id) {
    return internal_error("rank " + std::to_string(comm.rank()) + ": rank 0 used cache " + std::to_string(id) +
                          " that it never created");
  };
  for (;;) {
    // Rank 0 may be idle for as long as no request comes: wait without limit for its
    // next call (its death still ends the wait at once), then time collectives again.
    CallHeader h;
    comm.set_timeout(std::chrono::hours(24 * 365));
    Status s = comm.broadcast(bytes_of(h), 0);
    comm.set_timeout(step_timeout);
    DS_RETURN_IF_ERROR(s);
    payload.resize(static_cast<size_t>(h.payload_bytes));
    if (h.payload_bytes > 0) DS_RETURN_IF_ERROR(comm.broadcast(payload, 0));
    PayloadReader in(payload);
    switch (static_cast<Op>(h.op)) {
      case Op::kShutdown:
        return Status::Ok();
      case Op::kNewCache:
        caches[h.id] = local.new_cache();
        break;
      case Op::kDropCache:
        caches.erase(h.id);
        break;
      case Op::kClearCache:
        if (auto it = caches.find(h.id); it != caches.end()) it->second->clear();
        break;
      case Op::kForward: {
        auto it = caches.find(h.id);
        if (it == caches.end()) return missing(h.id);
        DS_ASSIGN_OR_RETURN(auto tokens, in.next<int32_t>(h.lengths[0]));
        DS_ASSIGN_OR_RETURN(auto positions, in.next<int32_t>(h.lengths[1]));
        DS_RETURN_IF_ERROR(survivable(local.forward(tokens, positions, *it->second, static_cast<LogitsFor>(h.a),
                                                    &logits)));
        break;
      }
      case Op::kNewPaged: {
        DS_ASSIGN_OR_RETURN(paged[h.id], local.new_paged_cache(static_cast<int>(h.a), static_cast<int>(h.b),
                                                               static_cast<DType>(h.c)));
        break;
      }
      case Op::kDropPaged:
        paged.erase(h.id);
        break;
      case Op::kCopyBlock: {
        auto it = paged.find(h.id);
        if (it == paged.end()) return missing(h.id);
        it->second->copy_block(static_cast<int>(h.a), static_cast<int>(h.b), static_cast<int>(h.c));
        break;
      }
      case Op::kForwardBatch:
      case Op::kForwardMtp: {
        auto it = paged.find(h.id);
        if (it == paged.end()) return missing(h.id);
        ModelBatch batch;
        DS_ASSIGN_OR_RETURN(batch.tokens, in.next<int32_t>(h.lengths[0]));
        DS_ASSIGN_OR_RETURN(batch.positions, in.next<int32_t>(h.lengths[1]));
        DS_ASSIGN_OR_RETURN(batch.seq_of_token, in.next<int32_t>(h.lengths[2]));
        DS_ASSIGN_OR_RETURN(batch.block_tables, in.next<int32_t>(h.lengths[3]));
        DS_ASSIGN_OR_RETURN(batch.logits_rows, in.next<int32_t>(h.lengths[4]));
        DS_ASSIGN_OR_RETURN(batch.block_table_offsets, in.next<int64_t>(h.lengths[5]));
        DS_ASSIGN_OR_RETURN(batch.prompt_lens, in.next<int32_t>(h.lengths[7]));
        if (static_cast<Op>(h.op) == Op::kForwardBatch) {
          DS_RETURN_IF_ERROR(survivable(local.forward_batch(batch, *it->second, &logits)));
        } else {
          DS_ASSIGN_OR_RETURN(auto prev_rows, in.next<int32_t>(h.lengths[6]));
          DS_RETURN_IF_ERROR(survivable(
              local.forward_mtp(batch, *it->second, prev_rows, h.a != 0, &logits)));
        }
        break;
      }
      case Op::kEnableMtp:
        DS_RETURN_IF_ERROR(local.enable_mtp());
        break;
      case Op::kForwardIdle:
        DS_RETURN_IF_ERROR(survivable(local.forward_idle()));
        break;
      default:
        return internal_error("rank " + std::to_string(comm.rank()) + ": unknown call " + std::to_string(h.op) +
                              " from rank 0");
    }
  }
}

}  // namespace dserve
