// The shared-memory fast path for the ranks of one machine: all_reduce_sum through a
// POSIX shared-memory segment instead of TCP, the rest delegated to the library's
// communicator (gloo).
//
// A tensor-parallel decode step makes two all-reduces per layer of one hidden-size
// row per token (a few KB): through gloo each costs several socket round trips and
// wake-ups, which dominate the step when ranks share cores. Here each rank copies its
// vector into its own slot of the segment, bumps one shared arrival counter, and waits
// (a short spin, then a futex on that counter) until every rank has arrived; then every
// rank adds the slots itself, in rank order, so the result is the same bits on every
// rank and equal to the gloo path's (sum_in_rank_order). Two sets of slots alternate
// between consecutive calls: a rank can only start call g + 2 (reusing call g's slots)
// after everyone arrived at g + 1, i.e. after everyone finished reading call g.
// Vectors larger than a slot (prefill of long prompts) go through the library, which
// every rank decides alike from the size.
//
// Faults: a waiting rank checks, every few milliseconds, that the peers it waits for
// still exist (their pids are in the segment) and fails the call naming the rank that
// exited; a peer that hangs fails it after the communicator's timeout. The
// communicator is then broken: every later call fails with the same error.
//
// Set-up (connect_shm_all_reduce) goes through the rendezvous store and needs every
// rank to open the same segment; where any rank cannot (ranks on other machines, a
// container without a shared /dev/shm), the group keeps the library's path.
//
// Thread-safety: as Communicator (one driving thread per rank).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "base/status.h"
#include "dist/communicator.h"
#include "dist/tcp_store.h"

namespace dserve::dist {

// Bytes of one rank's slot: vectors up to this size (4 MiB: 1M floats, e.g. 146 tokens
// of DeepSeek-V3's 7168-wide rows) take the shared-memory path.
inline constexpr size_t kDefaultShmSlotBytes = size_t{4} << 20;

// Wraps `inner` (a connected group whose ranks all run on this machine) with the
// shared-memory all_reduce_sum. Every rank must call this at the same point, with the
// same slot_bytes; `store` is the group's rendezvous store. Returns `inner` itself,
// unwrapped, when some rank could not attach to the segment (logged once).
Result<std::unique_ptr<Communicator>> connect_shm_all_reduce(std::unique_ptr<Communicator> inner,
                                                             TcpStore& store, const std::string& tag,
                                                             size_t slot_bytes = kDefaultShmSlotBytes);

}  // namespace dserve::dist
