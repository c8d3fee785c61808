#include "sampling/stop_string_matcher.h"

#include <algorithm>

#include "base/check.h"

namespace dserve {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop_str)
    : stops_(std::move(stops)), include_stop_str_(include_stop_str) {
  for (const std::string& s : stops_) DS_CHECK(!s.empty());
}

StopStringMatcher::Output StopStringMatcher::add(std::string_view piece) {
  Output out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  pending_.append(piece);

  // pending_ held no whole stop string before, so any match ends in `piece`; the
  // earliest start wins.
  size_t first = std::string::npos, end = 0;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first || (at == first && at + s.size() < end)) {
      first = at;
      end = at + s.size();  // among stops starting together, the shortest ends first
    }
  }
  if (first != std::string::npos) {
    out.text = pending_.substr(0, include_stop_str_ ? end : first);
    out.stopped = stopped_ = true;
    pending_.clear();
    return out;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t longest = std::min(s.size() - 1, pending_.size());
    for (size_t h = longest; h > hold; --h) {
      if (std::string_view(pending_).substr(pending_.size() - h) ==
          std::string_view(s).substr(0, h)) {
        hold = h;
        break;
      }
    }
  }
  out.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace dserve
