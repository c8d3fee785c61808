// DpEngineClient: the API server's view of data-parallel engines (vLLM's
// DPLBAsyncMPClient). Some engines run in this process (AsyncLlm); the others run on
// headless nodes (engine/headless_engines.h) that connect to a ZeroMQ ROUTER socket
// this client binds at --data-parallel-rpc-port. Each new request goes to the live
// engine with the least load (its unfinished sequences; ties taken in turn), and its
// output deltas come back over the socket into the caller's OutputQueue, so serving
// sees one EngineClient.
//
// Liveness: the client pings every node, and every node pings back (or sends output);
// a node silent for kLivenessSeconds is dead: its engines' unfinished requests end with
// finish_reason "error", and new requests go to the engines left. healthy() is false
// once no engine is left.
//
// Ids: the id of a sequence handed back by add_request is engine_id * dp_size + rank,
// so abort() knows its engine without a table.
//
// Thread-safety: every public method may be called from any thread. One I/O thread
// owns the socket; callers hand it messages through a locked outbox and an eventfd.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dserve/async_llm.h"
#include "dserve/engine_client.h"
#include "engine/engine_messages.h"

namespace dserve {


struct DpEngineClientConfig {
  int data_parallel_size = 1;
  int rpc_port = 0;              // --data-parallel-rpc-port; bound on every interface
  engine_msg::NodeConfig node;   // what every node must agree on
  double startup_timeout_s = 300;  // --distributed-timeout
  // Where a remote engine's observer calls go (its metrics); called once per rank.
  std::function<EngineObserver*(int rank)> observer;
  // The engines step in lockstep (expert parallelism): one lost engine stops them all,
  // so healthy() needs every engine, not one.
  bool lockstep = false;
};

class DpEngineClient : public EngineClient {
 public:
  // Binds the socket and starts the I/O thread. `local` are ranks 0..local.size()-1
  // (at least one: the head serves the tokenizer from its first engine).
  static Result<std::unique_ptr<DpEngineClient>> create(
      DpEngineClientConfig config, std::vector<std::unique_ptr<AsyncLlm>> local);
  ~DpEngineClient() override;
  DpEngineClient(const DpEngineClient&) = delete;
  DpEngineClient& operator=(const DpEngineClient&) = delete;

  // Waits until every remote rank has connected with agreeing flags. Errors: a node
  // whose flags disagree or whose ranks overlap (naming the node and the flag or
  // rank), or the timeout (naming the ranks that never arrived).
  Status wait_for_engines();
  // The error the API server stops with, told to the headless nodes when this client is
  // destroyed (so they exit with it too); without one they are told of a normal end.
  void set_shutdown_error(std::string error);

  Result<std::vector<RequestId>> add_request(std::vector<int32_t> prompt,
                                             const SamplingOptions& options,
                                             std::shared_ptr<OutputQueue> queue,
                                             int index) override;
  void abort(RequestId id) override;
  void stop_accepting() override;
  bool healthy() const override;
  bool wait_idle(std::chrono::milliseconds timeout) override;
  void abort_all() override;
  int64_t load() const override;
  const Tokenizer* tokenizer() const override { return local_.front()->tokenizer(); }
  int max_model_len() const override { return local_.front()->max_model_len(); }
  int64_t vocab_size() const override { return local_.front()->vocab_size(); }

 private:
  struct Remote;  // per remote rank
  struct Node;    // per connected headless node
  struct Sequence;
  DpEngineClient(DpEngineClientConfig config, std::vector<std::unique_ptr<AsyncLlm>> local);
  Status bind();
  void run();
  void handle(const std::string& identity, const std::string& payload);
  void send(const std::string& identity, const engine_msg::Message& m);  // from any thread
  void wake();
  // Ends the sequences of a node's engines with an error; called with mu_ held.
  void declare_dead(Node& node, const std::string& why);
  int pick_engine();  // with mu_ held; -1 when none is alive

  const DpEngineClientConfig config_;
  const std::vector<std::unique_ptr<AsyncLlm>> local_;
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable cv_;                          // wait_for_engines, wait_idle
  std::vector<std::unique_ptr<Remote>> remotes_;        // GUARDED_BY(mu_): by rank; null for local
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // GUARDED_BY(mu_): by ZeroMQ identity
  std::map<int64_t, Sequence> sequences_;               // GUARDED_BY(mu_): by ticket
  struct PendingAdd {
    std::promise<engine_msg::Added> answer;
    int rank = 0;
  };
  std::map<int64_t, PendingAdd> adds_;                  // GUARDED_BY(mu_): by ticket
  std::vector<std::pair<std::string, std::string>> outbox_;  // GUARDED_BY(mu_)
  std::string startup_error_;                           // GUARDED_BY(mu_)
  std::string shutdown_error_;                          // GUARDED_BY(mu_)
  int64_t next_ticket_ = 0;                             // GUARDED_BY(mu_)
  uint64_t turn_ = 0;                                   // GUARDED_BY(mu_): tie-breaking
  bool accepting_ = true;                               // GUARDED_BY(mu_)
  bool stopping_ = false;                               // GUARDED_BY(mu_)

  struct Socket;
  std::unique_ptr<Socket> socket_;  // I/O thread only (after create)
  std::thread thread_;
};

}  // namespace dserve
