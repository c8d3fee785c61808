#include "kvcache/block_pool.h"

#include <string>

#include "base/check.h"

namespace dserve::kvcache {

BlockPool::BlockPool(int n_blocks) : blocks_(n_blocks) {
  DS_CHECK_MSG(n_blocks >= 1, "n_blocks %d", n_blocks);
  for (BlockId b = 0; b < n_blocks; ++b) push_back_free(b);
}

void BlockPool::push_back_free(BlockId b) {
  Block& blk = blocks_[b];
  DS_CHECK(!blk.in_free_list);
  blk.prev = tail_;
  blk.next = kNone;
  if (tail_ != kNone)
    blocks_[tail_].next = b;
  else
    head_ = b;
  tail_ = b;
  blk.in_free_list = true;
  ++n_free_;
}

void BlockPool::unlink_free(BlockId b) {
  Block& blk = blocks_[b];
  DS_CHECK(blk.in_free_list);
  if (blk.prev != kNone)
    blocks_[blk.prev].next = blk.next;
  else
    head_ = blk.next;
  if (blk.next != kNone)
    blocks_[blk.next].prev = blk.prev;
  else
    tail_ = blk.prev;
  blk.prev = blk.next = kNone;
  blk.in_free_list = false;
  --n_free_;
}

void BlockPool::evict(BlockId b) {
  Block& blk = blocks_[b];
  if (!blk.hash) return;
  auto it = cached_.find(*blk.hash);
  DS_CHECK(it != cached_.end() && it->second == b);
  cached_.erase(it);
  blk.hash.reset();
}

std::vector<BlockId> BlockPool::allocate(int n) {
  DS_CHECK_MSG(n >= 0 && n <= n_free_, "allocate %d blocks with %d free", n, n_free_);
  std::vector<BlockId> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    BlockId b = head_;
    unlink_free(b);
    evict(b);
    blocks_[b].ref_cnt = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::touch(std::span<const BlockId> blocks) {
  for (BlockId b : blocks) {
    Block& blk = blocks_[b];
    if (blk.ref_cnt == 0) unlink_free(b);
    ++blk.ref_cnt;
  }
}

void BlockPool::release(std::span<const BlockId> blocks) {
  for (BlockId b : blocks) {
    Block& blk = blocks_[b];
    DS_CHECK_MSG(blk.ref_cnt > 0, "block %d released more often than taken", b);
    if (--blk.ref_cnt == 0) push_back_free(b);
  }
}

std::optional<BlockId> BlockPool::lookup(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::cache(BlockId block, const BlockHash& hash) {
  Block& blk = blocks_[block];
  if (blk.hash) return false;
  if (!cached_.emplace(hash, block).second) return false;
  blk.hash = hash;
  return true;
}

void BlockPool::reset_cache() {
  for (auto& [hash, b] : cached_) blocks_[b].hash.reset();
  cached_.clear();
}

std::vector<BlockId> BlockPool::free_list() const {
  std::vector<BlockId> out;
  for (BlockId b = head_; b != kNone; b = blocks_[b].next) out.push_back(b);
  return out;
}

Status BlockPool::check_invariants() const {
  int n_in_list = 0;
  BlockId prev = kNone;
  for (BlockId b = head_; b != kNone; b = blocks_[b].next) {
    const Block& blk = blocks_[b];
    if (!blk.in_free_list || blk.ref_cnt != 0 || blk.prev != prev) {
      return internal_error("block " + std::to_string(b) + " in the free list is inconsistent");
    }
    if (++n_in_list > n_blocks()) return internal_error("free list has a cycle");
    prev = b;
  }
  if (prev != tail_) return internal_error("free list tail is wrong");
  if (n_in_list != n_free_) return internal_error("n_free disagrees with the free list");
  int n_hashed = 0;
  for (BlockId b = 0; b < n_blocks(); ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref_cnt < 0) return internal_error("block " + std::to_string(b) + " has ref_cnt < 0");
    if ((blk.ref_cnt == 0) != blk.in_free_list) {
      return internal_error("block " + std::to_string(b) + ": ref_cnt " +
                            std::to_string(blk.ref_cnt) + " disagrees with free-list membership");
    }
    if (blk.hash) {
      ++n_hashed;
      auto it = cached_.find(*blk.hash);
      if (it == cached_.end() || it->second != b) {
        return internal_error("block " + std::to_string(b) + "'s hash is not mapped to it");
      }
    }
  }
  if (n_hashed != n_cached()) return internal_error("cache map holds blocks without hashes");
  return Status::Ok();
}

}  // namespace dserve::kvcache
