// BlockPool: a fixed set of KV blocks, each holding `block_size` tokens of keys and
// values in memory the model runner owns; here a block is only an id, a reference count
// and (when it is full and prefix caching is on) a BlockHash.
//
// Free blocks (ref_cnt == 0) sit in one intrusive doubly linked list in eviction order:
// allocation takes from the front, freeing appends to the back, so the block unused for
// the longest time is reused first (LRU). A freed block that carries a hash keeps its
// contents and stays findable through lookup() until allocation takes it, which evicts
// it (drops its hash). touch() takes a cache hit out of the free list and counts the new
// owner.
//
// Invariants (check_invariants() verifies them): every block is either in the free list
// with ref_cnt 0 or out of it with ref_cnt > 0; n_free() is the free list's length; a
// hash maps to exactly one block, which carries that hash.
//
// Thread-safety: not thread-safe; owned by the engine thread through KvCacheManager.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kvcache/block_hash.h"

namespace dserve::kvcache {

using BlockId = int32_t;

class BlockPool {
 public:
  // n_blocks >= 1. All blocks start free, in id order.
  explicit BlockPool(int n_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int n_blocks() const { return static_cast<int>(blocks_.size()); }
  int n_free() const { return n_free_; }
  int n_used() const { return n_blocks() - n_free_; }
  // Fraction of blocks owned by some request, in [0, 1]; cached-but-free blocks count as free.
  double usage() const { return double(n_used()) / n_blocks(); }

  // Takes n blocks from the front of the free list (evicting any cached contents), each
  // with ref_cnt 1. The caller checks n <= n_free(); asking for more is a bug.
  std::vector<BlockId> allocate(int n);
  // Adds one owner to each block; a block that was free (a prefix-cache hit) leaves the
  // free list.
  void touch(std::span<const BlockId> blocks);
  // Drops one owner of each block, in the order given; a block whose count reaches 0 goes
  // to the back of the free list. Callers pass a request's blocks last-first so that a
  // prefix's tail is evicted before its head (the head is the more shared).
  void release(std::span<const BlockId> blocks);

  // The cached block holding `hash`, if any (free or in use).
  std::optional<BlockId> lookup(const BlockHash& hash) const;
  // Registers a full block under `hash`. Returns false (and leaves the block uncached)
  // when another block already holds the hash, or this block already has one.
  bool cache(BlockId block, const BlockHash& hash);
  // Forgets every cached hash (the blocks keep their ref counts). For tests and for
  // weight reloads.
  void reset_cache();

  int ref_cnt(BlockId block) const { return blocks_[block].ref_cnt; }
  bool is_cached(BlockId block) const { return blocks_[block].hash.has_value(); }
  bool is_free(BlockId block) const { return blocks_[block].ref_cnt == 0; }
  int n_cached() const { return static_cast<int>(cached_.size()); }
  // Free block ids from first-evicted to last.
  std::vector<BlockId> free_list() const;

  // Internal error naming the first broken invariant.
  Status check_invariants() const;

 private:
  static constexpr BlockId kNone = -1;
  struct Block {
    int ref_cnt = 0;
    std::optional<BlockHash> hash;
    BlockId prev = kNone;  // free list links; kNone at the ends or when not free
    BlockId next = kNone;
    bool in_free_list = false;
  };
  void push_back_free(BlockId b);
  void unlink_free(BlockId b);
  void evict(BlockId b);

  std::vector<Block> blocks_;
  BlockId head_ = kNone;  // first to evict
  BlockId tail_ = kNone;
  int n_free_ = 0;
  std::unordered_map<BlockHash, BlockId, BlockHashHasher> cached_;
};

}  // namespace dserve::kvcache
