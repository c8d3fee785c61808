#include "model/expert_dispatch.h"

#include <cstring>

#include "base/check.h"
#include "tensor/half.h"

namespace dserve {

ExpertDispatch::ExpertDispatch(dist::Communicator& comm, int n_experts, int64_t hidden,
                               ExpertWire wire)
    : comm_(comm), placement_{n_experts, comm.size()}, hidden_(hidden), wire_(wire) {
  DS_CHECK_MSG(n_experts > 0 && n_experts % comm.size() == 0,
               "expert parallelism needs the group size to divide the routed experts");
}

size_t ExpertDispatch::wire_row_bytes() const {
  return static_cast<size_t>(hidden_) * (wire_ == ExpertWire::kBf16 ? 2 : 4);
}

void ExpertDispatch::to_wire(const float* row, std::byte* out) const {
  if (wire_ == ExpertWire::kF32) {
    std::memcpy(out, row, wire_row_bytes());
    return;
  }
  for (int64_t i = 0; i < hidden_; ++i) {
    const uint16_t h = f32_to_bf16(row[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void ExpertDispatch::from_wire(const std::byte* in, float* row) const {
  if (wire_ == ExpertWire::kF32) {
    std::memcpy(row, in, wire_row_bytes());
    return;
  }
  for (int64_t i = 0; i < hidden_; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    row[i] = bf16_to_f32(h);
  }
}

Status ExpertDispatch::dispatch(std::span<const float> x, std::span<const int64_t> slot_token,
                                std::span<const int32_t> slot_expert) {
  DS_CHECK(slot_token.size() == slot_expert.size());
  const int n_ranks = comm_.size(), me = comm_.rank();
  const int64_t n_slots = static_cast<int64_t>(slot_token.size());
  const int64_t n_tokens = static_cast<int64_t>(x.size()) / hidden_;
  const size_t record = sizeof(int32_t) + wire_row_bytes();

  // Slots in send order: a stable counting sort by expert, which also groups them by
  // owner (experts are owned in contiguous blocks).
  const int E = placement_.n_experts;
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t i = 0; i < n_slots; ++i) {
    DS_CHECK(slot_expert[i] >= 0 && slot_expert[i] < E);
    DS_CHECK(slot_token[i] >= 0 && slot_token[i] < n_tokens);
    ++start[slot_expert[i] + 1];
  }
  for (int e = 0; e < E; ++e) start[e + 1] += start[e];
  send_slot_.resize(n_slots);
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n_slots; ++i) send_slot_[fill[slot_expert[i]]++] = i;
  }
  send_rows_.assign(n_ranks, 0);
  for (int r = 0; r < n_ranks; ++r) {
    send_rows_[r] = start[placement_.first(r) + placement_.per_rank()] - start[placement_.first(r)];
  }

  // 1. How many rows each rank sends each other rank.
  recv_rows_.assign(n_ranks, 0);
  DS_RETURN_IF_ERROR(comm_.all_to_all(std::as_bytes(std::span<const int64_t>(send_rows_)),
                                      std::as_writable_bytes(std::span<int64_t>(recv_rows_))));
  n_received_ = 0;
  for (int r = 0; r < n_ranks; ++r) {
    if (recv_rows_[r] < 0) return internal_error("expert dispatch: rank " + std::to_string(r) + " sent a negative count");
    n_received_ += recv_rows_[r];
  }

  // 2. The records [expert id | row], in send order.
  send_buf_.resize(static_cast<size_t>(n_slots) * record + 1);  // + 1: never an empty buffer
  for (int64_t j = 0; j < n_slots; ++j) {
    const int64_t slot = send_slot_[j];
    std::byte* at = send_buf_.data() + static_cast<size_t>(j) * record;
    const int32_t e = slot_expert[slot];
    std::memcpy(at, &e, sizeof e);
    to_wire(x.data() + slot_token[slot] * hidden_, at + sizeof e);
  }
  recv_buf_.resize(static_cast<size_t>(n_received_) * record + 1);
  std::vector<int64_t> send_bytes(n_ranks), recv_bytes(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    send_bytes[r] = send_rows_[r] * static_cast<int64_t>(record);
    recv_bytes[r] = recv_rows_[r] * static_cast<int64_t>(record);
    if (r != me) {
      stats_.rows_sent += send_rows_[r];
      stats_.rows_received += recv_rows_[r];
      stats_.bytes_sent += send_bytes[r];
      stats_.bytes_received += recv_bytes[r];
    }
  }
  DS_RETURN_IF_ERROR(comm_.all_to_all_v(send_buf_, send_bytes, recv_buf_, recv_bytes));
  ++stats_.exchanges;

  // 3. Group the received rows by local expert (stable: by source rank, then order).
  const int e0 = placement_.first(me), n_local = placement_.per_rank();
  std::vector<int32_t> expert_of(n_received_);
  expert_offsets_.assign(n_local + 1, 0);
  for (int64_t i = 0; i < n_received_; ++i) {
    int32_t e;
    std::memcpy(&e, recv_buf_.data() + static_cast<size_t>(i) * record, sizeof e);
    if (e < e0 || e >= e0 + n_local) {
      return internal_error("expert dispatch: rank " + std::to_string(me) + " received a row for expert " +
                            std::to_string(e) + ", which it does not hold");
    }
    expert_of[i] = e - e0;
    ++expert_offsets_[e - e0 + 1];
  }
  for (int j = 0; j < n_local; ++j) expert_offsets_[j + 1] += expert_offsets_[j];
  grouped_from_.resize(n_received_);
  received_rows_.resize(static_cast<size_t>(n_received_ * hidden_));
  std::vector<int64_t> fill(expert_offsets_.begin(), expert_offsets_.end() - 1);
  for (int64_t i = 0; i < n_received_; ++i) {
    const int64_t g = fill[expert_of[i]]++;
    grouped_from_[g] = i;
    from_wire(recv_buf_.data() + static_cast<size_t>(i) * record + sizeof(int32_t),
              received_rows_.data() + g * hidden_);
  }
  return Status::Ok();
}

Status ExpertDispatch::combine(std::span<const float> expert_out, std::vector<float>* slot_out) {
  DS_CHECK(static_cast<int64_t>(expert_out.size()) == n_received_ * hidden_);
  const int n_ranks = comm_.size();
  const size_t row_bytes = wire_row_bytes();
  // Back into received order, which is the order the senders expect per rank.
  recv_buf_.resize(static_cast<size_t>(n_received_) * row_bytes + 1);
  for (int64_t g = 0; g < n_received_; ++g) {
    to_wire(expert_out.data() + g * hidden_,
            recv_buf_.data() + static_cast<size_t>(grouped_from_[g]) * row_bytes);
  }
  const int64_t n_slots = static_cast<int64_t>(send_slot_.size());
  send_buf_.resize(static_cast<size_t>(n_slots) * row_bytes + 1);
  std::vector<int64_t> back_bytes(n_ranks), return_bytes(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    back_bytes[r] = recv_rows_[r] * static_cast<int64_t>(row_bytes);
    return_bytes[r] = send_rows_[r] * static_cast<int64_t>(row_bytes);
    if (r != comm_.rank()) {
      stats_.bytes_sent += back_bytes[r];
      stats_.bytes_received += return_bytes[r];
    }
  }
  DS_RETURN_IF_ERROR(comm_.all_to_all_v(recv_buf_, back_bytes, send_buf_, return_bytes));
  slot_out->resize(static_cast<size_t>(n_slots * hidden_));
  for (int64_t j = 0; j < n_slots; ++j) {
    from_wire(send_buf_.data() + static_cast<size_t>(j) * row_bytes,
              slot_out->data() + send_slot_[j] * hidden_);
  }
  return Status::Ok();
}

}  // namespace dserve
