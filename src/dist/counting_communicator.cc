#include "dist/counting_communicator.h"

#include <cstdio>

namespace dserve::dist {

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner)
    : inner_(std::move(inner)), created_(std::chrono::steady_clock::now()) {}

template <typename F>
Status CountingCommunicator::timed(Op op, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = f();
  seconds_[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++calls_[op];
  return s;
}

Status CountingCommunicator::all_reduce_sum(std::span<float> data) {
  return timed(kAllReduce, [&] { return inner_->all_reduce_sum(data); });
}
Status CountingCommunicator::all_gather(std::span<const std::byte> in, std::span<std::byte> out) {
  return timed(kAllGather, [&] { return inner_->all_gather(in, out); });
}
Status CountingCommunicator::broadcast(std::span<std::byte> data, int root) {
  return timed(kBroadcast, [&] { return inner_->broadcast(data, root); });
}
Status CountingCommunicator::barrier() {
  return timed(kBarrier, [&] { return inner_->barrier(); });
}
Status CountingCommunicator::all_to_all(std::span<const std::byte> in, std::span<std::byte> out) {
  return timed(kAllToAll, [&] { return inner_->all_to_all(in, out); });
}
Status CountingCommunicator::all_to_all_v(std::span<const std::byte> in, const std::vector<int64_t>& in_counts,
                                          std::span<std::byte> out, const std::vector<int64_t>& out_counts) {
  return timed(kAllToAllV, [&] { return inner_->all_to_all_v(in, in_counts, out, out_counts); });
}

std::string CountingCommunicator::stats() const {
  static constexpr const char* kNames[kNumOps] = {"all_reduce_sum", "all_gather", "broadcast",
                                                  "barrier",        "all_to_all", "all_to_all_v"};
  std::string text = "collectives on rank " + std::to_string(rank()) + " (" + name() + "):";
  double total = 0;
  char buf[96];
  for (int op = 0; op < kNumOps; ++op) {
    if (calls_[op] == 0) continue;
    std::snprintf(buf, sizeof buf, " %lld %s %.3f s,", calls_[op], kNames[op], seconds_[op]);
    text += buf;
    total += seconds_[op];
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
  std::snprintf(buf, sizeof buf, " %.3f s in all, %.1f%% of the %.3f s since the group connected", total,
                100.0 * total / (wall > 0 ? wall : 1), wall);
  return text + buf;
}

}  // namespace dserve::dist
