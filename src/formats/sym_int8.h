// sym_int8: 8-bit symmetric weights, one fp16 scale per group or per row.
//
// Layout of a row of K weights: K signed bytes q in [-127, 127] meaning
// q * d, and one fp16 scale d per group (a single group of K for per-channel,
// the w8a16 layout of GPTQ/compressed-tensors "channel" checkpoints).
//
// Rule (ggml Q8_0 / LLM.int8 absmax): d = amax / 127, q = round(x / d), with
// d rounded to fp16 first and round() to nearest even; -128 is never used so
// the range is symmetric. Trade-off: 8.5 bits/weight at group 32, 8 bits per
// channel; error ~ amax/254 per element, usually indistinguishable from fp16.
#pragma once

#include <cstdint>

#include "formats/group_rule.h"

namespace woq::sym_int8 {

/// The rule above fitted to one group x[0, n) (zero 0, stored range
/// [-127, 127]). Throws woq::Error when d overflows fp16.
GroupRule fit_group(const float* x, std::int64_t n);
/// The rule fit_group fits to a group whose largest |x| is amax. Throws as
/// fit_group does.
GroupRule rule(float amax);

/// Quantizes x[0, k) with groups of `group` into q[0, k) and fp16
/// scales[0, ceil(k/group)). Throws woq::Error if a scale overflows fp16.
void quantize_row(const float* x, std::int64_t k, std::int64_t group, std::int8_t* q,
                  std::uint16_t* scales);

/// out[j] = q_j * scale of j's group, for j in [0, k).
void dequantize_row(const std::int8_t* q, const std::uint16_t* scales, std::int64_t k,
                    std::int64_t group, float* out);

}  // namespace woq::sym_int8
