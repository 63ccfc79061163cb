// IEEE 754 binary16 (fp16) and bfloat16 conversions, scalar reference.
// Both directions round to nearest, ties to even; NaN stays NaN, values past
// the fp16 range become infinity (as PyTorch's .half() does).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace woq {

/// fp32 -> fp16 bits, round to nearest even.
inline std::uint16_t fp32_to_fp16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a < 0x38800000u) {  // below 2^-14: fp16 subnormal or zero
    const float scaled = std::bit_cast<float>(a) * 16777216.0f;  // * 2^24, exact
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  a += 0xfffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<std::uint16_t>(sign | ((a - 0x38000000u) >> 13));
}

/// fp16 bits -> fp32 (exact).
inline float fp16_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// fp32 -> bfloat16 bits, round to nearest even.
inline std::uint16_t fp32_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// bfloat16 bits -> fp32 (exact).
inline float bf16_to_fp32(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

}  // namespace woq
