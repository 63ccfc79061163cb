// Round-trip and distortion tests of every low-bit codec against the rule
// stated in its header, recomputed here independently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/format_traits.h"
#include "formats/ggml_types.h"
#include "formats/group_rule.h"
#include "formats/int_matrix.h"
#include "formats/low_bit.h"

namespace woq {
namespace {

// Gaussian weights with a few outliers, as in trained checkpoints.
std::vector<float> weights(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<std::size_t>(n));
  for (auto& v : w) v = normal(rng);
  for (std::size_t i = 0; i < w.size(); i += 97) w[i] *= 8.0f;
  return w;
}

int nibble(const QuantMatrix& w, std::int64_t r, std::int64_t j) {
  const std::uint8_t b = w.data[static_cast<std::size_t>(r * w.row_bytes + j / 2)];
  return j % 2 == 0 ? b & 0xf : b >> 4;
}

struct Shape {
  std::int64_t rows, cols, group;
};

class CodecTest : public ::testing::TestWithParam<std::tuple<LowBit, Int4Range>> {};

// Every element is within half a step of its group, or is clamped exactly as
// the rule implies; the stored scale (and zero) follow the rule.
TEST_P(CodecTest, RoundTripWithinHalfStepOrClamp) {
  const auto [type, range] = GetParam();
  const std::vector<Shape> shapes = {{1, 1, 32},   {3, 33, 32},  {5, 172, 32}, {2, 172, 64},
                                     {2, 172, 128}, {4, 172, -1}, {1, 4096 + 17, 32}, {64, 96, 32},
                                     {2, 33, 2}};
  ThreadPool pool(2);
  for (const auto& s : shapes) {
    SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " g" << s.group);
    const auto x = weights(s.rows * s.cols, static_cast<std::uint32_t>(s.cols * 31 + s.rows));
    const QuantMatrix w = quantize_matrix(x.data(), s.rows, s.cols, {type, s.group, range}, &pool);
    const std::int64_t g = s.group == -1 || s.group > s.cols ? s.cols : s.group;
    ASSERT_EQ(w.group_size, g);
    ASSERT_EQ(w.groups_per_row, (s.cols + g - 1) / g);
    std::vector<float> out(static_cast<std::size_t>(s.cols));
    for (std::int64_t r = 0; r < s.rows; ++r) {
      dequantize_row(w, r, out.data());
      for (std::int64_t g0 = 0; g0 < s.cols; g0 += g) {
        const std::int64_t g1 = std::min(s.cols, g0 + g);
        const float* xg = x.data() + r * s.cols;
        float amax = 0, max = 0, lo = 0, hi = 0;
        for (std::int64_t j = g0; j < g1; ++j) {
          if (std::fabs(xg[j]) > amax) {
            amax = std::fabs(xg[j]);
            max = xg[j];
          }
          lo = std::min(lo, xg[j]);
          hi = std::max(hi, xg[j]);
        }
        const std::size_t gi = static_cast<std::size_t>(r * w.groups_per_row + g0 / g);
        const float d = fp16_to_fp32(w.scales[gi]);
        int qmin = 0, qmax = 0, zero = 0;
        if (type == LowBit::kSymInt4) {
          const bool full = range == Int4Range::kFull;
          ASSERT_EQ(w.scales[gi], fp32_to_fp16(full ? max / -8.0f : amax / 7.0f));
          qmin = full ? 0 : 1, qmax = 15, zero = 8;
        } else if (type == LowBit::kAsymInt4) {
          ASSERT_EQ(w.scales[gi], fp32_to_fp16((hi - lo) / 15.0f));
          zero = w.zeros[gi];
          ASSERT_EQ(zero, static_cast<int>(std::clamp(std::nearbyint(-lo / d), 0.0f, 15.0f)));
          qmin = 0, qmax = 15;
        } else {
          ASSERT_EQ(w.scales[gi], fp32_to_fp16(amax / 127.0f));
          qmin = -127, qmax = 127;
        }
        const float step = std::fabs(d);
        for (std::int64_t j = g0; j < g1; ++j) {
          const int q = type == LowBit::kSymInt8
                            ? static_cast<std::int8_t>(w.data[static_cast<std::size_t>(r * w.row_bytes + j)])
                            : nibble(w, r, j);
          ASSERT_GE(q, qmin);
          ASSERT_LE(q, qmax);
          const float xhat = static_cast<float>(q - zero) * d;
          ASSERT_EQ(out[static_cast<std::size_t>(j)], xhat);
          const float err = std::fabs(xg[j] - xhat);
          const float exact = xg[j] / d + static_cast<float>(zero);  // unclamped level
          if (exact > static_cast<float>(qmax) + 0.5f || exact < static_cast<float>(qmin) - 0.5f) {
            // Clamped: reconstructs the nearest end of the range, and by the
            // rule the value lies within one step beyond it.
            ASSERT_EQ(q, exact > static_cast<float>(qmax) ? qmax : qmin);
            ASSERT_LE(err, step * 1.001f) << "x=" << xg[j] << " d=" << d;
          } else {
            ASSERT_LE(err, step * 0.5f * 1.0001f + 1e-12f) << "x=" << xg[j] << " d=" << d;
          }
        }
      }
    }
  }
}

// Signal-to-noise ratio on Gaussian weights with outliers: a regression
// guard on each codec's distortion, ~0.5 dB under the measured value.
TEST_P(CodecTest, DistortionOnGaussianWeights) {
  const auto [type, range] = GetParam();
  const std::int64_t rows = 64, cols = 4096;
  const auto x = weights(rows * cols, 3);
  const QuantMatrix w = quantize_matrix(x.data(), rows, cols, {type, 32, range});
  double signal = 0, noise = 0;
  std::vector<float> out(static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    dequantize_row(w, r, out.data());
    for (std::int64_t j = 0; j < cols; ++j) {
      const double v = x[static_cast<std::size_t>(r * cols + j)];
      signal += v * v;
      noise += (v - out[static_cast<std::size_t>(j)]) * (v - out[static_cast<std::size_t>(j)]);
    }
  }
  const double snr_db = 10 * std::log10(signal / noise);
  // Clip spends one of 16 levels on nothing, so it sits ~2 dB under full range.
  // Measured: sym_int4 full 17.1, clip 16.1, asym_int4 20.1, sym_int8 41.1 dB.
  double min_db = 16.5;
  if (type == LowBit::kSymInt8) min_db = 40.0;
  if (type == LowBit::kAsymInt4) min_db = 19.5;
  if (type == LowBit::kSymInt4 && range == Int4Range::kClip) min_db = 15.5;
  std::printf("%s %s: SNR %.2f dB\n", std::string(low_bit_name(type)).c_str(),
              std::string(int4_range_name(range)).c_str(), snr_db);
  EXPECT_GT(snr_db, min_db);
}

TEST_P(CodecTest, AllZeroGroupStaysZero) {
  const auto [type, range] = GetParam();
  std::vector<float> x(70, 0.0f);
  x[65] = 0.5f;  // the second group is not zero
  const QuantMatrix w = quantize_matrix(x.data(), 1, 70, {type, 32, range});
  std::vector<float> out(70);
  dequantize_row(w, 0, out.data());
  for (int j = 0; j < 64; ++j) ASSERT_EQ(out[static_cast<std::size_t>(j)], 0.0f);
  EXPECT_NEAR(out[65], 0.5f, 0.5f / 127 + 1e-3f);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, CodecTest,
    ::testing::Values(std::make_tuple(LowBit::kSymInt4, Int4Range::kFull),
                      std::make_tuple(LowBit::kSymInt4, Int4Range::kClip),
                      std::make_tuple(LowBit::kAsymInt4, Int4Range::kFull),
                      std::make_tuple(LowBit::kSymInt8, Int4Range::kFull)),
    [](const auto& param_info) {
      return std::string(low_bit_name(std::get<0>(param_info.param))) +
             (std::get<0>(param_info.param) == LowBit::kSymInt4 ? "_" + std::string(int4_range_name(std::get<1>(param_info.param))) : "");
    });

TEST(Codec, FloatFormatsRoundTrip) {
  const auto x = weights(3 * 37, 5);
  for (const LowBit type : {LowBit::kFp32, LowBit::kFp16, LowBit::kBf16}) {
    const QuantMatrix w = quantize_matrix(x.data(), 3, 37, {type, 32, Int4Range::kFull});
    std::vector<float> out(37);
    for (std::int64_t r = 0; r < 3; ++r) {
      dequantize_row(w, r, out.data());
      for (std::int64_t j = 0; j < 37; ++j) {
        const float v = x[static_cast<std::size_t>(r * 37 + j)];
        const float want = type == LowBit::kFp32   ? v
                           : type == LowBit::kFp16 ? fp16_to_fp32(fp32_to_fp16(v))
                                                   : bf16_to_fp32(fp32_to_bf16(v));
        ASSERT_EQ(out[static_cast<std::size_t>(j)], want);
      }
    }
  }
}

// round_even, the rounding of every integer codec, is std::nearbyint (to nearest, ties to even) bit for bit:
// a sweep of every 61st float (all exponents, both signs), the halves around 0 to 2^24, and the special values.
TEST(Codec, RoundEvenIsNearbyintBitForBit) {
  const auto same = [](float x) {
    const float got = round_even(x), want = std::nearbyint(x);
    return std::isnan(want) ? std::isnan(got) : std::memcmp(&got, &want, sizeof got) == 0;
  };
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 61) {
    const std::uint32_t bits = static_cast<std::uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, sizeof x);
    ASSERT_TRUE(same(x)) << std::hex << bits;
  }
  for (float h = 0.5f; h < 16777216.0f; h = h < 64.0f ? h + 1.0f : h * 1.5f + 0.5f)
    for (const float x : {h, -h, std::nextafter(h, 0.0f), std::nextafter(h, 1e30f), -std::nextafter(h, 0.0f)})
      ASSERT_TRUE(same(x)) << x;
  for (const float x : {0.0f, -0.0f, 8388607.5f, 8388608.0f, -8388609.0f, std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                        std::nanf("")})
    ASSERT_TRUE(same(x)) << x;
}

// quantize_matrix stores, for every value, its group's rule applied on its own (std::nearbyint(x / d) + zero,
// clamped): the codecs' chunked, vectorized rounding and nibble packing, on ragged groups and odd row lengths.
TEST(Codec, EveryStoredIntegerIsItsValuesRule) {
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kAsymInt4, LowBit::kSymInt8})
    for (const Int4Range range : {Int4Range::kFull, Int4Range::kClip})
      for (const Shape s : {Shape{3, 101, -1}, Shape{2, 100, 48}, Shape{4, 96, 32}, Shape{2, 7, 2}, Shape{1, 600, -1}}) {
        if (range == Int4Range::kClip && type != LowBit::kSymInt4) continue;
        const std::vector<float> w = weights(s.rows * s.cols, 11);
        const QuantMatrix q = quantize_matrix(w.data(), s.rows, s.cols, {type, s.group, range});
        const std::int64_t g_len = s.group < 0 ? s.cols : s.group;
        for (std::int64_t r = 0; r < s.rows; ++r)
          for (std::int64_t c0 = 0; c0 < s.cols; c0 += g_len) {
            const std::int64_t len = std::min(g_len, s.cols - c0);
            const float* x = w.data() + r * s.cols + c0;
            const GroupRule rule = fit_group(type, range, x, len);
            const float d = rule.step();
            for (std::int64_t j = 0; j < len; ++j) {
              const int want = d == 0.0f ? rule.zero
                                         : static_cast<int>(std::clamp(std::nearbyint(x[j] / d) + static_cast<float>(rule.zero),
                                                                       static_cast<float>(rule.lo), static_cast<float>(rule.hi)));
              const int got = type == LowBit::kSymInt8
                                  ? static_cast<std::int8_t>(q.data[static_cast<std::size_t>(r * q.row_bytes + c0 + j)])
                                  : nibble(q, r, c0 + j);
              ASSERT_EQ(got, want) << low_bit_name(type) << " " << s.cols << "/" << s.group << " at " << r << ","
                                   << c0 + j;
            }
          }
      }
}

TEST(Codec, RejectsBadInput) {
  std::vector<float> x(64, 0.01f);
  EXPECT_THROW(quantize_matrix(x.data(), 1, 64, {LowBit::kSymInt4, 3, Int4Range::kFull}), Error);
  EXPECT_THROW(quantize_matrix(x.data(), 1, 64, {LowBit::kSymInt8, 0, Int4Range::kFull}), Error);
  EXPECT_THROW(quantize_matrix(x.data(), 0, 64, {LowBit::kSymInt8, 32, Int4Range::kFull}), Error);
  x[40] = std::nanf("");
  try {
    quantize_matrix(x.data(), 2, 32, {LowBit::kSymInt4, 32, Int4Range::kFull});
    FAIL() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1, column 8"), std::string::npos) << e.what();
  }
  x[40] = 1e7f;  // scale 1e7/8 overflows fp16
  EXPECT_THROW(quantize_matrix(x.data(), 2, 32, {LowBit::kSymInt4, 32, Int4Range::kFull}), Error);
  EXPECT_THROW(parse_low_bit("int3"), Error);
  EXPECT_EQ(parse_low_bit("asym_int4"), LowBit::kAsymInt4);
}

// The traits table: one row per LowBit in order, found by its name in any case.
TEST(FormatTraits, OneRowPerFormatFoundByName) {
  ASSERT_EQ(weight_formats().size(), kFormatCount);
  for (const FormatTraits& f : weight_formats()) {
    EXPECT_EQ(&format_traits(f.type), &f);
    std::string upper(f.name);
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(parse_low_bit(upper), f.type) << f.name;
    EXPECT_EQ(low_bit_name(f.type), f.name);
  }
  EXPECT_EQ(find_format("q4_k_m"), nullptr);
}

// A format's ggml column names the ggml type whose blocks hold the same
// values: woq's rows (ggml rounding where woq has its own) decode to what
// ggml's own quantizer and dequantizer give, in the same number of bytes.
TEST(FormatTraits, GgmlColumnHoldsTheSameValuesInTheSameBytes) {
  constexpr std::int64_t kRows = 3, kCols = 768;
  const std::vector<float> x = weights(kRows * kCols, 11);
  int checked = 0;
  for (const FormatTraits& f : weight_formats()) {
    if (!f.ggml) continue;
    const GgmlTypeTraits& g = ggml_type_traits(*f.ggml);
    QuantSpec spec{f.type, 32};
    if (f.family == FormatFamily::kGrouped) spec.rounding = Rounding::kGgml;
    const QuantMatrix w = quantize_matrix(x.data(), kRows, kCols, spec);
    EXPECT_EQ(static_cast<std::int64_t>(w.bytes()), kRows * ggml_row_bytes(g, kCols)) << f.name;
    std::vector<std::uint8_t> blocks(static_cast<std::size_t>(ggml_row_bytes(g, kCols)));
    std::vector<float> ours(kCols), theirs(kCols);
    for (std::int64_t r = 0; r < kRows; ++r) {
      g.from_float(x.data() + r * kCols, kCols, blocks.data());
      g.to_float(blocks.data(), theirs.data(), kCols);
      dequantize_row(w, r, ours.data());
      for (std::int64_t j = 0; j < kCols; ++j)
        ASSERT_EQ(ours[static_cast<std::size_t>(j)], theirs[static_cast<std::size_t>(j)]) << f.name << " " << r << "," << j;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 12);  // all but asym_int4
}

// value_bits and fixed_zero describe the integers GPTQ checkpoints store:
// (q - zero) · scale of to_int_matrix is the dequantized weight.
TEST(FormatTraits, IntegerColumnsAreTheCheckpointIntegers) {
  constexpr std::int64_t kRows = 4, kCols = 96;
  const std::vector<float> x = weights(kRows * kCols, 12);
  for (const FormatTraits& f : weight_formats()) {
    if (f.family != FormatFamily::kGrouped) continue;
    const QuantMatrix w = quantize_matrix(x.data(), kRows, kCols, QuantSpec{f.type, 32});
    const IntMatrix m = to_int_matrix(w);
    EXPECT_EQ(m.bits, f.value_bits) << f.name;
    std::vector<float> row(kCols);
    for (std::int64_t r = 0; r < kRows; ++r) {
      dequantize_row(w, r, row.data());
      for (std::int64_t k = 0; k < kCols; ++k) {
        const std::size_t g = static_cast<std::size_t>(r * m.groups + m.g_idx[static_cast<std::size_t>(k)]);
        if (f.fixed_zero >= 0) {
          EXPECT_EQ(m.zero[g], f.fixed_zero) << f.name;
        }
        const int q = m.q[static_cast<std::size_t>(r * kCols + k)];
        EXPECT_EQ(static_cast<float>(q - m.zero[g]) * fp16_to_fp32(m.scale[g]), row[static_cast<std::size_t>(k)])
            << f.name << " " << r << "," << k;
      }
    }
  }
}

}  // namespace
}  // namespace woq
