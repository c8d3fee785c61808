// BlockHash: the identity of a full KV block for prefix caching.
//
// A full block's hash chains the parent block's hash, an extra key (whatever else
// changes the keys and values: the model, a LoRA adapter, a cache salt) and the block's
// token ids, so equal hashes mean "the same tokens after the same prefix under the same
// model". The first block's parent is kRootHash (salted by a seed).
//
// Collisions: the hash is 128 bits (two independently keyed 64-bit lanes, each a
// multiply-xorshift absorb of every input word and a strong finaliser), and lookups
// trust it without comparing token ids. Comparing a block's own tokens would not be
// enough anyway: a collision anywhere up the chain would go unnoticed, and comparing the
// whole prefix costs what the cache saves. With a million cached blocks the birthday
// bound puts an accidental collision near 1e12 / 2^129 ~ 1e-27. It is not a
// cryptographic hash: a deployment that fears clients crafting collisions should pass a
// secret per-process `seed` (KvCacheConfig::hash_seed), which keys both lanes.
//
// Thread-safety: pure functions over plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

namespace dserve::kvcache {

struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

// The parent of a request's first block, for a given seed.
BlockHash root_hash(uint64_t seed);

// hash(parent, extra_key, tokens). tokens is one block's ids, [block_size].
BlockHash hash_block(const BlockHash& parent, uint64_t extra_key, std::span<const int32_t> tokens);

// A 64-bit key for strings (model id, LoRA name) to pass as extra_key.
uint64_t hash_string(std::string_view s, uint64_t seed = 0);

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi >> 1)); }
};

}  // namespace dserve::kvcache
