// ExpertDispatch: the token exchange of expert parallelism across data-parallel
// engines (vLLM's --enable-expert-parallel with --data-parallel-size > 1). The routed
// experts of every MoE layer are dealt out whole over the ranks of an expert-parallel
// group, in contiguous blocks (ExpertPlacement); each engine routes its own tokens,
// then
//   dispatch(): every (token, expert) slot's row goes to the rank that owns the
//               expert: one all_to_all of per-rank slot counts, then one all_to_all_v
//               of records [int32 expert id | hidden floats];
//   the owner runs each of its experts once over the rows it received
//               (received_rows(), grouped by expert: expert_offsets());
//   combine():  the expert outputs travel back the same way (one all_to_all_v), each
//               to the slot it came from.
// The rows travel as float32 (the results equal one process's bit for bit) or, with
// ExpertWire::kBf16, as bfloat16 both ways (half the bytes; each row rounded to
// nearest even once on the way out and once back, as DeepEP's BF16 combine does).
// The routing weights never leave their engine: the caller weighs and sums each
// token's slots itself, in a fixed order (its experts in increasing id), so the sum
// does not depend on which rank computed which expert.
//
// Every rank of the group must call dispatch() and combine() the same number of times
// in the same order, with zero slots when it has no tokens (SPMD). A failed collective
// (a peer died) is returned as the Communicator's error.
//
// Thread-safety: one thread drives an ExpertDispatch (as its Communicator).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"

namespace dserve {

// Which rank holds which routed experts: n_experts dealt out in whole blocks of
// n_experts / n_ranks (n_ranks must divide n_experts).
struct ExpertPlacement {
  int n_experts = 0;
  int n_ranks = 1;
  int per_rank() const { return n_experts / n_ranks; }
  int owner(int expert) const { return expert / per_rank(); }
  int first(int rank) const { return rank * per_rank(); }
};

// The element type of the rows on the wire.
enum class ExpertWire { kF32, kBf16 };

// Bytes and rows moved, since construction.
struct ExpertDispatchStats {
  int64_t exchanges = 0;       // dispatch() calls
  int64_t rows_sent = 0;       // slots sent to other ranks (not to itself)
  int64_t rows_received = 0;   // slots received from other ranks
  int64_t bytes_sent = 0;      // payload bytes to other ranks, both directions
  int64_t bytes_received = 0;  // payload bytes from other ranks, both directions
};

class ExpertDispatch {
 public:
  // comm: the expert-parallel group (borrowed; must outlive this); hidden: floats per row.
  ExpertDispatch(dist::Communicator& comm, int n_experts, int64_t hidden,
                 ExpertWire wire = ExpertWire::kF32);
  ExpertDispatch(const ExpertDispatch&) = delete;
  ExpertDispatch& operator=(const ExpertDispatch&) = delete;

  const ExpertPlacement& placement() const { return placement_; }
  int first_expert() const { return placement_.first(comm_.rank()); }
  int n_local_experts() const { return placement_.per_rank(); }

  // Collective. x [n_tokens, hidden]; slot i sends row slot_token[i] of x to the owner
  // of expert slot_expert[i]. An expert id outside [0, n_experts) or a token outside x
  // is a broken invariant (the router made it): CHECK.
  Status dispatch(std::span<const float> x, std::span<const int64_t> slot_token,
                  std::span<const int32_t> slot_expert);
  // After dispatch(): the rows this rank received [n_received(), hidden], grouped by
  // local expert: local expert j's rows are [expert_offsets()[j], expert_offsets()[j + 1]).
  std::span<const float> received_rows() const { return received_rows_; }
  int64_t n_received() const { return n_received_; }
  std::span<const int64_t> expert_offsets() const { return expert_offsets_; }

  // Collective. expert_out [n_received(), hidden], in received_rows()' order ->
  // slot_out [n_slots, hidden], row i the output for the dispatch's slot i.
  Status combine(std::span<const float> expert_out, std::vector<float>* slot_out);

  const ExpertDispatchStats& stats() const { return stats_; }
  ExpertWire wire() const { return wire_; }

 private:
  // A row of hidden floats to wire bytes and back.
  size_t wire_row_bytes() const;
  void to_wire(const float* row, std::byte* out) const;
  void from_wire(const std::byte* in, float* row) const;

  dist::Communicator& comm_;
  const ExpertPlacement placement_;
  const int64_t hidden_;
  const ExpertWire wire_;
  // The last dispatch, for combine():
  std::vector<int64_t> send_slot_;      // [n_slots] the slot at each send position
  std::vector<int64_t> send_rows_;      // [n_ranks] rows sent to each rank
  std::vector<int64_t> recv_rows_;      // [n_ranks] rows received from each rank
  std::vector<int64_t> grouped_from_;   // [n_received] the received index of each grouped row
  std::vector<float> received_rows_;    // [n_received, hidden] grouped by local expert
  std::vector<int64_t> expert_offsets_; // [n_local_experts + 1]
  int64_t n_received_ = 0;
  std::vector<std::byte> send_buf_, recv_buf_;
  ExpertDispatchStats stats_;
};

}  // namespace dserve
