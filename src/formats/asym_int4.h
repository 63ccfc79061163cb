// asym_int4: 4-bit weights with a scale s and an integer zero point z per group.
//
// Layout of a row: packed nibbles exactly as sym_int4 (weight j in byte j/2,
// low nibble for even j), plus per group one fp16 scale and one zero point
// z in [0, 15] (one byte each in woq's memory layout). A nibble q means
// (q - z) * s.
//
// Rule (GPTQ's / AWQ's min-max quantizer): lo = min(min x, 0),
// hi = max(max x, 0), s = (hi - lo) / 15, z = clamp(round(-lo / s), 0, 15),
// q = clamp(round(x / s) + z, 0, 15), with s rounded to fp16 first and
// round() to nearest even. The range includes 0, so z is always in [0, 15]
// and zero is represented exactly. Trade-off against sym_int4: uses all 16
// levels on skewed groups, at the cost of a byte (or 4 bits on disk) per group.
#pragma once

#include <cstdint>

#include "formats/group_rule.h"

namespace woq::asym_int4 {

/// The rule above fitted to one group x[0, n) (stored range [0, 15]).
/// Throws woq::Error when s overflows fp16.
GroupRule fit_group(const float* x, std::int64_t n);
/// The rule fit_group fits to a group whose min(0, x) is lo and max(0, x) is
/// hi (for the kernels that find them in vectors). Throws as fit_group does.
GroupRule rule(float lo, float hi);

/// Quantizes x[0, k) with groups of `group` into packed nibbles q[0, ceil(k/2)),
/// fp16 scales and zero points [0, ceil(k/group)). Throws woq::Error if a
/// scale overflows fp16.
void quantize_row(const float* x, std::int64_t k, std::int64_t group, std::uint8_t* q,
                  std::uint16_t* scales, std::uint8_t* zeros);

/// out[j] = (q_j - z_g) * s_g for j in [0, k), g = j / group.
void dequantize_row(const std::uint8_t* q, const std::uint16_t* scales, const std::uint8_t* zeros,
                    std::int64_t k, std::int64_t group, float* out);

}  // namespace woq::asym_int4
