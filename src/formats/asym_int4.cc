#include "formats/asym_int4.h"

#include <algorithm>

#include "formats/scale.h"

namespace woq::asym_int4 {

void quantize_row(const float* x, std::int64_t k, std::int64_t group, std::uint8_t* q,
                  std::uint16_t* scales, std::uint8_t* zeros) {
  const std::int64_t groups = (k + group - 1) / group;
  for (std::int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * group;
    const std::int64_t n = codec::group_len(g, k, group);
    float lo = 0.0f;
    float hi = 0.0f;
    for (std::int64_t j = 0; j < n; ++j) {
      lo = std::min(lo, xg[j]);
      hi = std::max(hi, xg[j]);
    }
    scales[g] = codec::encode_scale((hi - lo) / 15.0f);
    const float s = fp16_to_fp32(scales[g]);
    const int z = codec::round_div(-lo, s, 0, 15);
    zeros[g] = static_cast<std::uint8_t>(z);
    for (std::int64_t j = 0; j < n; ++j) {
      codec::put_nibble(q, g * group + j, codec::round_div(xg[j], s, -z, 15 - z) + z);
    }
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
