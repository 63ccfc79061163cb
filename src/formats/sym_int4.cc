#include "formats/sym_int4.h"

#include <cmath>

#include "formats/group_rule.h"
#include "formats/scale.h"

namespace woq::sym_int4 {

GroupRule fit_group(Int4Range range, const float* x, std::int64_t n) {
  float amax = 0.0f, max = 0.0f;  // max: the signed value of largest magnitude
  for (std::int64_t j = 0; j < n; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return rule(range, amax, max);
}

GroupRule rule(Int4Range range, float amax, float max) {
  const bool full = range == Int4Range::kFull;
  GroupRule r;
  r.scale = codec::encode_scale(full ? max / -8.0f : amax / 7.0f);
  r.zero = 8;
  r.lo = full ? 0 : 1;
  r.hi = 15;
  return r;
}

void quantize_row(const float* x, std::int64_t k, std::int64_t group, Int4Range range,
                  std::uint8_t* q, std::uint16_t* scales) {
  const std::int64_t groups = (k + group - 1) / group;
  for (std::int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * group;
    const std::int64_t n = codec::group_len(g, k, group);
    const GroupRule rule = fit_group(range, xg, n);
    scales[g] = rule.scale;
    quantize_nibbles(rule, xg, n, q, g * group);
  }
}

void dequantize_row(const std::uint8_t* q, const std::uint16_t* scales, std::int64_t k,
                    std::int64_t group, float* out) {
  for (std::int64_t j0 = 0, g = 0; j0 < k; j0 += group, ++g) {
    const float d = fp16_to_fp32(scales[g]);
    for (std::int64_t j = j0; j < std::min(k, j0 + group); ++j) out[j] = static_cast<float>(codec::get_nibble(q, j) - 8) * d;
  }
}

}  // namespace woq::sym_int4
