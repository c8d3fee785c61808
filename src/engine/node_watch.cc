#include "engine/node_watch.h"

#include <fmt/format.h>

namespace dserve {

namespace {
double seconds(NodeWatch::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

NodeWatch::NodeWatch(std::vector<int> ranks, Deadlines deadlines, Clock::time_point now)
    : deadlines_(deadlines), last_heard_(now) {
  for (int r : ranks) engines_[r].waiting_since = now;
}

void NodeWatch::heard(Clock::time_point now) { last_heard_ = now; }

void NodeWatch::stepped(int rank, Clock::time_point now) {
  auto it = engines_.find(rank);
  if (it != engines_.end()) it->second.waiting_since = now;
}

void NodeWatch::set_work(int rank, int64_t n_unfinished, Clock::time_point now) {
  auto it = engines_.find(rank);
  if (it == engines_.end()) return;
  // The step deadline runs from the moment an idle engine got work: an engine idle for
  // an hour has not been slow for an hour.
  if (it->second.n_unfinished == 0 && n_unfinished > 0) it->second.waiting_since = now;
  it->second.n_unfinished = n_unfinished;
}

std::string NodeWatch::lost(Clock::time_point now) const {
  const double silent = seconds(now - last_heard_);
  if (silent > deadlines_.heartbeat_s) {
    return fmt::format("stopped answering ({:.1f} s without a message; --engine-heartbeat-timeout {})",
                       silent, deadlines_.heartbeat_s);
  }
  for (const auto& [rank, e] : engines_) {
    if (e.n_unfinished == 0) continue;
    const double stalled = seconds(now - e.waiting_since);
    if (stalled > deadlines_.step_s) {
      return fmt::format("stopped stepping: engine {} finished no step in {:.1f} s with {} unfinished "
                         "sequence(s) (hung, or too slow; --engine-step-timeout {})",
                         rank, stalled, e.n_unfinished, deadlines_.step_s);
    }
  }
  return "";
}

}  // namespace dserve
