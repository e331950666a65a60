// RoPE frequency scaling (Hugging Face's rope_scaling), applied to the per-pair inverse
// frequencies theta^(-2j/D) before the rotation. Only Llama 3.1's "llama3" type: wavelengths
// 2*pi/f above original_max_seq / low_freq_factor are stretched by `factor`, those below
// original_max_seq / high_freq_factor are kept, and those between interpolate smoothly.
#pragma once

#include <cmath>

namespace loom {

struct RopeScaling {
  float factor = 0.f;  // 0: no scaling
  float low_freq_factor = 1.f;
  float high_freq_factor = 4.f;
  int original_max_seq = 8192;

  bool enabled() const { return factor > 0.f; }
  bool operator==(const RopeScaling&) const = default;

  // The scaled inverse frequency (the formula of transformers' _compute_llama3_parameters,
  // evaluated in double).
  double apply(double inv_freq) const {
    if (!enabled()) return inv_freq;
    const double two_pi = 6.283185307179586;
    const double wavelen = two_pi / inv_freq;
    const double low_wavelen = original_max_seq / double(low_freq_factor);
    const double high_wavelen = original_max_seq / double(high_freq_factor);
    if (wavelen < high_wavelen) return inv_freq;
    if (wavelen > low_wavelen) return inv_freq / factor;
    const double smooth = (original_max_seq / wavelen - low_freq_factor) /
                          (double(high_freq_factor) - low_freq_factor);
    return (1.0 - smooth) * inv_freq / factor + smooth * inv_freq;
  }
};

}  // namespace loom
