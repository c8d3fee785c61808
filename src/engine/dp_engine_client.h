// DpEngineClient: the API server's view of data-parallel engines (vLLM's
// DPLBAsyncMPClient). Some engines run in this process (AsyncLlm); the others run on
// headless nodes (engine/headless_engines.h) that connect to a ZeroMQ ROUTER socket
// this client binds at --data-parallel-rpc-port. Each new request goes to the live
// engine with the least load (its unfinished sequences; ties taken in turn), and its
// output deltas come back (over the socket, or from the local engine's thread) into the
// caller's OutputQueue, so serving sees one EngineClient.
//
// Liveness (engine/node_watch.h): the client pings every node, and every node pings
// back (or sends output); a node silent for the heartbeat timeout, or whose engine has
// work but finishes no step within the step timeout, is lost. Then, without expert
// parallelism, the engines left keep serving:
//   - a request the lost engine had produced no output for is placed again on another
//     engine (the caller never knows); one that had produced output ends with
//     finish_reason "error" (a stream already under way cannot be replayed);
//   - the node is told it was declared lost (it exits), the engine's observer gets
//     on_engine_lost, and healthy() stays true while any engine is left;
//   - a node restarted with the same command line says hello again and takes its ranks
//     back (on_engine_joined): a hello for ranks held by a lost node, or by a node on
//     the same host (the restart came before the old process was noticed gone).
// With expert parallelism (lockstep) every engine holds a part of the model: a lost
// engine ends every request with an error and healthy() turns false.
//
// Ids: add_request hands back the client's own ids (tickets), so abort() finds a
// sequence wherever it runs now, on its first engine or the one it was moved to.
//
// Thread-safety: every public method may be called from any thread. One I/O thread
// owns the socket; callers hand it messages through a locked outbox and an eventfd.
// A retry thread places again the requests of lost engines. Lock order: mu_, then an
// AsyncLlm's own lock (its load, health and abort are called under mu_); nothing that
// waits for an engine thread runs under mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dserve/async_llm.h"
#include "dist/communicator.h"
#include "dserve/engine_client.h"
#include "engine/engine_messages.h"
#include "engine/node_watch.h"

namespace dserve {

struct DpEngineClientConfig {
  int data_parallel_size = 1;
  int rpc_port = 0;              // --data-parallel-rpc-port; bound on every interface
  engine_msg::NodeConfig node;   // what every node must agree on
  double startup_timeout_s = 300;  // --distributed-timeout
  // --engine-heartbeat-timeout and --engine-step-timeout (engine/node_watch.h).
  NodeWatch::Deadlines deadlines;
  // Where an engine's lost/joined events and a remote engine's metrics go; called once
  // per rank (local ranks included).
  std::function<EngineObserver*(int rank)> observer;
  // The engines step in lockstep (expert parallelism): one lost engine stops them all,
  // so healthy() needs every engine, not one, and nothing is placed again.
  bool lockstep = false;
  // The local engines' lockstep groups (borrowed): aborted when an engine is lost, so
  // that a local engine waiting in a collective for a hung peer fails at once.
  std::vector<dist::Communicator*> lockstep_groups;
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
  using Clock = std::chrono::steady_clock;
  struct Remote;   // per remote rank
  struct Node;     // per connected headless node
  struct Request;  // per add_request call
  DpEngineClient(DpEngineClientConfig config, std::vector<std::unique_ptr<AsyncLlm>> local);
  bool local_rank(int rank) const { return rank < static_cast<int>(local_.size()); }

  // Requests (dp_engine_client.cc); all with mu_ held.
  // Places request `first` on the least-loaded live engine and waits until that engine
  // took it (mu_ released meanwhile); an engine lost meanwhile means the next one.
  Status place(std::unique_lock<std::mutex>& lock, int64_t first);
  int pick_engine();  // -1 when none is alive
  int64_t new_tickets(int n);
  // The request holding `ticket` (and its first ticket), or null.
  Request* find_request(int64_t ticket, int64_t* first);
  // A delta of sequence `d.index` (a ticket) from engine `rank`, on its way to the caller.
  void deliver(int rank, OutputDelta d);
  // Engine `rank` is gone: its requests move to other engines, or end with `error`.
  void engine_lost(int rank, const std::string& error);
  // Ends every unfinished sequence of request `first` with `reason` (and `error`).
  void end_request(int64_t first, const std::string& reason, const std::string& error);
  void abort_sequence(int64_t first, int j);
  void abort_on_engine(Request& r, int j);  // tells sequence j's engine
  void change_work(int rank, int64_t delta);
  void retry_loop();  // the retry thread

  // Nodes (dp_engine_client_nodes.cc).
  Status bind();
  void run();  // the I/O thread
  void handle(const std::string& identity, const std::string& payload);
  void handle_hello(const std::string& identity, engine_msg::Hello& hello);
  void handle_added(engine_msg::Added& a);
  void wake();
  // Ends a node: its engines are lost (with mu_ held).
  void declare_lost(Node& node, const std::string& identity, const std::string& why);
  void check_liveness();  // the I/O thread, with mu_ held

  const DpEngineClientConfig config_;
  std::vector<std::unique_ptr<AsyncLlm>> local_;  // cleared (joined) first in the destructor
  // One per local engine: its deltas, tagged with their tickets, on their way to
  // deliver() (pushed on the engine's thread).
  std::vector<std::shared_ptr<OutputQueue>> local_outputs_;
  std::vector<EngineObserver*> observers_;  // by rank; may be null
  int wake_fd_ = -1;

  mutable std::mutex mu_;
  std::condition_variable cv_;                          // wait_for_engines, wait_idle, retries
  std::vector<std::unique_ptr<Remote>> remotes_;        // GUARDED_BY(mu_): by rank; null for local
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // GUARDED_BY(mu_): by ZeroMQ identity
  std::map<int64_t, Request> requests_;                 // GUARDED_BY(mu_): by first ticket
  std::vector<int64_t> n_unfinished_;                   // GUARDED_BY(mu_): sequences per rank
  std::deque<int64_t> retries_;                         // GUARDED_BY(mu_): requests to place again
  std::vector<std::pair<std::string, std::string>> outbox_;  // GUARDED_BY(mu_)
  std::string startup_error_;                           // GUARDED_BY(mu_)
  std::string shutdown_error_;                          // GUARDED_BY(mu_)
  int64_t next_ticket_ = 0;                             // GUARDED_BY(mu_)
  uint64_t turn_ = 0;                                   // GUARDED_BY(mu_): tie-breaking
  bool accepting_ = true;                               // GUARDED_BY(mu_)
  bool started_ = false;                                // GUARDED_BY(mu_): wait_for_engines done
  bool stopping_ = false;                               // GUARDED_BY(mu_)
  bool io_stopped_ = false;                             // GUARDED_BY(mu_): no more answers come

  struct Socket;
  std::unique_ptr<Socket> socket_;  // I/O thread only (after create)
  std::thread thread_;
  std::thread retry_thread_;
};

}  // namespace dserve
