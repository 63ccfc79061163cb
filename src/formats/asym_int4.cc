#include "formats/asym_int4.h"

#include <algorithm>

#include "formats/group_rule.h"
#include "formats/scale.h"

namespace woq::asym_int4 {

GroupRule fit_group(const float* x, std::int64_t n) {
  float lo = 0.0f, hi = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
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
    for (std::int64_t j = 0; j < n; ++j) codec::put_nibble(q, g * group + j, rule.quantize(xg[j]));
  }
}

void dequantize_row(const std::uint8_t* q, const std::uint16_t* scales, const std::uint8_t* zeros,
                    std::int64_t k, std::int64_t group, float* out) {
  for (std::int64_t j = 0; j < k; ++j) {
    const std::int64_t g = j / group;
    out[j] = static_cast<float>(codec::get_nibble(q, j) - zeros[g]) * fp16_to_fp32(scales[g]);
  }
}

}  // namespace woq::asym_int4
