#include "formats/sym_int4.h"

#include <cmath>

#include "formats/scale.h"

namespace woq::sym_int4 {

void quantize_row(const float* x, std::int64_t k, std::int64_t group, Int4Range range,
                  std::uint8_t* q, std::uint16_t* scales) {
  const std::int64_t groups = (k + group - 1) / group;
  for (std::int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * group;
    const std::int64_t n = codec::group_len(g, k, group);
    float amax = 0.0f;
    float max = 0.0f;  // signed value of largest magnitude
    for (std::int64_t j = 0; j < n; ++j) {
      if (std::fabs(xg[j]) > amax) {
        amax = std::fabs(xg[j]);
        max = xg[j];
      }
    }
    const bool full = range == Int4Range::kFull;
    scales[g] = codec::encode_scale(full ? max / -8.0f : amax / 7.0f);
    const float d = fp16_to_fp32(scales[g]);
    const int lo = full ? -8 : -7;
    for (std::int64_t j = 0; j < n; ++j) {
      codec::put_nibble(q, g * group + j, codec::round_div(xg[j], d, lo, 7) + 8);
    }
  }
}

void dequantize_row(const std::uint8_t* q, const std::uint16_t* scales, std::int64_t k,
                    std::int64_t group, float* out) {
  for (std::int64_t j = 0; j < k; ++j) {
    out[j] = static_cast<float>(codec::get_nibble(q, j) - 8) * fp16_to_fp32(scales[j / group]);
  }
}

}  // namespace woq::sym_int4
