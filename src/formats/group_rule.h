// The round-to-nearest rule of each integer format for one group, as
// parameters that can be fitted once and applied to values one at a time
// (what GPTQ needs: it fits a group, then quantizes its columns while
// updating the ones not yet quantized). The codecs use the same functions,
// so RTN and GPTQ share one definition of every rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/half.h"
#include "formats/low_bit.h"

namespace woq {

/// A group's parameters: stored integer q = clamp(round(x / d) + zero, lo, hi)
/// (round to nearest even; q = zero when d = 0), meaning (q - zero) * d.
struct GroupRule {
  std::uint16_t scale = 0;  ///< d, fp16 bits
  int zero = 0;             ///< 8 (sym_int4), z in [0, 15] (asym_int4), 0 (sym_int8: q is signed)
  int lo = 0, hi = 0;       ///< stored range

  float step() const { return fp16_to_fp32(scale); }
  int quantize(float x) const {
    const float d = step();
    if (d == 0.0f) return zero;
    return static_cast<int>(std::clamp(std::nearbyint(x / d) + static_cast<float>(zero), static_cast<float>(lo),
                                       static_cast<float>(hi)));
  }
  float value(int q) const { return static_cast<float>(q - zero) * step(); }
};

/// Fits `type`'s rule (see sym_int4.h, asym_int4.h, sym_int8.h) to the group
/// x[0, n). Throws woq::Error when the scale overflows fp16 or for a float type.
GroupRule fit_group(LowBit type, Int4Range range, const float* x, std::int64_t n);

}  // namespace woq
