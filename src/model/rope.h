// RoPE frequencies and the precomputed cos/sin table the Backend's rope() reads.
//
// rope_frequencies() computes inv_freq and the attention scaling exactly as
// transformers' modeling_rope_utils.py does for each rope_type (default, linear,
// llama3, yarn); RopeCache owns a table of cos/sin(position * inv_freq) * scaling for
// positions [0, n_positions).
//
// Thread-safety: RopeCache is immutable after construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace dserve {

struct RopeFrequencies {
  std::vector<float> inv_freq;     // [rotary_dim / 2]
  float attention_scaling = 1.0f;  // multiplies cos and sin (YaRN's mscale)
};

RopeFrequencies rope_frequencies(const RopeConfig& rope);

class RopeCache {
 public:
  // freq_factors: optional per-pair divisors of inv_freq ([rotary_dim / 2]), as GGUF
  // files store llama3-style scaling (the rope_freqs tensor).
  RopeCache(const RopeConfig& rope, int64_t n_positions, std::span<const float> freq_factors = {});
  RopeCache(const RopeCache&) = delete;
  RopeCache& operator=(const RopeCache&) = delete;

  // The table in host memory (for tests and for device_table()).
  const RopeTable& table() const { return table_; }
  const RopeFrequencies& frequencies() const { return freqs_; }

 private:
  RopeFrequencies freqs_;
  std::vector<float> cos_, sin_;  // [n_positions, rotary_dim / 2]
  RopeTable table_;
};

// A RopeCache's table copied into a backend's memory, where Backend::rope reads it.
class DeviceRopeTable {
 public:
  DeviceRopeTable(Backend& backend, const RopeCache& cache);
  const RopeTable& table() const { return table_; }

 private:
  BackendBuffer cos_, sin_;
  RopeTable table_;
};

}  // namespace dserve
