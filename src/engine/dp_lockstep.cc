#include "engine/dp_lockstep.h"

#include <cstddef>
#include <vector>

namespace dserve {
namespace {
constexpr unsigned char kWork = 1, kStopping = 2, kFailed = 4;
}  // namespace

Result<DpLockstep::Round> DpLockstep::agree(bool has_work, bool stopping, bool failed) {
  const unsigned char mine = static_cast<unsigned char>((has_work ? kWork : 0) | (stopping ? kStopping : 0) |
                                                        (failed ? kFailed : 0));
  const std::byte in[1] = {static_cast<std::byte>(mine)};
  std::vector<std::byte> all(static_cast<size_t>(comm_.size()));
  DS_RETURN_IF_ERROR(comm_.all_gather(in, all));
  Round round;
  for (int r = 0; r < comm_.size(); ++r) {
    const auto flags = static_cast<unsigned char>(all[r]);
    if (flags & kWork) round.any_work = true;
    if ((flags & (kStopping | kFailed)) && round.leaver < 0) {
      round.leaver = r;
      round.leaver_failed = (flags & kFailed) != 0;
    }
  }
  return round;
}

}  // namespace dserve
