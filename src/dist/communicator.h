// Communicator: the collectives a model split over ranks needs, behind one small
// interface so that gloo (CPU, TCP), and later NCCL (GPUs) or HCCL (Ascend), are
// interchangeable implementations that model code never names.
//
// Every rank of a group calls the same collectives in the same order (SPMD). A
// collective that fails (a peer died, or did not answer within the group's timeout)
// returns a non-OK Status naming the operation and the peer; the communicator is then
// broken and every later call fails the same way, so callers stop instead of hanging.
//
// all_reduce_sum adds in a fixed order, ((x_0 + x_1) + x_2) + ..., the same on every
// rank and in every run: results are bit-identical across ranks and reproducible.
//
// Thread-safety: one thread drives a Communicator (collectives are ordered calls);
// abort() alone may be called from any other thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace dserve::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The implementation's name for logs ("single", "gloo/tcp").
  virtual std::string name() const = 0;
  // How long a collective waits for the other ranks before failing. A peer that exits
  // fails the collective at once whatever this is; the timeout catches a hung peer.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // data[i] <- sum over ranks r of data_r[i], added in rank order.
  virtual Status all_reduce_sum(std::span<float> data) = 0;
  // out = concat over ranks r of in_r; out.size() == size() * in.size().
  virtual Status all_gather(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  // data <- data_root on every rank.
  virtual Status broadcast(std::span<std::byte> data, int root) = 0;
  virtual Status barrier() = 0;
  // in = size() equal chunks, chunk r goes to rank r; out chunk r came from rank r.
  virtual Status all_to_all(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  // As all_to_all with per-rank byte counts: in_counts[r] bytes of `in` (in order) go
  // to rank r; out_counts[r] bytes arrive from rank r. Counts must match pairwise.
  virtual Status all_to_all_v(std::span<const std::byte> in, const std::vector<int64_t>& in_counts,
                              std::span<std::byte> out, const std::vector<int64_t>& out_counts) = 0;

  // What the implementation counted (calls, time), for the logs; "" when nothing.
  virtual std::string stats() const { return {}; }

  // Fails the collective in progress and every later one with `why`, at once. For a
  // group that learnt by other means that a member is gone: a hung peer (stopped, cut
  // off) would otherwise hold the collective for the whole timeout.
  virtual void abort(const std::string& why) {}
};

// The group of one: every collective is the identity, so today's single-process path
// is the N = 1 case of the same code.
std::unique_ptr<Communicator> make_single_rank_communicator();

// Sums `gathered` ([n_ranks, n] row-major) into out[n] in rank order: the one place
// that fixes the reduction order, shared by implementations that gather first.
void sum_in_rank_order(std::span<const float> gathered, int n_ranks, std::span<float> out);

}  // namespace dserve::dist
