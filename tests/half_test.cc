#include "core/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace woq {
namespace {

TEST(Half, KnownValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);  // rounds down to the largest finite
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // the tie rounds to even = infinity
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // tie -> even (2)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(std::nanf("")))));
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::nanf("")))));
}

TEST(Half, EveryFp16RoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = fp16_to_fp32(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), bits) << std::hex << h;
    ASSERT_EQ(fp32_to_bf16(bf16_to_fp32(bits)), bits) << std::hex << h;
  }
}

// fp32 -> fp16 picks the nearer neighbour for random finite values in range.
TEST(Half, RoundsToNearest) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-26.0f, 15.9f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(exponent(rng)) * ((i & 1) ? -1.0f : 1.0f);
    const std::uint16_t h = fp32_to_fp16(x);
    const double err = std::fabs(static_cast<double>(fp16_to_fp32(h)) - x);
    for (const int step : {-1, 1}) {
      const auto other = static_cast<std::uint16_t>((h & 0x7fff) + step);
      if ((h & 0x7fff) == 0 && step < 0) continue;
      const float o = fp16_to_fp32(static_cast<std::uint16_t>(other | (h & 0x8000)));
      if (std::isinf(o)) continue;
      ASSERT_LE(err, std::fabs(static_cast<double>(o) - x)) << x;
    }
  }
}

}  // namespace
}  // namespace woq
