// KvCacheManager: the paged KV cache as the scheduler sees it. Requests are ids; their
// blocks stay behind this API except for block_table(), which the model runner needs
// to address keys and values (block b holds token positions [b_i * block_size, ...) of
// the request whose table lists it at index b_i).
//
// Per request it keeps an append-only block table and the hashes of the request's full
// blocks. With prefix caching on, a block is registered under its chained hash
// (block_hash.h) as soon as allocate_slots() covers its last token: the model runner
// writes a step's keys and values into the cache before that step's attention reads
// them, so a request scheduled later in the same step may already reuse the block.
// Freed cached blocks stay reusable until the pool needs them (block_pool.h).
//
// The usual sequence for a request:
//   hit = get_computed_blocks(id, tokens)       // prefix already in the cache
//   allocate_slots(id, tokens, hit.n_tokens, n, &hit)   // first step
//   allocate_slots(id, tokens, n_computed, n)   // every later step (prefill chunk, decode)
//   free(id)                                    // finished, aborted or preempted
// n > 1 sampling: fork(parent, child, n_computed) shares the parent's full blocks.
//
// Thread-safety: not thread-safe; the engine thread owns it (through the Scheduler).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kvcache/block_hash.h"
#include "kvcache/block_pool.h"

namespace dserve::kvcache {

using RequestId = uint64_t;

struct KvCacheConfig {
  int n_blocks = 0;
  int block_size = 16;  // tokens per block
  bool enable_prefix_caching = true;
  uint64_t extra_key = 0;  // e.g. hash_string(model id + LoRA): anything that changes the KV
  uint64_t hash_seed = 0;  // keys the hash; a secret value defeats crafted collisions

  // InvalidArgument for n_blocks < 1 or block_size < 1.
  Status validate() const;
};

// Leading full blocks of a prompt found in the cache. Blocks are not yet owned by the
// request: pass the hit to allocate_slots() in the same scheduling step, before any
// other allocation can evict them.
struct PrefixHit {
  int n_tokens = 0;  // == blocks.size() * block_size
  std::vector<BlockId> blocks;
};

// Copy the first n_tokens token slots of block src into block dst (all layers) before the
// next forward pass.
struct BlockCopy {
  BlockId src = 0;
  BlockId dst = 0;
  int n_tokens = 0;
};

struct KvCacheStats {
  // Counted at each admission of a request (first scheduling, and again on resumption
  // after a preemption); both stay 0-hit with prefix caching off.
  int64_t n_queried_tokens = 0;  // tokens looked up in the prefix cache
  int64_t n_hit_tokens = 0;      // of which were found cached
  int n_blocks = 0;
  int n_free_blocks = 0;  // includes cached blocks nobody holds
  double usage = 0.0;     // fraction of blocks held by requests
};

class KvCacheManager {
 public:
  // config must have passed validate().
  explicit KvCacheManager(const KvCacheConfig& config);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  const KvCacheConfig& config() const { return config_; }
  int block_size() const { return config_.block_size; }
  int n_blocks() const { return pool_.n_blocks(); }
  int n_free_blocks() const { return pool_.n_free(); }
  // Blocks needed to hold n_tokens tokens.
  int blocks_for(int64_t n_tokens) const {
    return static_cast<int>((n_tokens + config_.block_size - 1) / config_.block_size);
  }

  // The longest run of leading full blocks of `tokens` (prompt and any outputs already
  // generated) that is cached, never all of `tokens`: at least one token is left to
  // compute so that the step produces logits. Empty when prefix caching is off. Does not
  // change ownership; remembers the block hashes for `id`.
  PrefixHit get_computed_blocks(RequestId id, std::span<const int32_t> tokens);

  // Makes room for tokens [0, n_computed + n_new) of request `id`, whose known tokens
  // are `tokens` (n_computed + n_new <= tokens.size()). On the request's first
  // allocation pass the hit from get_computed_blocks() (n_computed == hit->n_tokens);
  // it is also what the queried / hit counters count. n_lookahead: slots for further
  // positions whose tokens are not known yet (speculative drafts the step verifies);
  // they get blocks but no hash, so a block is cached only once its tokens are
  // accepted. Returns false, changing nothing, when the free blocks do not suffice.
  [[nodiscard]] bool allocate_slots(RequestId id, std::span<const int32_t> tokens, int n_computed,
                                    int n_new, const PrefixHit* hit = nullptr,
                                    int n_lookahead = 0);

  // Gives child the parent's first n_computed token slots: full blocks are shared (one
  // more owner each); a partial last block is copied into a fresh block, returned for
  // the model runner to perform. Returns std::nullopt when no block is free for the copy.
  // The parent must exist and the child must not.
  struct ForkResult {
    std::optional<BlockCopy> copy;
  };
  [[nodiscard]] std::optional<ForkResult> fork(RequestId parent, RequestId child, int n_computed);

  // Returns the request's blocks to the pool (tail first, so shared heads are evicted
  // last). Unknown ids are ignored.
  void free(RequestId id);

  bool has_request(RequestId id) const { return requests_.count(id) != 0; }
  // Empty for unknown ids.
  std::span<const BlockId> block_table(RequestId id) const;

  KvCacheStats stats() const;
  // Drops every cached hash (the blocks stay with their owners).
  void reset_prefix_cache() { pool_.reset_cache(); }

  // Internal error naming the first broken invariant: the pool's own, every block's
  // ref count equals the number of tables that list it, no table lists a block twice.
  Status check_invariants() const;
  const BlockPool& pool() const { return pool_; }

 private:
  struct RequestBlocks {
    std::vector<BlockId> table;     // append-only
    std::vector<BlockHash> hashes;  // of the request's full blocks, computed lazily
    int n_cached_blocks = 0;        // leading table entries already offered to the cache
  };
  // Extends r.hashes to cover the first n_full blocks of tokens.
  void hash_blocks(RequestBlocks& r, std::span<const int32_t> tokens, int n_full) const;

  KvCacheConfig config_;
  BlockPool pool_;
  BlockHash root_;
  std::unordered_map<RequestId, RequestBlocks> requests_;
  int64_t n_queried_tokens_ = 0;
  int64_t n_hit_tokens_ = 0;
};

}  // namespace dserve::kvcache
