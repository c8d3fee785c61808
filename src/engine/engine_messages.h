// The messages between the API server (head) and data-parallel engines on other nodes,
// over ZeroMQ (engine/dp_engine_client.h, engine/headless_engines.h). One message is
// one ZeroMQ frame holding one JSON object whose "type" names it:
//
//   engine -> head   hello    a node's engines and the flags that must agree
//                    added    whether an engine took a request (its sequence ids, or why
//                             not and the error's kind, so the API server answers as
//                             it would for its own engine)
//                    output   one OutputDelta of a sequence, tagged with its ticket
//                    stats    an engine's EngineStats (its load and gauges)
//                    event    an EngineObserver call (tokens, timings, finish) for metrics,
//                             or the engine failed (lost)
//                    ping     liveness, when nothing else was sent for a while
//   head -> engine   welcome / reject   the answer to hello (reject says why)
//                    shutdown the API server stops (with the error, when it failed),
//                             or it declared this node lost (the node exits)
//                    add      a request for one engine, with its ticket
//                    abort    cancel one sequence of one engine
//                    ping     liveness
//
// A ticket is the head's name for a request's sequences: sequence j of a request with
// ticket t has ticket t + j, carried in OutputDelta::index. Decoding checks every field
// and its type: a malformed or unknown message is an InvalidArgument, never a crash.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "base/status.h"
#include "dserve/async_llm.h"

namespace dserve {
// Both sides ping (at least 4 times per heartbeat timeout); a peer silent for the
// heartbeat timeout is gone (dead, stopped or cut off). The default of
// --engine-heartbeat-timeout.
inline constexpr double kDefaultHeartbeatSeconds = 3.0;
// How often a side pings for a given heartbeat timeout: 250 ms, or more often when the
// timeout is under a second (so a few pings can be late without a false alarm).
std::chrono::milliseconds ping_interval(double heartbeat_timeout_s);
}  // namespace dserve

namespace dserve::engine_msg {

// What must be the same on every node of a data-parallel deployment.
struct NodeConfig {
  std::string model;
  int data_parallel_size = 1;
  int tensor_parallel_size = 1;
  bool enable_expert_parallel = false;
  int block_size = 16;
  std::string dtype = "auto";
  int max_model_len = 0;
  bool operator==(const NodeConfig&) const = default;
};

// The first flag (as on the command line) on which `a` and `b` disagree, with both
// values ("--block-size 16 vs 128"); empty when they agree.
std::string first_difference(const NodeConfig& a, const NodeConfig& b);

struct Hello {
  std::string node;        // host:pid, for error messages
  std::vector<int> ranks;  // the data-parallel ranks of its engines
  NodeConfig config;
};
struct Welcome {};
struct Reject {
  std::string error;
};
struct Add {
  int engine = 0;  // data-parallel rank
  int64_t ticket = 0;
  std::vector<int32_t> prompt;
  SamplingOptions options;
};
struct Added {
  int engine = 0;
  int64_t ticket = 0;
  std::string error;                 // empty: taken
  std::vector<RequestId> ids;        // the engine's ids of the sequences, when taken
  StatusCode code = StatusCode::kInvalidArgument;  // with an error: its kind
};
struct Abort {
  int engine = 0;
  RequestId id = 0;
};
struct Output {
  int engine = 0;
  OutputDelta delta;  // delta.index: the sequence's ticket
};
struct Stats {
  int engine = 0;
  EngineStats stats;
};
// One EngineObserver call.
struct Event {
  // kLost: the engine failed and serves no more (its node lives on).
  enum class Kind { kTokens, kFirstToken, kInterToken, kFinished, kLost };
  int engine = 0;
  Kind kind = Kind::kTokens;
  int64_t n_prompt_tokens = 0;     // kTokens, kFinished
  int64_t n_generated_tokens = 0;  // kTokens, kFinished
  double seconds = 0.0;            // kFirstToken, kInterToken, kFinished
  std::string finish_reason;       // kFinished
  std::string error;               // kLost: why
};
struct Ping {};
struct Shutdown {
  std::string error;  // empty: a normal shutdown
};

using Message = std::variant<Hello, Welcome, Reject, Add, Added, Abort, Output, Stats, Event,
                             Ping, Shutdown>;

std::string encode(const Message& m);
Result<Message> decode(std::string_view bytes);

}  // namespace dserve::engine_msg
