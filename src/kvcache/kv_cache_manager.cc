#include "kvcache/kv_cache_manager.h"

#include <algorithm>
#include <string>

#include "base/check.h"

namespace dserve::kvcache {

Status KvCacheConfig::validate() const {
  if (n_blocks < 1)
    return invalid_argument("KV cache needs at least one block, got " + std::to_string(n_blocks));
  if (block_size < 1)
    return invalid_argument("block size must be >= 1, got " + std::to_string(block_size));
  return Status::Ok();
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config), pool_(config.n_blocks), root_(root_hash(config.hash_seed)) {
  DS_CHECK(config.validate().ok());
}

void KvCacheManager::hash_blocks(RequestBlocks& r, std::span<const int32_t> tokens,
                                 int n_full) const {
  const int bs = config_.block_size;
  DS_CHECK(static_cast<size_t>(n_full) * bs <= tokens.size());
  for (int i = static_cast<int>(r.hashes.size()); i < n_full; ++i) {
    const BlockHash& parent = i == 0 ? root_ : r.hashes[i - 1];
    r.hashes.push_back(hash_block(parent, config_.extra_key, tokens.subspan(size_t(i) * bs, bs)));
  }
}

PrefixHit KvCacheManager::get_computed_blocks(RequestId id, std::span<const int32_t> tokens) {
  PrefixHit hit;
  if (!config_.enable_prefix_caching || tokens.empty()) return hit;
  // Leave at least one token to compute: a prompt of exactly k full blocks reuses k - 1.
  const int max_blocks = static_cast<int>((tokens.size() - 1) / config_.block_size);
  RequestBlocks& r = requests_[id];
  hash_blocks(r, tokens, max_blocks);
  for (int i = 0; i < max_blocks; ++i) {
    std::optional<BlockId> b = pool_.lookup(r.hashes[i]);
    if (!b) break;
    hit.blocks.push_back(*b);
  }
  hit.n_tokens = static_cast<int>(hit.blocks.size()) * config_.block_size;
  return hit;
}

bool KvCacheManager::allocate_slots(RequestId id, std::span<const int32_t> tokens, int n_computed,
                                    int n_new, const PrefixHit* hit, int n_lookahead) {
  DS_CHECK(n_computed >= 0 && n_new >= 0 && n_lookahead >= 0);
  const int64_t n_total = int64_t(n_computed) + n_new;
  DS_CHECK_MSG(size_t(n_total) <= tokens.size(), "slots for %lld tokens, %zu known",
               static_cast<long long>(n_total), tokens.size());
  RequestBlocks& r = requests_[id];
  const int n_hit_blocks = hit ? static_cast<int>(hit->blocks.size()) : 0;
  if (n_hit_blocks > 0) {
    DS_CHECK_MSG(r.table.empty() && n_computed == hit->n_tokens,
                 "a prefix hit applies only to a request's first allocation");
  }
  const int n_have = static_cast<int>(r.table.size()) + n_hit_blocks;
  const int n_needed = std::max(0, blocks_for(n_total + n_lookahead) - n_have);
  // Hit blocks nobody holds sit in the free list: taking them uses up free blocks too.
  int n_hits_free = 0;
  if (hit) {
    for (BlockId b : hit->blocks) n_hits_free += pool_.is_free(b) ? 1 : 0;
  }
  if (n_needed + n_hits_free > pool_.n_free()) return false;

  if (hit) {
    pool_.touch(hit->blocks);
    r.table.insert(r.table.end(), hit->blocks.begin(), hit->blocks.end());
    r.n_cached_blocks = n_hit_blocks;
    n_queried_tokens_ += static_cast<int64_t>(tokens.size());
    n_hit_tokens_ += hit->n_tokens;
  }
  std::vector<BlockId> fresh = pool_.allocate(n_needed);
  r.table.insert(r.table.end(), fresh.begin(), fresh.end());

  if (config_.enable_prefix_caching) {
    const int n_full = static_cast<int>(n_total / config_.block_size);
    if (n_full > r.n_cached_blocks) {
      hash_blocks(r, tokens, n_full);
      // A block whose hash another block already holds stays uncached (a duplicate).
      for (int i = r.n_cached_blocks; i < n_full; ++i) (void)pool_.cache(r.table[i], r.hashes[i]);
      r.n_cached_blocks = n_full;
    }
  }
  return true;
}

std::optional<KvCacheManager::ForkResult> KvCacheManager::fork(RequestId parent, RequestId child,
                                                               int n_computed) {
  auto pit = requests_.find(parent);
  DS_CHECK_MSG(pit != requests_.end(), "fork of unknown request");
  DS_CHECK_MSG(!has_request(child), "fork into an existing request");
  const RequestBlocks& p = pit->second;
  const int bs = config_.block_size;
  const int n_full = n_computed / bs;
  const int n_partial = n_computed % bs;
  DS_CHECK(blocks_for(n_computed) <= static_cast<int>(p.table.size()));
  if (n_partial > 0 && pool_.n_free() < 1) return std::nullopt;

  RequestBlocks c;
  c.table.assign(p.table.begin(), p.table.begin() + n_full);
  pool_.touch(c.table);
  c.hashes.assign(p.hashes.begin(), p.hashes.begin() + std::min<size_t>(p.hashes.size(), n_full));
  c.n_cached_blocks = std::min(p.n_cached_blocks, n_full);
  ForkResult result;
  if (n_partial > 0) {
    BlockId dst = pool_.allocate(1)[0];
    c.table.push_back(dst);
    result.copy = BlockCopy{p.table[n_full], dst, n_partial};
  }
  requests_.emplace(child, std::move(c));
  return result;
}

void KvCacheManager::free(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::vector<BlockId>& table = it->second.table;
  std::reverse(table.begin(), table.end());
  pool_.release(table);
  requests_.erase(it);
}

std::span<const BlockId> KvCacheManager::block_table(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  return it->second.table;
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats s;
  s.n_queried_tokens = n_queried_tokens_;
  s.n_hit_tokens = n_hit_tokens_;
  s.n_blocks = pool_.n_blocks();
  s.n_free_blocks = pool_.n_free();
  s.usage = pool_.usage();
  return s;
}

Status KvCacheManager::check_invariants() const {
  DS_RETURN_IF_ERROR(pool_.check_invariants());
  std::vector<int> owners(pool_.n_blocks(), 0);
  for (const auto& [id, r] : requests_) {
    std::vector<BlockId> sorted = r.table;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return internal_error("request " + std::to_string(id) + " lists a block twice");
    }
    for (BlockId b : r.table) {
      if (b < 0 || b >= pool_.n_blocks()) return internal_error("block id out of range");
      ++owners[b];
    }
  }
  for (BlockId b = 0; b < pool_.n_blocks(); ++b) {
    if (owners[b] != pool_.ref_cnt(b)) {
      return internal_error("block " + std::to_string(b) + " has ref_cnt " +
                            std::to_string(pool_.ref_cnt(b)) + " but " + std::to_string(owners[b]) +
                            " owners");
    }
  }
  return Status::Ok();
}

}  // namespace dserve::kvcache
