// DpLockstep: keeps the data-parallel engines of an expert-parallel group stepping
// together, as vLLM's DPEngineCoreProc does (run_busy_loop with its dummy batches).
// Every forward of every engine runs the same MoE exchanges (model/expert_dispatch.h),
// so an engine with requests cannot step unless every other engine steps with it.
// Each round of an engine's loop begins with agree(): one tiny collective (an
// all_gather of one byte per engine) in which every engine says whether it has work
// and whether it is leaving the group (stopping, or failed). Then
//   - some engine leaves: the group is over; nobody issues another collective;
//   - some engine has work: every engine runs exactly one forward, its own batch or,
//     with nothing to do, the model's forward_idle() (the dummy batch);
//   - nobody has work: every engine waits for requests, at most kIdleTick before the
//     next round (an engine handed a request goes at once; the others join within a
//     tick), so an idle group costs a few collectives per second, not a busy core.
//
// Thread-safety: one thread (the engine thread) drives a DpLockstep and its
// Communicator, the same one that drives the model's exchanges.
#pragma once

#include <chrono>
#include <string>

#include "base/status.h"
#include "dist/communicator.h"

namespace dserve {

class DpLockstep {
 public:
  // How long an idle engine waits for a request before the next round.
  static constexpr std::chrono::milliseconds kIdleTick{50};

  struct Round {
    bool any_work = false;  // every engine runs one forward this round
    int leaver = -1;        // the first engine that leaves (-1: none)
    bool leaver_failed = false;
  };

  // comm: the expert-parallel group, one rank per engine (borrowed).
  explicit DpLockstep(dist::Communicator& comm) : comm_(comm) {}
  DpLockstep(const DpLockstep&) = delete;
  DpLockstep& operator=(const DpLockstep&) = delete;

  // Collective over the group.
  Result<Round> agree(bool has_work, bool stopping, bool failed);

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

 private:
  dist::Communicator& comm_;
};

}  // namespace dserve
