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
#include "formats/scale.h"

namespace woq {

/// std::nearbyint(x) under the default rounding mode (to nearest, ties to
/// even), inline and without branches: |x| + 2^23 − 2^23 rounds a magnitude
/// below 2^23 to an integer; larger ones, infinities and NaN are returned as
/// they are (they are integers already). The sign is x's (−0.3 → −0).
inline float round_even(float x) {
  constexpr float kTwo23 = 8388608.0f;
  const float a = std::fabs(x);
  const float r = std::copysign((a + kTwo23) - kTwo23, x);
  return a < kTwo23 ? r : x;
}

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
    return static_cast<int>(std::clamp(round_even(x / d) + static_cast<float>(zero), static_cast<float>(lo),
                                       static_cast<float>(hi)));
  }
  /// quantize(x[j]) into q[j] for j < n, in a loop the compiler vectorizes.
  void quantize(const float* x, std::int64_t n, std::int32_t* q) const {
    const float d = step();
    if (d == 0.0f) {
      std::fill_n(q, n, zero);
      return;
    }
    const float z = static_cast<float>(zero), l = static_cast<float>(lo), h = static_cast<float>(hi);
    for (std::int64_t j = 0; j < n; ++j) {  // std::clamp(round_even(x[j] / d) + z, l, h), as selects
      float v = round_even(x[j] / d) + z;
      v = v < l ? l : v;
      v = h < v ? h : v;
      q[j] = static_cast<std::int32_t>(v);
    }
  }
  float value(int q) const { return static_cast<float>(q - zero) * step(); }
};

/// rule.quantize(x[j]) for j < n stored as elements j0 + j of the
/// nibble-packed row q (codec::put_nibble), in chunks the compiler vectorizes.
inline void quantize_nibbles(const GroupRule& rule, const float* x, std::int64_t n, std::uint8_t* q, std::int64_t j0) {
  std::int32_t buf[256];
  for (std::int64_t c = 0; c < n; c += 256) {
    const std::int64_t len = std::min<std::int64_t>(256, n - c);
    rule.quantize(x + c, len, buf);
    std::int64_t j = 0;
    if ((j0 + c) % 2 == 0)  // whole bytes
      for (; j + 1 < len; j += 2)
        q[(j0 + c + j) / 2] = static_cast<std::uint8_t>(buf[j] | (buf[j + 1] << 4));
    for (; j < len; ++j) codec::put_nibble(q, j0 + c + j, buf[j]);
  }
}

/// Fits `type`'s rule (see sym_int4.h, asym_int4.h, sym_int8.h) to the group
/// x[0, n). Throws woq::Error when the scale overflows fp16 or for a float type.
GroupRule fit_group(LowBit type, Int4Range range, const float* x, std::int64_t n);

}  // namespace woq
