#include "cli/expert_parallel.h"

#include <chrono>
#include <optional>
#include <system_error>
#include <thread>

#include "base/log.h"
#include "cli/data_parallel.h"
#include "dist/gloo_communicator.h"

namespace dserve::cli {

int expert_parallel_port(const DataParallelOptions& o) { return o.rpc_port + 1; }
int expert_group_port(const DataParallelOptions& o) { return o.rpc_port + 2; }

Result<std::vector<std::unique_ptr<dist::Communicator>>> connect_expert_parallel(
    const DataParallelOptions& o, const std::string& fingerprint, double timeout_s) {
  const int port = expert_parallel_port(o);
  if (port > 65535) {
    return invalid_argument("--enable-expert-parallel uses --data-parallel-rpc-port + 1 for its rendezvous: " +
                            std::to_string(o.rpc_port) + " + 1 is not a port");
  }
  const std::string address = o.address.empty() ? "127.0.0.1" : o.address;
  const int n = o.size_local;
  std::vector<std::optional<Result<std::unique_ptr<dist::Communicator>>>> results(n);
  // The first engine of rank 0's node takes the port now, so that a port in use is one
  // clear error before anyone waits.
  std::unique_ptr<dist::TcpStoreServer> server;
  if (o.start_rank == 0) {
    DS_ASSIGN_OR_RETURN(server, dist::TcpStoreServer::start("", port));
  }
  DS_LOG_INFO("expert parallel: {} engine(s) of this node join the group of {} at {}:{}", n, o.size, address, port);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    dist::GroupOptions g;
    g.rank = o.start_rank + i;
    g.world_size = o.size;
    g.master_addr = address;
    g.master_port = port;
    g.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    g.fingerprint = fingerprint;
    // The exchanges are all-to-all (gloo's TCP pairs); the lockstep's round is one
    // byte per engine: nothing for the shared-memory all-reduce to speed up.
    g.shared_memory = false;
    if (i == 0 && server) g.server = std::move(server);
    try {
      threads.emplace_back([&results, i, g = std::move(g)]() mutable { results[i] = dist::connect_gloo(std::move(g)); });
    } catch (const std::system_error& e) {
      // The threads already started wait for this rank until the timeout: let them.
      for (std::thread& t : threads) t.join();
      return Status(StatusCode::kResourceExhausted,
                    std::string("cannot create the expert-parallel connection thread (") + e.what() +
                        "): the process or container limits threads (RLIMIT_NPROC, pids.max)");
    }
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::unique_ptr<dist::Communicator>> comms;
  for (int i = 0; i < n; ++i) {
    if (!results[i]->ok()) {
      Status s = results[i]->status().with_context("expert-parallel group (data-parallel rank " +
                                                  std::to_string(o.start_rank + i) + ")");
      if (s.message().find("did not join") != std::string::npos) {
        // The likeliest cause besides a node not started yet: one started without the flag
        // (it never looks for the group).
        s = Status(s.code(), s.message() + "; every node needs --enable-expert-parallel (and the same "
                                           "--data-parallel-rpc-port), or none");
      }
      return s;
    }
    comms.push_back(std::move(*results[i]).value());
  }
  return comms;
}

}  // namespace dserve::cli
