// VocabParallel: the token embedding and the lm_head split by vocabulary over the
// ranks of a tensor-parallel group (any architecture).
//
// Rank r keeps rows [begin, end) of ceil(vocab / N) rows per rank (the last slice is
// shorter when N does not divide the vocabulary). The embedding is assembled by an
// all-reduce: each rank writes the rows of the tokens in its slice and zeros
// elsewhere, and x + 0 is exact, so every rank gets the full embedding bit for bit.
// The logits are gathered: each rank computes its columns, padded to the common
// width, and every rank lays the gathered slices out by vocabulary id. With one rank
// both are the plain get_rows / matmul.
// Activations and token ids are in the backend's memory; the logits are the step's
// output and come back to the host (one download).
//
// Thread-safety: one driving thread (the model's); holds scratch buffers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "dist/communicator.h"
#include "tensor/tensor_view.h"

namespace dserve {

class VocabParallel {
 public:
  // The slice of a vocabulary of vocab_size rows that `rank` of n_ranks keeps; its
  // scratch lives in `backend`.
  void init(Backend& backend, int64_t vocab_size, int rank, int n_ranks);
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

  // x[n, hidden] = embedding rows of tokens[n]; table holds this rank's rows only.
  Status embed(dist::Communicator& comm, const TensorView& table, const int32_t* tokens,
               int64_t n, int64_t hidden, float* x);
  // logits[n_out, vocab_size] (host) = rows[n_out, hidden] · lm_headᵀ, where lm_head
  // holds this rank's rows only. Every rank must call with the same n_out.
  Status logits(dist::Communicator& comm, const TensorView& lm_head, const float* rows,
                int64_t n_out, std::vector<float>* out);

 private:
  Backend* backend_ = nullptr;
  int64_t vocab_size_ = 0, begin_ = 0, end_ = 0, per_rank_ = 0;
  DeviceArray<float> logits_;        // [n_out, vocab] one rank; [n_out, mine] several
  DeviceArray<float> local_logits_;  // [n_out, per_rank]
  DeviceArray<float> gathered_;      // [n_ranks, n_out, per_rank]
  std::vector<float> host_gathered_;
};

}  // namespace dserve
