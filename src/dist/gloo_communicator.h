// The gloo implementation of Communicator (TCP transport), and the rendezvous that
// builds a group from an address and port: rank 0 serves a TcpStore there, every rank
// claims its rank with a fingerprint of its configuration (a rank claimed twice is an
// error for the second claimer), and gloo connects a full mesh of TCP pairs through the
// same store, checked pair by pair (gloo_mesh.h: a stranger on a rank's port makes the
// ranks connect again on fresh ports, never takes the rank's place).
//
// GLOO_SOCKET_IFNAME (as PyTorch and vLLM read it) names the interface the pairs bind
// to; without it, the address this machine uses to reach master_addr.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "dist/communicator.h"
#include "dist/shm_all_reduce.h"
#include "dist/tcp_store.h"

namespace dserve::dist {

struct GroupOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // How long a rank waits for the others at start-up, and for any one collective.
  std::chrono::milliseconds timeout{300'000};
  // What must agree between ranks (model, dtype, sizes); compared at rendezvous so a
  // mismatched rank is one clear error on every rank instead of wrong numbers.
  std::string fingerprint;
  // Rank 0 only, optional: a store server its launcher already started (so a port in
  // use fails before any worker is spawned). Without it, rank 0 starts one.
  std::unique_ptr<TcpStoreServer> server;
  // When every rank runs on this machine: all_reduce_sum through shared memory for
  // vectors up to shm_slot_bytes (shm_all_reduce.h), the rest through gloo. The
  // environment variable DSERVE_SHM_ALL_REDUCE=0 turns it off (to compare).
  bool shared_memory = true;
  size_t shm_slot_bytes = kDefaultShmSlotBytes;
  // One attempt at connecting the TCP pairs (gloo_mesh.h), within `timeout`.
  std::chrono::milliseconds connect_attempt_timeout{10'000};
  // Tests: see MeshOptions::before_connecting_pairs.
  std::function<void(int attempt)> before_connecting_pairs;
};

// Sets SIGPIPE to ignored (process-wide), so a peer that dies fails a collective
// rather than killing this process.
// Blocks until every rank has joined (or options.timeout passes: the error names the
// missing ranks and the rendezvous address).
Result<std::unique_ptr<Communicator>> connect_gloo(GroupOptions options);

}  // namespace dserve::dist
