// Expert parallelism across data-parallel engines (`--data-parallel-size N
// --enable-expert-parallel`): one group of N ranks, one per engine over every node,
// that the engines step in lockstep over (engine/dp_lockstep.h) and, with
// --tensor-parallel-size 1, their MoE layers exchange tokens through
// (model/expert_dispatch.h). With --tensor-parallel-size T > 1 the N groups' rank 0s
// form the lockstep group, and the tokens travel in a second group of all N x T
// ranks (engine d's rank t is d T + t), which every rank joins while its engine loads
// (cli/tensor_parallel.h: load_model_on_ranks).
//
// Rendezvous: the node holding data-parallel rank 0 (the API server's) serves the
// groups' stores at --data-parallel-address:(--data-parallel-rpc-port + 1) (one rank
// per engine) and (+ 2) (every rank, with T > 1); every engine, on every node, joins
// with its data-parallel rank, waiting up to --distributed-timeout for the others.
// GLOO_SOCKET_IFNAME names the interface the engines' connections use, as for tensor
// parallelism (dist/gloo_communicator.h).
//
// Thread-safety: main thread only (it starts and joins one thread per local engine).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"

namespace dserve::cli {

struct DataParallelOptions;

// The port of the one-rank-per-engine group's rendezvous.
int expert_parallel_port(const DataParallelOptions& o);
// The port of the all-ranks group's rendezvous (tensor-parallel engines).
int expert_group_port(const DataParallelOptions& o);

// This node's engines' places in the group (data-parallel ranks start_rank ..
// start_rank + size_local - 1), connected concurrently; in rank order. `fingerprint`:
// what must agree between engines (compared at rendezvous).
Result<std::vector<std::unique_ptr<dist::Communicator>>> connect_expert_parallel(
    const DataParallelOptions& o, const std::string& fingerprint, double timeout_s);

}  // namespace dserve::cli
