#include "formats/asym_int4.h"

#include <algorithm>

#include "formats/group_rule.h"
#include "formats/scale.h"

namespace woq::asym_int4 {

GroupRule fit_group(const float* x, std::int64_t n) {
  // min(0, x) and max(0, x) in 16 lanes the compiler vectorizes: the same values in any order for finite x
  // (a lane takes an x only when it is strictly beyond, so never a -0 over the +0 it starts from).
  constexpr std::int64_t kLanes = 16;
  float lo_lane[kLanes] = {}, hi_lane[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) {
      lo_lane[l] = std::min(lo_lane[l], x[j + l]);
      hi_lane[l] = std::max(hi_lane[l], x[j + l]);
    }
  float lo = 0.0f, hi = 0.0f;
  for (; j < n; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  for (std::int64_t l = 0; l < kLanes; ++l) {
    lo = std::min(lo, lo_lane[l]);
    hi = std::max(hi, hi_lane[l]);
  }
  return rule(lo, hi);
}

GroupRule rule(float lo, float hi) {
  GroupRule r;
  r.scale = codec::encode_scale((hi - lo) / 15.0f);
  r.zero = codec::round_div(-lo, r.step(), 0, 15);
  r.lo = 0;
  r.hi = 15;
  return r;
}

void quantize_row(const float* x, std::int64_t k, std::int64_t group, std::uint8_t* q,
                  std::uint16_t* scales, std::uint8_t* zeros) {
  const std::int64_t groups = (k + group - 1) / group;
  for (std::int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * group;
    const std::int64_t n = codec::group_len(g, k, group);
    const GroupRule rule = fit_group(xg, n);
    scales[g] = rule.scale;
    zeros[g] = static_cast<std::uint8_t>(rule.zero);
    quantize_nibbles(rule, xg, n, q, g * group);
  }
}

void dequantize_row(const std::uint8_t* q, const std::uint16_t* scales, const std::uint8_t* zeros,
                    std::int64_t k, std::int64_t group, float* out) {
  for (std::int64_t j0 = 0, g = 0; j0 < k; j0 += group, ++g) {
    const float d = fp16_to_fp32(scales[g]);
    const int z = zeros[g];
    for (std::int64_t j = j0; j < std::min(k, j0 + group); ++j)
      out[j] = static_cast<float>(codec::get_nibble(q, j) - z) * d;
  }
}

}  // namespace woq::asym_int4
