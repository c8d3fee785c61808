// DpEngineClient's private records, shared by its two source files (requests in
// dp_engine_client.cc, nodes in dp_engine_client_nodes.cc). Everything here is
// GUARDED_BY the client's mu_.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "engine/dp_engine_client.h"

namespace dserve {

// The ROUTER socket the headless nodes connect to (the I/O thread's).
struct DpEngineClient::Socket {
  zmq::context_t context{1};
  zmq::socket_t router{context, zmq::socket_type::router};
};

// A remote engine, once its node said hello.
struct DpEngineClient::Remote {
  std::string node;  // its node's ZeroMQ identity; empty until one connected
  bool alive = false;
};

// A connected headless node.
struct DpEngineClient::Node {
  Node(std::string name, std::vector<int> ranks, NodeWatch::Deadlines deadlines)
      : name(std::move(name)), ranks(ranks), watch(std::move(ranks), deadlines, Clock::now()) {}
  std::string name;  // host:pid (ranks from N)
  std::vector<int> ranks;
  NodeWatch watch;
  bool dead = false;
};

// One add_request call: sequences first..first+n-1 (tickets). It stays here until
// every sequence has ended; until its first output it keeps its prompt, so that it can
// move to another engine if its own is lost.
struct DpEngineClient::Request {
  std::vector<int32_t> prompt;  // emptied once output reached the caller
  SamplingOptions options;
  std::shared_ptr<OutputQueue> queue;  // the caller's
  int index = 0;                       // the caller's index of sequence 0
  int n = 1;
  int n_unfinished = 1;
  int rank = -1;                       // the engine it is on; -1 while it waits to move
  bool placing = false;                // place() is waiting for that engine to take it
  std::vector<RequestId> engine_ids;   // [n] that engine's ids, once it took it
  std::vector<bool> done;              // [n] the caller got the sequence's last delta
  std::vector<bool> abort_wanted;      // [n] aborted before its engine's ids were known
  bool started = false;                // the caller has seen output: it cannot move
  int n_moves = 0;
  std::string lost_error;              // its engine was lost while placing, and it cannot move
  // A remote engine's answer, while placing there (set by the I/O thread).
  std::shared_ptr<std::promise<engine_msg::Added>> answer;
};

}  // namespace dserve
