#include "model/vocab_parallel.h"

#include <algorithm>

namespace dserve {

void VocabParallel::init(Backend& backend, int64_t vocab_size, int rank, int n_ranks) {
  backend_ = &backend;
  logits_.bind(&backend);
  local_logits_.bind(&backend);
  gathered_.bind(&backend);
  vocab_size_ = vocab_size;
  per_rank_ = (vocab_size + n_ranks - 1) / n_ranks;
  begin_ = std::min<int64_t>(vocab_size, rank * per_rank_);
  end_ = std::min<int64_t>(vocab_size, begin_ + per_rank_);
}

Status VocabParallel::embed(dist::Communicator& comm, const TensorView& table,
                            const int32_t* tokens, int64_t n, int64_t hidden, float* x) {
  if (comm.size() == 1) {
    backend_->get_rows(table, tokens, n, x);
    return Status::Ok();
  }
  // This rank's rows, zeros for the other ranks' tokens; the all-reduce fills them in.
  backend_->get_rows_shard(table, tokens, n, begin_, x);
  return backend_->all_reduce_sum(comm, x, n * hidden);
}

Status VocabParallel::logits(dist::Communicator& comm, const TensorView& lm_head,
                             const float* rows, int64_t n_out, std::vector<float>* out) {
  out->resize(static_cast<size_t>(n_out * vocab_size_));
  const int n_ranks = comm.size();
  if (n_out == 0) return Status::Ok();  // every rank has the same n_out: all skip together
  if (n_ranks == 1) {
    float* logits = logits_.ensure(n_out * vocab_size_);
    backend_->matmul(lm_head, nullptr, rows, n_out, logits);
    backend_->download(out->data(), logits, out->size() * sizeof(float));
    return Status::Ok();
  }
  // local [n_out, per_rank] (padding columns past the vocabulary zero), gathered as
  // [n_ranks, n_out, per_rank], then laid out by vocabulary id on the host.
  const int64_t vl = per_rank_, mine = end_ - begin_;
  float* local = local_logits_.ensure(n_out * vl);
  backend_->fill_zero(local, static_cast<size_t>(n_out * vl) * sizeof(float));
  if (mine > 0) {
    float* logits = logits_.ensure(n_out * mine);
    backend_->matmul(lm_head, nullptr, rows, n_out, logits);
    backend_->copy_strided(local, logits,
                           {.n0 = n_out, .n1 = 1, .len = mine, .dst_stride0 = vl, .src_stride0 = mine});
  }
  float* gathered = gathered_.ensure(n_ranks * n_out * vl);
  DS_RETURN_IF_ERROR(backend_->all_gather(comm, local, static_cast<size_t>(n_out * vl) * sizeof(float),
                                          gathered));
  host_gathered_.resize(static_cast<size_t>(n_ranks * n_out * vl));
  backend_->download(host_gathered_.data(), gathered, host_gathered_.size() * sizeof(float));
  for (int r = 0; r < n_ranks; ++r) {
    const int64_t begin = std::min<int64_t>(vocab_size_, r * vl);
    const int64_t count = std::min<int64_t>(vocab_size_, begin + vl) - begin;
    for (int64_t i = 0; i < n_out && count > 0; ++i) {
      std::copy_n(host_gathered_.data() + (int64_t{r} * n_out + i) * vl, count,
                  out->data() + i * vocab_size_ + begin);
    }
  }
  return Status::Ok();
}

}  // namespace dserve
