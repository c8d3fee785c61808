#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace dserve {
namespace {

// transformers' get_mscale (YaRN paper, eq. 8 generalised by DeepSeek).
double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension index at which a frequency completes `n_rotations` turns over
// `max_pos` positions (inverse of the RoPE wavelength formula).
double yarn_correction_dim(double n_rotations, int dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (n_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

}  // namespace

RopeFrequencies rope_frequencies(const RopeConfig& rope) {
  const int dim = rope.rotary_dim;
  const int half = dim / 2;
  DS_CHECK(dim > 0 && dim % 2 == 0);
  RopeFrequencies out;
  out.inv_freq.resize(half);

  // Base frequencies, as transformers computes them: 1 / base^(2i / dim), in float32.
  std::vector<float> pos_freq(half), base_freq(half);
  for (int i = 0; i < half; ++i) {
    pos_freq[i] = static_cast<float>(std::pow(rope.theta, static_cast<double>(2 * i) / dim));
    base_freq[i] = 1.0f / pos_freq[i];
  }

  switch (rope.type) {
    case RopeScalingType::kDefault:
      out.inv_freq = base_freq;
      break;

    case RopeScalingType::kLinear:
      for (int i = 0; i < half; ++i)
        out.inv_freq[i] = base_freq[i] / static_cast<float>(rope.factor);
      break;

    case RopeScalingType::kLlama3: {
      // Long wavelengths (low frequencies) are divided by `factor`, short ones kept,
      // and those in between interpolated smoothly.
      const double old_ctx = static_cast<double>(rope.original_max_position_embeddings);
      const double low_freq_wavelen = old_ctx / rope.low_freq_factor;
      const double high_freq_wavelen = old_ctx / rope.high_freq_factor;
      for (int i = 0; i < half; ++i) {
        const float f = base_freq[i];
        const double wavelen = 2.0 * M_PI / f;
        float scaled = wavelen > low_freq_wavelen ? f / static_cast<float>(rope.factor) : f;
        const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if (medium) {
          const double smooth = (old_ctx / wavelen - rope.low_freq_factor) /
                                (rope.high_freq_factor - rope.low_freq_factor);
          scaled = static_cast<float>((1.0 - smooth) * scaled / rope.factor + smooth * scaled);
        }
        out.inv_freq[i] = scaled;
      }
      break;
    }

    case RopeScalingType::kYarn: {
      const double factor = rope.factor;
      double attention = 1.0;
      if (rope.attention_factor) {
        attention = *rope.attention_factor;
      } else if (rope.mscale && rope.mscale_all_dim && *rope.mscale != 0 &&
                 *rope.mscale_all_dim != 0) {
        attention = yarn_mscale(factor, *rope.mscale) / yarn_mscale(factor, *rope.mscale_all_dim);
      } else {
        attention = yarn_mscale(factor, 1.0);
      }
      out.attention_scaling = static_cast<float>(attention);

      const double orig = static_cast<double>(rope.original_max_position_embeddings);
      double low = yarn_correction_dim(rope.beta_fast, dim, rope.theta, orig);
      double high = yarn_correction_dim(rope.beta_slow, dim, rope.theta, orig);
      if (rope.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(dim - 1));
      if (low == high) high += 0.001;  // avoid a zero-width ramp, as transformers does
      for (int i = 0; i < half; ++i) {
        // ramp: 0 below `low` (extrapolate: keep the frequency), 1 above `high`
        // (interpolate: divide by factor).
        float ramp = static_cast<float>((static_cast<float>(i) - low) / (high - low));
        ramp = std::clamp(ramp, 0.0f, 1.0f);
        const float extrapolation_weight = 1.0f - ramp;
        const float interpolated = 1.0f / (static_cast<float>(factor) * pos_freq[i]);
        const float extrapolated = base_freq[i];
        out.inv_freq[i] =
            interpolated * (1.0f - extrapolation_weight) + extrapolated * extrapolation_weight;
      }
      break;
    }
  }
  return out;
}

RopeCache::RopeCache(const RopeConfig& rope, int64_t n_positions,
                     std::span<const float> freq_factors)
    : freqs_(rope_frequencies(rope)) {
  const int half = rope.rotary_dim / 2;
  if (!freq_factors.empty()) {
    DS_CHECK(static_cast<int>(freq_factors.size()) == half);
    for (int i = 0; i < half; ++i) freqs_.inv_freq[i] /= freq_factors[i];
  }
  cos_.resize(static_cast<size_t>(n_positions) * half);
  sin_.resize(cos_.size());
  for (int64_t p = 0; p < n_positions; ++p) {
    for (int i = 0; i < half; ++i) {
      // float32 product, as transformers' inv_freq @ position_ids.
      const float angle = freqs_.inv_freq[i] * static_cast<float>(p);
      cos_[p * half + i] =
          static_cast<float>(std::cos(static_cast<double>(angle))) * freqs_.attention_scaling;
      sin_[p * half + i] =
          static_cast<float>(std::sin(static_cast<double>(angle))) * freqs_.attention_scaling;
    }
  }
  table_.rotary_dim = rope.rotary_dim;
  table_.n_positions = n_positions;
  table_.cos = cos_.data();
  table_.sin = sin_.data();
}

DeviceRopeTable::DeviceRopeTable(Backend& backend, const RopeCache& cache) {
  const RopeTable& host = cache.table();
  const size_t bytes = static_cast<size_t>(host.n_positions) * (host.rotary_dim / 2) * sizeof(float);
  cos_ = backend.alloc(bytes);
  sin_ = backend.alloc(bytes);
  backend.upload(cos_.data(), host.cos, bytes);
  backend.upload(sin_.data(), host.sin, bytes);
  table_ = host;
  table_.cos = cos_.as<float>();
  table_.sin = sin_.as<float>();
}

}  // namespace dserve
