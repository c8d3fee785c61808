// HeadlessEngines: a `--headless` node's side of data parallelism (vLLM's engine-core
// processes started by `vllm serve --headless`). It runs this node's engines (AsyncLlm,
// each possibly tensor-parallel) and connects a ZeroMQ DEALER socket to the API
// server's node at --data-parallel-address:--data-parallel-rpc-port: hello (its ranks
// and the flags that must agree), then requests in and outputs, stats and metric
// events out (engine/engine_messages.h). ZeroMQ reconnects on its own, so either node
// may start first.
//
// run() returns Ok when the API server shuts down normally (it says so), and an error
// when the API server stopped with one, when this node is refused (disagreeing flags,
// overlapping ranks), when no answer came within the start-up timeout, when the API
// server went silent for the heartbeat timeout (it died, or the link is down), or when
// the API server declared this node lost (it hung, was cut off or was too slow): the
// process then exits rather than lingering as an orphan; started again with the same
// command line, it rejoins.
//
// Thread-safety: observer() before run(); stop() from any thread; the observers from
// the engine threads. One I/O thread (run's caller) owns the socket.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dserve/async_llm.h"
#include "engine/engine_messages.h"

namespace dserve {

struct HeadlessConfig {
  std::string head_address;  // --data-parallel-address
  int rpc_port = 0;          // --data-parallel-rpc-port
  int start_rank = 0;        // --data-parallel-start-rank: the first of this node's ranks
  int n_engines = 1;         // --data-parallel-size-local
  engine_msg::NodeConfig node;
  double startup_timeout_s = 300;  // --distributed-timeout
  double heartbeat_timeout_s = kDefaultHeartbeatSeconds;  // --engine-heartbeat-timeout
  // The engines step in lockstep (expert parallelism): when one fails, run() returns
  // its error (the group cannot go on without it).
  bool lockstep = false;
  // This node's engines' lockstep groups (borrowed): aborted when this node leaves with
  // an error, so that no engine waits in a collective for a hung API server's node.
  std::vector<dist::Communicator*> lockstep_groups;
};

class HeadlessEngines {
 public:
  explicit HeadlessEngines(HeadlessConfig config);
  ~HeadlessEngines();
  HeadlessEngines(const HeadlessEngines&) = delete;
  HeadlessEngines& operator=(const HeadlessEngines&) = delete;

  // The observer to create engine `i` (0-based on this node) with: it forwards the
  // engine's stats and metric events to the API server.
  EngineObserver* observer(int i);
  // Serves `engines` (n_engines of them, in rank order) until the API server goes away.
  Status run(std::vector<std::unique_ptr<AsyncLlm>> engines);
  // Starts a watchdog that ends the process unless the returned flag is set within a
  // grace period (engine threads stuck in a collective after the API server was lost).
  static std::shared_ptr<std::atomic<bool>> exit_if_engines_hang(const std::string& why);
  // Makes run() return Ok soon (SIGTERM).
  void stop();

 private:
  class Forwarder;
  class Adder;   // run()'s thread that hands the API server's requests to the engines
  class IoLoop;  // run()'s loop over the socket
  void post(const engine_msg::Message& m);  // queue for the socket, from any thread
  void wake();

  const HeadlessConfig config_;
  int wake_fd_ = -1;
  std::vector<std::unique_ptr<Forwarder>> forwarders_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> outbox_;  // GUARDED_BY(mu_)
};

}  // namespace dserve
