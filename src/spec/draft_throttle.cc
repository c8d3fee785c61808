#include "spec/draft_throttle.h"

#include <algorithm>

namespace dserve::spec {

void DraftThrottle::record(uint64_t id, int n_accepted) {
  if (n_accepted > 0) {
    states_.erase(id);  // drafting pays: back to the default
    return;
  }
  State& s = states_[id];
  ++s.misses;
  if (s.misses >= kMissesBeforePause) {
    const int doublings = std::min(s.misses - kMissesBeforePause, 5);
    s.pause = std::min(1 << doublings, kMaxPause);
  }
}

bool DraftThrottle::should_draft(uint64_t id) {
  auto it = states_.find(id);
  if (it == states_.end() || it->second.pause == 0) return true;
  --it->second.pause;
  return false;
}

}  // namespace dserve::spec
