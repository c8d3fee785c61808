#include "model/vocab_parallel.h"

#include <algorithm>

namespace dserve {

void VocabParallel::init(int64_t vocab_size, int rank, int n_ranks) {
  vocab_size_ = vocab_size;
  per_rank_ = (vocab_size + n_ranks - 1) / n_ranks;
  begin_ = std::min<int64_t>(vocab_size, rank * per_rank_);
  end_ = std::min<int64_t>(vocab_size, begin_ + per_rank_);
}

Status VocabParallel::embed(Backend& backend, dist::Communicator& comm, const TensorView& table,
                            std::span<const int32_t> tokens, int64_t hidden, float* x) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (comm.size() == 1) {
    backend.get_rows(table, tokens.data(), n, x);
    return Status::Ok();
  }
  embed_ids_.clear();
  embed_at_.clear();
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] >= begin_ && tokens[t] < end_) {
      embed_ids_.push_back(static_cast<int32_t>(tokens[t] - begin_));
      embed_at_.push_back(static_cast<int32_t>(t));
    }
  }
  std::fill_n(x, n * hidden, 0.0f);
  const int64_t k = static_cast<int64_t>(embed_ids_.size());
  if (k > 0) {
    embed_rows_.resize(k * hidden);
    backend.get_rows(table, embed_ids_.data(), k, embed_rows_.data());
    for (int64_t i = 0; i < k; ++i) {
      std::copy_n(embed_rows_.data() + i * hidden, hidden, x + int64_t{embed_at_[i]} * hidden);
    }
  }
  return comm.all_reduce_sum({x, static_cast<size_t>(n * hidden)});
}

Status VocabParallel::logits(Backend& backend, dist::Communicator& comm, const TensorView& lm_head,
                             const float* rows, int64_t n_out, std::vector<float>* out) {
  out->resize(static_cast<size_t>(n_out * vocab_size_));
  const int n_ranks = comm.size();
  if (n_out == 0) return Status::Ok();  // every rank has the same n_out: all skip together
  if (n_ranks == 1) {
    backend.matmul(lm_head, nullptr, rows, n_out, out->data());
    return Status::Ok();
  }
  // local [n_out, per_rank] (padding columns past the vocabulary unused), gathered as
  // [n_ranks, n_out, per_rank], then laid out by vocabulary id.
  const int64_t vl = per_rank_, mine = end_ - begin_;
  local_logits_.assign(static_cast<size_t>(n_out * vl), 0.0f);
  if (mine > 0) {
    gathered_.resize(static_cast<size_t>(n_out * mine));
    backend.matmul(lm_head, nullptr, rows, n_out, gathered_.data());
    for (int64_t i = 0; i < n_out; ++i) {
      std::copy_n(gathered_.data() + i * mine, mine, local_logits_.data() + i * vl);
    }
  }
  gathered_.resize(static_cast<size_t>(n_ranks * n_out * vl));
  DS_RETURN_IF_ERROR(comm.all_gather(std::as_bytes(std::span<const float>(local_logits_)),
                                     std::as_writable_bytes(std::span<float>(gathered_))));
  for (int r = 0; r < n_ranks; ++r) {
    const int64_t begin = std::min<int64_t>(vocab_size_, r * vl);
    const int64_t count = std::min<int64_t>(vocab_size_, begin + vl) - begin;
    for (int64_t i = 0; i < n_out && count > 0; ++i) {
      std::copy_n(gathered_.data() + (int64_t{r} * n_out + i) * vl, count, out->data() + i * vocab_size_ + begin);
    }
  }
  return Status::Ok();
}

}  // namespace dserve
