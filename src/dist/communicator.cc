#include "dist/communicator.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace dserve::dist {
namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  void set_timeout(std::chrono::milliseconds) override {}
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds::max(); }
  Status all_reduce_sum(std::span<float>) override { return Status::Ok(); }
  Status all_gather(std::span<const std::byte> in, std::span<std::byte> out) override {
    if (out.size() != in.size()) return invalid_argument("all_gather: output size != input size");
    if (!in.empty()) std::memmove(out.data(), in.data(), in.size());
    return Status::Ok();
  }
  Status broadcast(std::span<std::byte>, int root) override {
    if (root != 0) return invalid_argument("broadcast: root " + std::to_string(root) + " out of range");
    return Status::Ok();
  }
  Status barrier() override { return Status::Ok(); }
  Status all_to_all(std::span<const std::byte> in, std::span<std::byte> out) override {
    return all_gather(in, out);
  }
  Status all_to_all_v(std::span<const std::byte> in, const std::vector<int64_t>& in_counts,
                      std::span<std::byte> out, const std::vector<int64_t>& out_counts) override {
    if (in_counts.size() != 1 || out_counts.size() != 1 || in_counts[0] != out_counts[0] ||
        static_cast<size_t>(in_counts[0]) > in.size() || static_cast<size_t>(out_counts[0]) > out.size()) {
      return invalid_argument("all_to_all_v: counts do not match the buffers");
    }
    if (in_counts[0] > 0) std::memmove(out.data(), in.data(), static_cast<size_t>(in_counts[0]));
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator() {
  return std::make_unique<SingleRankCommunicator>();
}

void sum_in_rank_order(std::span<const float> gathered, int n_ranks, std::span<float> out) {
  const size_t n = out.size();
  DS_CHECK(gathered.size() == n * static_cast<size_t>(n_ranks));
  std::copy(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(n), out.begin());
  for (int r = 1; r < n_ranks; ++r) {
    const float* src = gathered.data() + static_cast<size_t>(r) * n;
    for (size_t i = 0; i < n; ++i) out[i] += src[i];
  }
}

}  // namespace dserve::dist
