#include "kvcache/block_hash.h"

namespace dserve::kvcache {
namespace {

constexpr uint64_t kMulA = 0x9e3779b97f4a7c15ull;  // 2^64 / golden ratio
constexpr uint64_t kMulB = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kMulC = 0x165667b19e3779f9ull;
constexpr uint64_t kLaneKeyHi = 0x243f6a8885a308d3ull;  // digits of pi: arbitrary, fixed
constexpr uint64_t kLaneKeyLo = 0x13198a2e03707344ull;

constexpr uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Murmur3's 64-bit finaliser: every input bit flips each output bit with p ~ 1/2.
constexpr uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

// One keyed 64-bit lane. Each word is pre-mixed with the lane key before it is absorbed,
// so the two lanes see different functions of the same input.
class Lane {
 public:
  explicit Lane(uint64_t key) : key_(key), h_(fmix64(key ^ kMulC)) {}
  void absorb(uint64_t w) {
    uint64_t m = fmix64(w ^ key_) * kMulA;
    h_ = rotl(h_ ^ m, 29) * kMulB + kMulC;
    ++n_;
  }
  uint64_t finish() const { return fmix64(h_ ^ (n_ * kMulA)); }

 private:
  uint64_t key_;
  uint64_t h_;
  uint64_t n_ = 0;
};

}  // namespace

BlockHash root_hash(uint64_t seed) {
  return {fmix64(seed ^ kLaneKeyHi) | 1, fmix64(seed ^ kLaneKeyLo)};
}

BlockHash hash_block(const BlockHash& parent, uint64_t extra_key, std::span<const int32_t> tokens) {
  // Both lanes are keyed by the parent, so the seed in root_hash() reaches every block.
  Lane a(parent.hi ^ kLaneKeyHi), b(parent.lo ^ kLaneKeyLo);
  auto absorb = [&](uint64_t w) {
    a.absorb(w);
    b.absorb(w);
  };
  absorb(parent.hi);
  absorb(parent.lo);
  absorb(extra_key);
  absorb(tokens.size());
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {
    absorb(uint64_t(uint32_t(tokens[i])) | (uint64_t(uint32_t(tokens[i + 1])) << 32));
  }
  if (i < tokens.size()) absorb(uint64_t(uint32_t(tokens[i])) | (uint64_t(1) << 63));
  return {a.finish(), b.finish()};
}

uint64_t hash_string(std::string_view s, uint64_t seed) {
  Lane lane(seed ^ kLaneKeyHi);
  lane.absorb(s.size());
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) w |= uint64_t(uint8_t(s[i + j])) << (8 * j);
    lane.absorb(w);
  }
  uint64_t w = 0;
  for (int j = 0; i + j < s.size(); ++j) w |= uint64_t(uint8_t(s[i + j])) << (8 * j);
  lane.absorb(w);
  return lane.finish();
}

}  // namespace dserve::kvcache
