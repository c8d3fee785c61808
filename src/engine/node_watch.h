// NodeWatch: whether a headless node's engines are still serving, as the API server
// judges it from what arrives over the wire (engine/dp_engine_client.h). Two deadlines:
//   heartbeat  the node sends something (a ping at least) every fraction of it; silence
//              for the whole deadline means the node died, hangs (SIGSTOP, a stuck
//              process) or is cut off (link down) -- --engine-heartbeat-timeout;
//   step       an engine with unfinished requests reports a finished step (its stats)
//              at least this often; otherwise it is hung, or too slow to serve (a node
//              starved of CPU) -- --engine-step-timeout.
// A node is lost when either deadline passes; lost() says which, in words for the log
// and for the errors of the requests it had.
//
// Pure bookkeeping: the caller passes the time in, so tests drive it with made-up
// clocks. Thread-safety: none (the data-parallel client calls it under its lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dserve {

class NodeWatch {
 public:
  using Clock = std::chrono::steady_clock;

  struct Deadlines {
    double heartbeat_s = 3.0;
    double step_s = 60.0;
  };

  // A node serving `ranks` (its engines' data-parallel ranks), heard from at `now`.
  NodeWatch(std::vector<int> ranks, Deadlines deadlines, Clock::time_point now);

  // Any message from the node.
  void heard(Clock::time_point now);
  // Engine `rank` finished a step (or produced output).
  void stepped(int rank, Clock::time_point now);
  // Engine `rank` has `n_unfinished` sequences now (after an add, a finish or a retry).
  void set_work(int rank, int64_t n_unfinished, Clock::time_point now);

  // Empty while the node is serving; otherwise why it is lost.
  std::string lost(Clock::time_point now) const;

 private:
  struct Engine {
    int64_t n_unfinished = 0;
    Clock::time_point waiting_since;  // the later of: work arrived, last step
  };
  const Deadlines deadlines_;
  Clock::time_point last_heard_;
  std::map<int, Engine> engines_;  // by rank
};

}  // namespace dserve
