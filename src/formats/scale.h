// Shared helpers of the group-wise codecs: fp16 scales and rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/half.h"

namespace woq::codec {

/// fp16 bits of a group scale. Throws woq::Error when |d| does not fit fp16
/// (weights beyond ~5e5 in magnitude), since clamping would silently
/// destroy the group.
inline std::uint16_t encode_scale(float d) {
  const std::uint16_t h = fp32_to_fp16(d);
  if (!std::isfinite(fp16_to_fp32(h)))
    fail("group scale {} overflows fp16 (weights too large for this format)", d);
  return h;
}

/// round-to-nearest-even of x / d clamped to [lo, hi]; 0 when d == 0.
inline int round_div(float x, float d, int lo, int hi) {
  if (d == 0.0f) return 0;
  const float x_d = x / d;  // round to nearest even, as std::nearbyint in the default mode (group_rule.h's round_even)
  const float a = std::fabs(x_d);
  const float r = a < 8388608.0f ? std::copysign((a + 8388608.0f) - 8388608.0f, x_d) : x_d;
  return static_cast<int>(std::clamp(r, static_cast<float>(lo), static_cast<float>(hi)));
}

/// Length of group g of a row of k elements with groups of `group`.
inline std::int64_t group_len(std::int64_t g, std::int64_t k, std::int64_t group) {
  return std::min(group, k - g * group);
}

/// Packs value v (0..15) as element j of a nibble-packed row.
inline void put_nibble(std::uint8_t* q, std::int64_t j, int v) {
  std::uint8_t& b = q[j / 2];
  if (j % 2 == 0) {
    b = static_cast<std::uint8_t>((b & 0xf0) | v);
  } else {
    b = static_cast<std::uint8_t>((b & 0x0f) | (v << 4));
  }
}

/// Element j (0..15) of a nibble-packed row.
inline int get_nibble(const std::uint8_t* q, std::int64_t j) {
  return (j % 2 == 0) ? (q[j / 2] & 0x0f) : (q[j / 2] >> 4);
}

}  // namespace woq::codec
