// The TCP pairs of a gloo group, connected through the rendezvous store and checked.
//
// gloo's TCP transport (Debian's libgloo 2022) gives each pair a listening port of its
// own and takes the first connection that reaches it as the peer rank, unverified. A
// stranger that connects first (a port scanner, a stray client, a health probe sent to
// a recycled port) takes the rank's place: the real peer is refused, or, worse, the
// pair talks to the stranger. So each attempt ends with every rank sending every other
// a record naming the attempt, itself and the receiver (one all-to-all); a pair that
// reached a stranger gets nothing or junk and fails the attempt within its timeout.
// Every rank then reports its outcome in the store and reads the others': when any
// failed, all of them connect again on fresh ports (the stranger is left holding a
// socket nobody reads), up to kMaxMeshAttempts times or the overall timeout.
//
// Thread-safety: one call per rank, on its thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <gloo/context.h>
#include <gloo/transport/tcp/attr.h>

#include "base/status.h"
#include "dist/tcp_store.h"

namespace dserve::dist {

inline constexpr int kMaxMeshAttempts = 5;

struct MeshOptions {
  int rank = 0;
  int world_size = 1;
  std::string where;  // the rendezvous address, for messages
  // The whole connection, retries included; then the collectives' timeout.
  std::chrono::milliseconds timeout{300'000};
  // One attempt (connecting and checking the pairs).
  std::chrono::milliseconds attempt_timeout{10'000};
  // Tests: called with the attempt's number after this rank published its pairs'
  // addresses and before it connects them.
  std::function<void(int attempt)> before_connecting_pairs;
};

Result<std::shared_ptr<gloo::Context>> connect_verified_mesh(TcpStore& store,
                                                             const gloo::transport::tcp::attr& attr,
                                                             const MeshOptions& options);

}  // namespace dserve::dist
