// Expert parallelism across data-parallel engines (`--data-parallel-size N
// --enable-expert-parallel`): one expert-parallel group of N ranks, one per engine
// over every node, that the engines' MoE layers exchange tokens through
// (model/expert_dispatch.h) and step in lockstep over (engine/dp_lockstep.h).
//
// Rendezvous: the node holding data-parallel rank 0 (the API server's) serves the
// group's store at --data-parallel-address:(--data-parallel-rpc-port + 1); every
// engine, on every node, joins there with its data-parallel rank, waiting up to
// --distributed-timeout for the others. GLOO_SOCKET_IFNAME names the interface the
// engines' connections use, as for tensor parallelism (dist/gloo_communicator.h).
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

// The port of the expert-parallel group's rendezvous.
int expert_parallel_port(const DataParallelOptions& o);

// This node's engines' places in the group (data-parallel ranks start_rank ..
// start_rank + size_local - 1), connected concurrently; in rank order. `fingerprint`:
// what must agree between engines (compared at rendezvous).
Result<std::vector<std::unique_ptr<dist::Communicator>>> connect_expert_parallel(
    const DataParallelOptions& o, const std::string& fingerprint, double timeout_s);

}  // namespace dserve::cli
