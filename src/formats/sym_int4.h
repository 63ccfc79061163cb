// sym_int4: 4-bit symmetric weights, one fp16 scale d per group.
//
// Layout of a row of K weights: ceil(K/2) bytes, weight j in byte j/2, low
// nibble for even j, high nibble for odd j. A nibble stores q in [0, 15]
// and means (q - 8) * d. Per group: one fp16 scale.
//
// Rule (ggml Q4_0, the default of ipex-llm's optimize_model):
//  - full range: m = the group's value of largest magnitude (with its sign),
//    d = m / -8, q = clamp(round(x / d) + 8, 0, 15). m itself maps to -8
//    exactly; the opposite side reaches only +7 steps, so a value near -m is
//    clamped by up to one step.
//  - clip (S4_Clip): d = amax / 7, q - 8 in [-7, 7]; no clamping, one level unused.
// woq divides by the fp16-rounded d (ggml uses the unrounded one), so every
// unclamped value is within d/2 of its reconstruction. round() is to nearest
// even, like torch.round. Trade-off: 4.5 bits/weight at group 32; smaller
// groups track outliers better but spend more bits on scales.
#pragma once

#include <cstdint>

#include "formats/group_rule.h"
#include "formats/low_bit.h"

namespace woq::sym_int4 {

/// The rule above fitted to one group x[0, n): zero 8, stored range [0, 15]
/// (full) or [1, 15] (clip). Throws woq::Error when d overflows fp16.
GroupRule fit_group(Int4Range range, const float* x, std::int64_t n);
/// The rule fit_group fits to a group whose largest |x| is amax, first met
/// as the value max (0 when amax is). Throws as fit_group does.
GroupRule rule(Int4Range range, float amax, float max);

/// Quantizes x[0, k) with groups of `group` into packed nibbles q[0, ceil(k/2))
/// and fp16 scales[0, ceil(k/group)). Throws woq::Error if a scale overflows fp16.
void quantize_row(const float* x, std::int64_t k, std::int64_t group, Int4Range range,
                  std::uint8_t* q, std::uint16_t* scales);

/// out[j] = (q_j - 8) * scale of j's group, for j in [0, k).
void dequantize_row(const std::uint8_t* q, const std::uint16_t* scales, std::int64_t k,
                    std::int64_t group, float* out);

}  // namespace woq::sym_int4
