#include "formats/sym_int8.h"

#include <algorithm>
#include <cmath>

#include "formats/group_rule.h"
#include "formats/scale.h"

namespace woq::sym_int8 {

GroupRule fit_group(const float* x, std::int64_t n) {
  float amax = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return rule(amax);
}

GroupRule rule(float amax) {
  GroupRule r;
  r.scale = codec::encode_scale(amax / 127.0f);
  r.lo = -127;
  r.hi = 127;
  return r;
}

void quantize_row(const float* x, std::int64_t k, std::int64_t group, std::int8_t* q,
                  std::uint16_t* scales) {
  const std::int64_t groups = (k + group - 1) / group;
  for (std::int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * group;
    const std::int64_t n = codec::group_len(g, k, group);
    const GroupRule rule = fit_group(xg, n);
    scales[g] = rule.scale;
    std::int32_t buf[256];
    for (std::int64_t j0 = 0; j0 < n; j0 += 256) {
      const std::int64_t len = std::min<std::int64_t>(256, n - j0);
      rule.quantize(xg + j0, len, buf);
      for (std::int64_t j = 0; j < len; ++j) q[g * group + j0 + j] = static_cast<std::int8_t>(buf[j]);
    }
  }
}

void dequantize_row(const std::int8_t* q, const std::uint16_t* scales, std::int64_t k,
                    std::int64_t group, float* out) {
  for (std::int64_t j0 = 0, g = 0; j0 < k; j0 += group, ++g) {
    const float d = fp16_to_fp32(scales[g]);
    for (std::int64_t j = j0; j < std::min(k, j0 + group); ++j) out[j] = static_cast<float>(q[j]) * d;
  }
}

}  // namespace woq::sym_int8
