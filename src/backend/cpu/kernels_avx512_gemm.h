// Batched (GEMM-shaped) matmul for the 32-element block types Q8_0 / Q4_0 / Q4_1 on
// AVX-512 VNNI: MatmulBatchFn in kernels.h. Included only by kernels_avx512.cc, after
// kernels_x86_impl.h.
//
// The per-row kernels (Q32Kernel in kernels_x86_impl.h) give each weight row its own
// vector and pay a horizontal reduction per 8 blocks and token. Here one 512-bit
// register holds 4 consecutive weights of each of 16 rows (lane p <-> row
// kPanelRow(p)), so one vpdpbusd with a token's 4 activations broadcast from memory
// does 16 rows x 4 k of useful work with nothing to reduce, and a tile of 16 rows x
// up to 12 tokens loads each weight vector once for all its tokens.
//
// For that the 16 rows ("a panel") are transposed block by block (PanelReader): 8
// vectors of unsigned weight bytes u (group g holds elements 4g..4g+3), the row
// scales d, and for Q4_1 the row minima m:
//   Q4_1: u = nibble,   w = d u + m
//   Q4_0: u = nibble,   w = d (u - 8)     integer dot = sum(u q) - 8 sum(q)
//   Q8_0: u = q + 128,  w = d (u - 128)   integer dot = sum(u q) - 128 sum(q)
// where q are the token's int8 activations (kernels.h), whose per-block sums the
// activation tiles carry, so each block's integer dot is exactly the per-row
// kernels' one.
//
// Same results as the per-row kernels, bit for bit: a lane does the float operations
// Q32Kernel does for its row, in the same order (its 8 block-lane accumulators, the
// tail blocks' per-group partials, the final reduction tree). So a token's result
// does not depend on the kernel, the batch or the tile it lands in (the engine's batch
// invariance), and the model's outputs are unchanged. The cost is 8 accumulators per
// row and token instead of one, kept in memory between block chains.
//
// Weights a model prepared at load (CpuBackend::prepare_matmul_weight) are already
// transposed ("packed", PackedPanel): the kernels read them as they stream, one
// contiguous run per panel. Other weights are repacked once per call (and token
// block) into per-thread scratch and reused for every token; a single token (decode)
// takes the transposed vectors straight from the reader instead.
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VNNI__)
#error "kernels_avx512_gemm.h needs -mavx512f -mavx512bw -mavx512vnni"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "tensor/quant_blocks.h"

namespace dserve::cpu {
namespace {

constexpr int kPanelRows = 16;
// Tokens per tile: NT int32 block sums plus NT float accumulators stay in registers.
constexpr int kPanelTokens = 12;

// Row of the panel that vector lane p holds. The repack's 4x4 transposes leave rows
// in this order; it is its own inverse, so the same map puts results back in order.
constexpr int kPanelRow(int p) { return 4 * (p % 4) + p / 4; }

inline __m512i panel_row_index() {
  return _mm512_setr_epi32(kPanelRow(0), kPanelRow(1), kPanelRow(2), kPanelRow(3),
                           kPanelRow(4), kPanelRow(5), kPanelRow(6), kPanelRow(7),
                           kPanelRow(8), kPanelRow(9), kPanelRow(10), kPanelRow(11),
                           kPanelRow(12), kPanelRow(13), kPanelRow(14), kPanelRow(15));
}

// Weight-block traits. kQsOffset: bytes from the block start to qs; the block's first
// 32-bit word holds the f16 d (low half) and, for Q4_1, the f16 m. kOffsetIndex: which
// of the tile's per-block offset sums (kernels.h) makes the integer dot signed.
//
// Packed form, per panel, blocks in pairs: the two blocks' heads (the 16 lanes' d and,
// for Q4_1, m as f16 in lane order; kHeadBytes each), then their transposed weight
// vectors (Q4: the 4 vectors of nibble pairs, unpacked as they are loaded; Q8_0: the 8
// vectors of u = q + 128; kWeightBytes each). A pair is a whole number of cache lines
// and every weight vector 64-byte aligned, with no padding: a packed Q8_0 or Q4_0
// panel is exactly as large as its 16 original rows (decode streams these bytes;
// padding each block's 32 bytes of d to a cache line made Q8_0's 6% more). A
// panel of odd nb ends in a half pair, its second head's bytes unused.
//
// kDecodePrefetch: whether a single-token call over packed panels prefetches each
// panel's successor block by block (the last panel of a matrix always prefetches the
// next matrix). Measured on a Zen 4 core, 1 thread, alternating runs
// (matmul_bench decode/*/vocab_65536x1024, stream/moe_q8_0): Q8_0 streams at 20-26
// GB/s without and 15-17 with them, the MoE stream 18-24 against 14-16; Q4_0 and Q4_1,
// which spend twice the instructions per byte, lose 10-20% without them.
struct PanelQ8_0 {
  using Block = block_q8_0;
  static constexpr int kQsOffset = 2;
  static constexpr int64_t kHeadBytes = 32;
  static constexpr int64_t kWeightBytes = 512;
  static constexpr bool kNibbles = false;
  static constexpr bool kHasMin = false;
  static constexpr int kOffsetIndex = 1;  // -128 sum(q)
  static constexpr bool kDecodePrefetch = false;
};
struct PanelQ4_0 {
  using Block = block_q4_0;
  static constexpr int kQsOffset = 2;
  static constexpr int64_t kHeadBytes = 32;
  static constexpr int64_t kWeightBytes = 256;
  static constexpr bool kNibbles = true;
  static constexpr bool kHasMin = false;
  static constexpr int kOffsetIndex = 0;  // -8 sum(q)
  static constexpr bool kDecodePrefetch = true;
};
struct PanelQ4_1 {
  using Block = block_q4_1;
  static constexpr int kQsOffset = 4;
  static constexpr int64_t kHeadBytes = 64;
  static constexpr int64_t kWeightBytes = 256;
  static constexpr bool kNibbles = true;
  static constexpr bool kHasMin = true;
  static constexpr int kOffsetIndex = -1;  // unsigned weights: no offset
  static constexpr bool kDecodePrefetch = true;
};

// The packed form's addresses (see above): block b's weight vectors and head within a
// panel, and a panel's bytes for nb blocks (PackedLayout::panel_bytes agrees).
template <typename Traits>
constexpr int64_t packed_pair_bytes() {
  return 2 * (Traits::kHeadBytes + Traits::kWeightBytes);
}
template <typename Traits>
inline int64_t packed_weights_at(int64_t b) {
  return (b >> 1) * packed_pair_bytes<Traits>() + 2 * Traits::kHeadBytes +
         (b & 1) * Traits::kWeightBytes;
}
template <typename Traits>
inline int64_t packed_head_at(int64_t b) {
  return (b >> 1) * packed_pair_bytes<Traits>() + (b & 1) * Traits::kHeadBytes;
}
template <typename Traits>
constexpr int64_t packed_panel_bytes(int64_t nb) {
  return nb * (Traits::kHeadBytes + Traits::kWeightBytes) + (nb & 1) * Traits::kHeadBytes;
}

// 16 rows' 16 bytes at rows[r] + offset as four vectors: out[j] lane p = 32-bit word
// j of row kPanelRow(p). (Within each 128-bit lane L, unpacking the four row-quads
// gathers rows L, 4 + L, 8 + L, 12 + L.)
inline void transpose_16x4(const uint8_t* const* rows, int64_t offset, __m512i out[4]) {
  __m512i z[4];
  for (int i = 0; i < 4; ++i) {
    auto ld = [&](int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + offset));
    };
    z[i] = _mm512_castsi128_si512(ld(4 * i));
    z[i] = _mm512_inserti32x4(z[i], ld(4 * i + 1), 1);
    z[i] = _mm512_inserti32x4(z[i], ld(4 * i + 2), 2);
    z[i] = _mm512_inserti32x4(z[i], ld(4 * i + 3), 3);
  }
  const __m512i a = _mm512_unpacklo_epi32(z[0], z[1]);  // rows (L, 4+L) x words 0, 1
  const __m512i b = _mm512_unpackhi_epi32(z[0], z[1]);  // rows (L, 4+L) x words 2, 3
  const __m512i c = _mm512_unpacklo_epi32(z[2], z[3]);  // rows (8+L, 12+L) x words 0, 1
  const __m512i d = _mm512_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm512_unpacklo_epi64(a, c);
  out[1] = _mm512_unpackhi_epi64(a, c);
  out[2] = _mm512_unpacklo_epi64(b, d);
  out[3] = _mm512_unpackhi_epi64(b, d);
}

// Bytes of one block of a repacked panel: 8 weight vectors, d[16], m[16].
constexpr int64_t kPanelBlockBytes = 8 * 64 + 2 * 64;

// Reads 16 weight rows block by block as the kernels want them. Lanes of missing rows
// (n_rows < 16) get d = m = 0 (and row 0's weights), so they compute zeros. Meanwhile
// it prefetches next[0, next_bytes) (the rows of the panel after this one,
// contiguous), a slice per block, so that by the time that panel is read this one's
// arithmetic has hidden the memory latency: sixteen rows are sixteen streams, more
// than the hardware prefetchers follow.
template <typename Traits>
class PanelReader {
 public:
  using Block = typename Traits::Block;
  PanelReader(const uint8_t* w, size_t w_stride, int n_rows, int64_t nb, const uint8_t* next,
              int64_t next_bytes)
      : w_(w), nb_(nb), next_(next), next_bytes_(next_bytes) {
    for (int r = 0; r < kPanelRows; ++r) rows_[r] = w + (r < n_rows ? r : 0) * w_stride;
    const __m512i row_index = panel_row_index();
    valid_ = _mm512_cmplt_epi32_mask(row_index, _mm512_set1_epi32(n_rows));
    head_offsets_ = _mm512_mullo_epi32(row_index, _mm512_set1_epi32(static_cast<int>(w_stride)));
  }

  void block(int64_t b, __m512i u[8], __m512* d, __m512* m) const {
    for (int64_t i = b * next_bytes_ / nb_; i < (b + 1) * next_bytes_ / nb_; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(next_ + i), kStreamPrefetchHint);
    }
    const int64_t blk = b * static_cast<int64_t>(sizeof(Block));
    __m512i t[4];
    transpose_16x4(rows_, blk + Traits::kQsOffset, t);
    if constexpr (Traits::kNibbles) {
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      for (int j = 0; j < 4; ++j) {  // low nibbles: elements 4j.., high: 16 + 4j..
        u[j] = _mm512_and_si512(t[j], low4);
        u[4 + j] = _mm512_and_si512(_mm512_srli_epi32(t[j], 4), low4);
      }
    } else {
      const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));  // q + 128
      for (int j = 0; j < 4; ++j) u[j] = _mm512_xor_si512(t[j], bias);
      transpose_16x4(rows_, blk + Traits::kQsOffset + 16, t);
      for (int j = 0; j < 4; ++j) u[4 + j] = _mm512_xor_si512(t[j], bias);
    }
    const __m512i h = head(blk);
    *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    *m = Traits::kHasMin ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)))
                         : _mm512_setzero_ps();
  }

  // Writes block b into `panel` (64-byte aligned) in the packed form.
  void pack(int64_t b, uint8_t* panel) const {
    const int64_t blk = b * static_cast<int64_t>(sizeof(Block));
    uint8_t* out = panel + packed_weights_at<Traits>(b);
    __m512i t[4];
    transpose_16x4(rows_, blk + Traits::kQsOffset, t);
    if constexpr (Traits::kNibbles) {
      for (int j = 0; j < 4; ++j) _mm512_store_si512(out + 64 * j, t[j]);
    } else {
      const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));  // q + 128
      for (int j = 0; j < 4; ++j) _mm512_store_si512(out + 64 * j, _mm512_xor_si512(t[j], bias));
      transpose_16x4(rows_, blk + Traits::kQsOffset + 16, t);
      for (int j = 0; j < 4; ++j) {
        _mm512_store_si512(out + 64 * (4 + j), _mm512_xor_si512(t[j], bias));
      }
    }
    const __m512i h = head(blk);
    uint8_t* head_out = panel + packed_head_at<Traits>(b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(head_out), _mm512_cvtepi32_epi16(h));
    if constexpr (Traits::kHasMin) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(head_out + 32),
                         _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    }
  }

 private:
  // The first 32-bit word of each row's block at byte offset blk (f16 d, Q4_1's f16 m
  // above it), in lane order; zero in the lanes of missing rows.
  __m512i head(int64_t blk) const {
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid_, head_offsets_, w_ + blk,
                                       1);
  }

  const uint8_t* w_;
  const uint8_t* rows_[kPanelRows];
  int64_t nb_;
  const uint8_t* next_;
  int64_t next_bytes_;
  __mmask16 valid_;
  __m512i head_offsets_;
};

// Reads a panel that repack_panel left in scratch: the weights unpacked, d and m as
// floats.
// Panels (ScratchPanel, PackedPanel) give a block's weight vector of group g
// (group(b, g)) and its d and m (scales(b, ...)) separately, so the tile kernel can
// load each vector just before its vpdpbusd run: a tile's 12 int32 sums and 12
// float accumulators then leave room for it in the 32 registers.
struct ScratchPanel {
  const uint8_t* panel;
  void prefetch(int64_t) const {}
  __m512i group(int64_t b, int g) const {
    return _mm512_load_si512(panel + b * kPanelBlockBytes + 64 * g);
  }
  void scales(int64_t b, __m512* d, __m512* m) const {
    const uint8_t* pb = panel + b * kPanelBlockBytes;
    *d = _mm512_load_ps(reinterpret_cast<const float*>(pb + 512));
    *m = _mm512_load_ps(reinterpret_cast<const float*>(pb + 576));
  }
};

// Reads a panel of a packed weight (PanelReader::pack): nibbles unpacked and f16
// scales widened as they are loaded, which costs a few instructions per block next
// to the block's 8 vpdpbusd per token and keeps the packed weight as small as the
// original.
//
// Each block read also prefetches the same block of the next panel (`next`: panels are
// contiguous), so the next panel is in cache when the kernel gets there; the stride of
// the lane chains (8 blocks) defeats the hardware prefetcher on the first pass.
template <typename Traits>
struct PackedPanel {
  const uint8_t* panel;
  const uint8_t* next;
  // The next panel's lines in step with this one's blocks: a pair's lines split
  // between its two blocks.
  void prefetch(int64_t b) const {
    if (next == nullptr) return;
    constexpr int64_t kHalf = packed_pair_bytes<Traits>() / 2;
    for (int64_t i = b * kHalf; i < (b + 1) * kHalf; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(next + i), kStreamPrefetchHint);
    }
  }
  __m512i group(int64_t b, int g) const {
    const uint8_t* pb = panel + packed_weights_at<Traits>(b);
    if constexpr (Traits::kNibbles) {  // low nibbles: elements 4g.., high: 16 + 4(g - 4)..
      const __m512i t = _mm512_load_si512(pb + 64 * (g % 4));
      return _mm512_and_si512(g < 4 ? t : _mm512_srli_epi32(t, 4), _mm512_set1_epi8(0x0F));
    } else {
      return _mm512_load_si512(pb + 64 * g);
    }
  }
  void block(int64_t b, __m512i u[8], __m512* d, __m512* m) const {
    prefetch(b);
    for (int g = 0; g < 8; ++g) u[g] = group(b, g);
    scales(b, d, m);
  }
  void scales(int64_t b, __m512* d, __m512* m) const {
    const uint8_t* head = panel + packed_head_at<Traits>(b);
    *d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(head)));
    *m = Traits::kHasMin
             ? _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(head + 32)))
             : _mm512_setzero_ps();
  }
};

template <typename Traits>
void repack_panel(const PanelReader<Traits>& reader, int64_t nb, uint8_t* panel) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* out = panel + b * kPanelBlockBytes;
    __m512i u[8];
    __m512 d, m;
    reader.block(b, u, &d, &m);
    for (int g = 0; g < 8; ++g) _mm512_store_si512(out + 64 * g, u[g]);
    _mm512_store_ps(reinterpret_cast<float*>(out + 512), d);
    _mm512_store_ps(reinterpret_cast<float*>(out + 576), m);
  }
}

inline __m512i broadcast_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline __m512 broadcast_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_ps(v);
}

// acc + vpdpbusd(u, the 4 bytes at p broadcast to every lane), the broadcast folded
// into the instruction as its memory operand ({1to16}). Written out because GCC
// emits a separate vpbroadcastd for every _mm512_dpbusd_epi32 of a _mm512_set1_epi32
// (matmul_bench prefill64/q8_0/r1_expert_2048x7168/prepared, one Zen 4 core,
// alternating runs: 2.9% faster this way).
inline __m512i dpbusd_broadcast(__m512i acc, __m512i u, const uint8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// Where token t's values for one block sit in an activation tile block of width W
// (kernels.h): W = kPanelTokens, or 1 in a single-token call.
template <int W>
struct TileLayout {
  static constexpr int64_t kBytes = q8x32_tile_block_bytes(W);
  static const uint8_t* qs(const uint8_t* xb, int g, int t) { return xb + 4 * (g * W + t); }
  static const uint8_t* d(const uint8_t* xb, int t) { return xb + 4 * (8 * W + t); }
  static const uint8_t* s(const uint8_t* xb, int t) { return xb + 4 * (9 * W + t); }
  // -8 sum(q) (i = 0) or -128 sum(q) (i = 1) as int32.
  static const uint8_t* offset(const uint8_t* xb, int i, int t) {
    return xb + 4 * ((10 + i) * W + t);
  }
};
using TileBlock = TileLayout<kPanelTokens>;
using SingleTokenBlock = TileLayout<1>;

// Q32Kernel groups a row's blocks 8 at a time (block b in lane b % 8) while at least 4
// are left, and adds a shorter tail block by block (single()).
inline int64_t grouped_blocks(int64_t nb) { return nb % 8 >= 4 ? nb : nb - nb % 8; }

// A block already in registers, as a panel (for grouped_block).
struct BlockInRegisters {
  const __m512i* u;
  __m512 d, m;
  __m512i group(int64_t, int g) const { return u[g]; }
  void scales(int64_t, __m512* d_out, __m512* m_out) const {
    *d_out = d;
    *m_out = m;
  }
};

// Adds block b of `panel` for NT tokens to acc (lane b % 8 of Q32Kernel::group); xb:
// the block in the activations' layout Tile.
template <typename Traits, int NT, typename Tile = TileBlock, typename Panel>
inline void grouped_block(const Panel& panel, int64_t b, const uint8_t* xb, __m512 (&acc)[NT]) {
  __m512i isum[NT];
  for (int t = 0; t < NT; ++t) {
    isum[t] = Traits::kOffsetIndex >= 0 ? broadcast_i32(Tile::offset(xb, Traits::kOffsetIndex, t))
                                        : _mm512_setzero_si512();
  }
  if constexpr (NT == 1) {
    // One token: 8 dependent vpdpbusd would be a chain of 8 latencies per block; four
    // chains of two, summed (integer sums: exact in any order).
    __m512i part[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      part[g] = dpbusd_broadcast(g == 0 ? isum[0] : _mm512_setzero_si512(), panel.group(b, g),
                                 Tile::qs(xb, g, 0));
    }
#pragma GCC unroll 4
    for (int g = 4; g < 8; ++g) {
      part[g - 4] = dpbusd_broadcast(part[g - 4], panel.group(b, g), Tile::qs(xb, g, 0));
    }
    isum[0] = _mm512_add_epi32(_mm512_add_epi32(part[0], part[1]), _mm512_add_epi32(part[2], part[3]));
  } else {
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m512i u = panel.group(b, g);
      for (int t = 0; t < NT; ++t) isum[t] = dpbusd_broadcast(isum[t], u, Tile::qs(xb, g, t));
    }
  }
  __m512 d, m;
  panel.scales(b, &d, &m);
  for (int t = 0; t < NT; ++t) {
    const __m512 scale = _mm512_mul_ps(d, broadcast_f32(Tile::d(xb, t)));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), scale, acc[t]);
    if constexpr (Traits::kHasMin) acc[t] = _mm512_fmadd_ps(m, broadcast_f32(Tile::s(xb, t)), acc[t]);
  }
}

// Adds tail block b of NT tokens to the 8 lane accumulators (Q32Kernel::single: the
// block's 8 group dots go to lanes 0..7, the Q4_1 minimum term to lane 0).
template <typename Traits, int NT, typename Tile = TileBlock>
inline void tail_block(const __m512i* u, __m512 d, __m512 m, const uint8_t* xb,
                       __m512 (*acc8)[NT]) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(Traits::kNibbles ? 8 : 0x80));
  for (int t = 0; t < NT; ++t) {
    const __m512 scale = _mm512_mul_ps(d, broadcast_f32(Tile::d(xb, t)));
    for (int g = 0; g < 8; ++g) {
      const __m512i xq = broadcast_i32(Tile::qs(xb, g, t));
      __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[g], xq);
      if constexpr (Traits::kOffsetIndex >= 0) {  // minus 8 or 128 times this group's sum(q)
        dot = _mm512_sub_epi32(dot, _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xq));
      }
      acc8[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc8[g][t]);
    }
    if constexpr (Traits::kHasMin) {  // a rounded product, then an add: no FMA here
      const __m512 ms = _mm512_mul_round_ps(m, broadcast_f32(Tile::s(xb, t)),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      acc8[0][t] = _mm512_add_ps(acc8[0][t], ms);
    }
  }
}

// hsum256's tree over the 8 lane accumulators, then rows back in order.
template <int NT>
inline void store_rows(__m512 (*acc8)[NT], float* y, int64_t y_stride, __mmask16 store_mask) {
  const __m512i order = panel_row_index();
  for (int t = 0; t < NT; ++t) {
    const __m512 s0 = _mm512_add_ps(acc8[0][t], acc8[4][t]);
    const __m512 s1 = _mm512_add_ps(acc8[1][t], acc8[5][t]);
    const __m512 s2 = _mm512_add_ps(acc8[2][t], acc8[6][t]);
    const __m512 s3 = _mm512_add_ps(acc8[3][t], acc8[7][t]);
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
    _mm512_mask_storeu_ps(y + t * y_stride, store_mask, _mm512_permutexvar_ps(order, sum));
  }
}

// y[t * y_stride + r] = row r of the panel . token t of the activation tile, for
// t < NT and rows r where store_mask has bit r (rows in order). Panel: ScratchPanel
// or PackedPanel.
template <typename Traits, int NT, typename Panel>
void panel_tile(const Panel& panel, int64_t nb, const uint8_t* tile, float* y,
                int64_t y_stride, __mmask16 store_mask) {
  alignas(64) __m512 acc8[8][NT];
  const int64_t n_grouped = grouped_blocks(nb);
  for (int lane = 0; lane < 8; ++lane) {  // the chain of blocks lane, lane + 8, ...
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = lane; b < n_grouped; b += 8) {
      panel.prefetch(b);
      grouped_block<Traits, NT>(panel, b, tile + b * TileBlock::kBytes, acc);
    }
    for (int t = 0; t < NT; ++t) acc8[lane][t] = acc[t];
  }
  for (int64_t b = n_grouped; b < nb; ++b) {
    __m512i u[8];
    __m512 d, m;
    panel.prefetch(b);
    for (int g = 0; g < 8; ++g) u[g] = panel.group(b, g);
    panel.scales(b, &d, &m);
    tail_block<Traits, NT>(u, d, m, tile + b * TileBlock::kBytes, acc8);
  }
  store_rows<NT>(acc8, y, y_stride, store_mask);
}

template <typename Traits, int NT, typename Panel>
void panel_tile_any(int nt, const Panel& panel, int64_t nb, const uint8_t* tile, float* y,
                    int64_t y_stride, __mmask16 store_mask) {
  if constexpr (NT >= 1) {
    if (nt == NT) {
      panel_tile<Traits, NT>(panel, nb, tile, y, y_stride, store_mask);
    } else {
      panel_tile_any<Traits, NT - 1>(nt, panel, nb, tile, y, y_stride, store_mask);
    }
  }
}

// One token (decode): blocks in order, 8 at a time so that the 8 lane accumulators
// stay in registers. A packed panel's weight vectors go straight from memory into the
// vpdpbusd: staged in an array first (PanelReader::block's form), GCC stored each
// block's 8 vectors to the stack, 512 bytes of stores for every 576 bytes streamed, and
// the decode ran at 11-22 GB/s where the same loop without them ran at 19-31 (Zen 4, 1
// thread). The unpacked reader transposes into such an array anyway. The token's
// activations are a tile of width 1 (kernels.h).
template <typename Reader>
concept DirectPanel = requires(const Reader& r) { r.group(int64_t{0}, 0); };

template <typename Traits, typename Reader>
void panel_single(const Reader& reader, int64_t nb, const uint8_t* tile, float* y,
                  __mmask16 store_mask) {
  __m512 acc8[8][1];
  for (int lane = 0; lane < 8; ++lane) acc8[lane][0] = _mm512_setzero_ps();
  const int64_t n_grouped = grouped_blocks(nb);
  auto add_grouped = [&](int64_t b, __m512 (&acc)[1]) __attribute__((always_inline)) {
    const uint8_t* xb = tile + b * SingleTokenBlock::kBytes;
    if constexpr (DirectPanel<Reader>) {
      reader.prefetch(b);
      grouped_block<Traits, 1, SingleTokenBlock>(reader, b, xb, acc);
    } else {
      __m512i u[8];
      __m512 d, m;
      reader.block(b, u, &d, &m);
      grouped_block<Traits, 1, SingleTokenBlock>(BlockInRegisters{u, d, m}, b, xb, acc);
    }
  };
  int64_t b = 0;
  for (; b + 8 <= n_grouped; b += 8) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) add_grouped(b + j, acc8[j]);
  }
  for (; b < nb; ++b) {
    if (b < n_grouped) {
      add_grouped(b, acc8[b % 8]);
    } else {
      __m512i u[8];
      __m512 d, m;
      reader.block(b, u, &d, &m);
      tail_block<Traits, 1, SingleTokenBlock>(u, d, m, tile + b * SingleTokenBlock::kBytes, acc8);
    }
  }
  store_rows<1>(acc8, y, 0, store_mask);
}

template <typename Traits>
void matmul_q32_batched(const uint8_t* w, size_t w_stride, const uint8_t* x_tiles, int64_t k,
                        int64_t n_rows, int64_t n_tokens, float* y, int64_t y_stride,
                        uint8_t* scratch) {
  const int64_t nb = k / 32;
  const int64_t tile_bytes = nb * TileBlock::kBytes;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
    const int nr = static_cast<int>(n_rows - r0 < kPanelRows ? n_rows - r0 : kPanelRows);
    const __mmask16 store_mask = static_cast<__mmask16>((1u << nr) - 1);
    const int64_t next_rows = n_rows - r0 - nr < kPanelRows ? n_rows - r0 - nr : kPanelRows;
    const PanelReader<Traits> reader(w + r0 * w_stride, w_stride, nr, nb,
                                     w + (r0 + nr) * w_stride,
                                     next_rows * static_cast<int64_t>(w_stride));
    if (n_tokens == 1) {
      panel_single<Traits>(reader, nb, x_tiles, y + r0, store_mask);
      continue;
    }
    repack_panel(reader, nb, scratch);
    const ScratchPanel panel{scratch};
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kPanelTokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kPanelTokens ? n_tokens - t0 : kPanelTokens);
      panel_tile_any<Traits, kPanelTokens>(nt, panel, nb,
                                           x_tiles + t0 / kPanelTokens * tile_bytes,
                                           y + t0 * y_stride + r0, y_stride, store_mask);
    }
  }
}

// QuantizeTilesFn at 512 bits: quantize_q8x32_tiles_x86 (kernels_x86_impl.h) with a
// block's 32 values in two registers. The same bytes: the max is exact in any order,
// the scale, products and round-to-nearest-even conversions are the same operations,
// and saturating straight to int8 equals saturating to int16 first.
inline void quantize_q8x32_tiles_avx512(const float* x, int64_t k, int64_t t, int64_t tile,
                                        uint8_t* tiles) {
  const int64_t block_bytes = q8x32_tile_block_bytes(tile);
  uint8_t* base = tiles + t / tile * (k / 32) * block_bytes + 4 * (t % tile);
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + 32 * b);
    const __m512 x1 = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, idv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, idv));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    alignas(16) int32_t groups[8];  // group g: elements 4g..4g+3 as int8
    _mm_store_si128(reinterpret_cast<__m128i*>(groups), _mm512_cvtsepi32_epi8(q0));
    _mm_store_si128(reinterpret_cast<__m128i*>(groups + 4), _mm512_cvtsepi32_epi8(q1));
    store_q8x32_tile_slot(base + b * block_bytes, tile, reinterpret_cast<const int8_t*>(groups),
                          d, d * static_cast<float>(sum), sum);
  }
}

// PackWeightFn: every panel of w in the packed form.
template <typename Traits>
void pack_weight_q32(const uint8_t* w, size_t w_stride, int64_t n_rows, int64_t k, uint8_t* out) {
  const int64_t nb = k / 32;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
    const int nr = static_cast<int>(n_rows - r0 < kPanelRows ? n_rows - r0 : kPanelRows);
    const PanelReader<Traits> reader(w + r0 * w_stride, w_stride, nr, nb, nullptr, 0);
    uint8_t* panel = out + r0 / kPanelRows * packed_panel_bytes<Traits>(nb);
    for (int64_t b = 0; b < nb; ++b) reader.pack(b, panel);
  }
}

// MatmulPackedFn: matmul_q32_batched over packed panels.
template <typename Traits>
void matmul_q32_packed(const uint8_t* packed, const uint8_t* x_tiles, int64_t k, int64_t n_rows,
                       int64_t n_tokens, float* y, int64_t y_stride, const uint8_t* next_matrix) {
  const int64_t nb = k / 32;
  const int64_t tile_bytes = nb * TileBlock::kBytes;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
    const int nr = static_cast<int>(n_rows - r0 < kPanelRows ? n_rows - r0 : kPanelRows);
    const __mmask16 store_mask = static_cast<__mmask16>((1u << nr) - 1);
    const uint8_t* p = packed + r0 / kPanelRows * packed_panel_bytes<Traits>(nb);
    // The last panel prefetches the matrix this thread reads next, where there is one
    // (else the bytes after this matrix: a prefetch never faults).
    const bool last = r0 + kPanelRows >= n_rows;
    const uint8_t* next =
        last && next_matrix != nullptr ? next_matrix : p + packed_panel_bytes<Traits>(nb);
    if (n_tokens == 1) {
      // Decode reads the panels in order, one sequential stream that the hardware
      // prefetcher follows; see Traits::kDecodePrefetch for where ours still pays.
      const bool prefetch = last || Traits::kDecodePrefetch;
      panel_single<Traits>(PackedPanel<Traits>{p, prefetch ? next : nullptr}, nb, x_tiles, y + r0,
                           store_mask);
      continue;
    }
    const PackedPanel<Traits> panel{p, next};
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kPanelTokens) {
      const int nt = static_cast<int>(n_tokens - t0 < kPanelTokens ? n_tokens - t0 : kPanelTokens);
      panel_tile_any<Traits, kPanelTokens>(nt, panel, nb,
                                           x_tiles + t0 / kPanelTokens * tile_bytes,
                                           y + t0 * y_stride + r0, y_stride, store_mask);
    }
  }
}

template <typename Traits>
void add_packed(KernelTable& t, DType dtype) {
  const int i = static_cast<int>(dtype);
  t.pack_weight[i] = pack_weight_q32<Traits>;
  t.matmul_packed[i] = matmul_q32_packed<Traits>;
  t.packed_layout[i].block_bytes = Traits::kHeadBytes + Traits::kWeightBytes;
  t.packed_layout[i].odd_block_extra_bytes = Traits::kHeadBytes;
}

// Installs the batched kernels into an AVX-512 table. They serve every token count:
// one token is cheaper this way too, and the results are the per-row kernels' anyway.
inline void add_avx512_batched(KernelTable& t) {
  t.matmul_batched[static_cast<int>(DType::kQ8_0)] = matmul_q32_batched<PanelQ8_0>;
  t.matmul_batched[static_cast<int>(DType::kQ4_0)] = matmul_q32_batched<PanelQ4_0>;
  t.matmul_batched[static_cast<int>(DType::kQ4_1)] = matmul_q32_batched<PanelQ4_1>;
  t.matmul_batched_min_tokens = 1;
  t.matmul_batched_tile = kPanelTokens;
  t.quantize_q8x32_tiles = quantize_q8x32_tiles_avx512;
  add_packed<PanelQ8_0>(t, DType::kQ8_0);
  add_packed<PanelQ4_0>(t, DType::kQ4_0);
  add_packed<PanelQ4_1>(t, DType::kQ4_1);
}

}  // namespace
}  // namespace dserve::cpu
