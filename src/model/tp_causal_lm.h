// Tensor-parallel execution of a CausalLm: rank 0 drives, the other ranks follow.
//
// Every rank holds its shard of the model (load_causal_lm with the group's
// Communicator). Rank 0 wraps its model in the driver returned by make_tp_driver: each
// call the engine or CLI makes (new cache, forward, forward_batch, block copy, ...) is
// first broadcast to the workers as plain data, then run locally; the collectives
// inside the forward pass keep the ranks in step and give every rank the same logits.
// Workers run run_tp_worker, which replays rank 0's calls on their own shards and
// caches until rank 0 sends shutdown (the driver's destructor) or the group fails.
// So the scheduler, the sampler and the server exist on rank 0 only, and "every rank
// follows rank 0's step" holds by construction.
//
// Thread-safety: as CausalLm (one driving thread per rank).
#pragma once

#include <memory>

#include "base/status.h"
#include "dist/communicator.h"
#include "model/causal_lm.h"

namespace dserve {

// The ranks rank 0 can watch directly (its launcher's child processes). When a
// collective fails, the driver adds what the watcher saw ("rank 2 (pid 123) was killed
// by signal 9") to the error, which then names the rank that died.
class RankWatcher {
 public:
  virtual ~RankWatcher() = default;
  // "" when every watched rank still runs.
  virtual std::string dead_ranks() = 0;
};

// local: rank 0's own shard, loaded with *comm. The watcher (may be null) is destroyed
// after the workers were told to shut down and before the communicator. expert_comm
// (may be null): the expert-parallel group local was loaded with, kept until local is
// gone.
std::unique_ptr<CausalLm> make_tp_driver(std::unique_ptr<CausalLm> local,
                                         std::unique_ptr<dist::Communicator> comm,
                                         std::unique_ptr<RankWatcher> watcher = nullptr,
                                         std::unique_ptr<dist::Communicator> expert_comm = nullptr);

// A worker rank's loop. OK when rank 0 shut the group down; an error (naming the rank
// and the failed collective) when a rank died or a call failed.
Status run_tp_worker(CausalLm& local, dist::Communicator& comm);

}  // namespace dserve
