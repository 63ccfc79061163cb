// ggml types against ggml itself: the traits table, every dequantizer and the
// Q4_0/Q8_0 reference quantizers are compared bit for bit with what ggml's
// own code produced for the fixtures in tests/data/ggml (see its README); the
// Q4_0/Q8_0 <-> sym_int4/sym_int8 converters against woq's own codecs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "formats/ggml_types.h"
#include "formats/sym_int4.h"
#include "formats/sym_int8.h"
#include "ggml_fixture.h"
#include "test_files.h"

namespace woq {
namespace {

using test::bits;
using test::first_difference;
using test::Fixture;
using test::kGgmlDir;
using test::load;

// ---- traits ----------------------------------------------------------------

TEST(GgmlTypes, TraitsMatchGgml) {
  std::ifstream in(kGgmlDir + "traits.tsv");
  ASSERT_TRUE(in) << kGgmlDir << "traits.tsv";
  std::string line;
  std::size_t rows = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::uint32_t number = 0;
    std::string name;
    std::int64_t block = 0, size = 0;
    ASSERT_TRUE(fields >> number >> name >> block >> size) << line;
    const GgmlTypeTraits* t = find_ggml_type(number);
    ASSERT_NE(t, nullptr) << "ggml type " << number << " (" << name << ") missing";
    EXPECT_EQ(static_cast<std::uint32_t>(t->type), number);
    EXPECT_EQ(t->name, name) << number;
    EXPECT_EQ(t->block_size, block) << name;
    EXPECT_EQ(t->type_size, size) << name;
    EXPECT_EQ(&ggml_type_traits(t->type), t);
    ++rows;
  }
  EXPECT_EQ(rows, ggml_types().size()) << "woq lists types ggml does not have";
  for (std::size_t i = 1; i < ggml_types().size(); ++i)
    EXPECT_LT(static_cast<std::uint32_t>(ggml_types()[i - 1].type), static_cast<std::uint32_t>(ggml_types()[i].type));
  for (const std::uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 39u, 1000u})
    EXPECT_EQ(find_ggml_type(removed), nullptr) << removed;
  EXPECT_THROW(ggml_type_traits(static_cast<GgmlType>(4)), Error);
  EXPECT_EQ(ggml_row_bytes(ggml_type_traits(GgmlType::kQ6_K), 512), 420);
  EXPECT_EQ(ggml_row_bytes(ggml_type_traits(GgmlType::kBF16), 3), 6);
}

TEST(GgmlTypes, DecodableTypes) {
  const std::vector<GgmlType> decodable = {
      GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kF64,  GgmlType::kQ4_0,
      GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K,
      GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K, GgmlType::kIQ4_NL};
  for (const GgmlTypeTraits& t : ggml_types()) {
    const bool want = std::find(decodable.begin(), decodable.end(), t.type) != decodable.end();
    EXPECT_EQ(t.to_float != nullptr, want) << t.name;
  }
}

TEST(GgmlTypes, ClosestFollowsTheQuantWidthRule) {
  const std::map<std::string, LowBit> want = {
      {"f32", LowBit::kFp32},      {"f16", LowBit::kFp16},      {"bf16", LowBit::kBf16},
      {"f64", LowBit::kFp32},      {"i8", LowBit::kFp32},       {"i16", LowBit::kFp32},
      {"i32", LowBit::kFp32},      {"i64", LowBit::kFp32},      {"q4_0", LowBit::kSymInt4},
      {"q4_1", LowBit::kSymInt4},  {"q2_K", LowBit::kSymInt4},  {"q3_K", LowBit::kSymInt4},
      {"q4_K", LowBit::kSymInt4},  {"q5_0", LowBit::kSymInt8},  {"q5_1", LowBit::kSymInt8},
      {"q5_K", LowBit::kSymInt8},  {"q6_K", LowBit::kSymInt8},  {"q8_0", LowBit::kSymInt8},
      {"q8_1", LowBit::kSymInt8},  {"q8_K", LowBit::kSymInt8},  {"iq2_xxs", LowBit::kSymInt4},
      {"iq2_xs", LowBit::kSymInt4}, {"iq3_xxs", LowBit::kSymInt4}, {"iq1_s", LowBit::kSymInt4},
      {"iq4_nl", LowBit::kSymInt4}, {"iq3_s", LowBit::kSymInt4},  {"iq2_s", LowBit::kSymInt4},
      {"iq4_xs", LowBit::kSymInt4}, {"iq1_m", LowBit::kSymInt4},  {"tq1_0", LowBit::kSymInt4},
      {"tq2_0", LowBit::kSymInt4}};
  EXPECT_EQ(want.size(), ggml_types().size());
  for (const GgmlTypeTraits& t : ggml_types()) {
    const auto it = want.find(std::string(t.name));
    ASSERT_NE(it, want.end()) << t.name;
    EXPECT_EQ(t.closest, it->second) << t.name;
  }
}

// ---- dequantizers ----------------------------------------------------------

class GgmlToFloat : public ::testing::TestWithParam<std::string> {};

// woq's to_float equals ggml's, bit for bit, on ggml's own quantization of
// the fixture weights (outliers, all-equal, negative-max, zero, tie and tiny
// blocks) and on random block bytes (every scale, min and quant bit pattern).
TEST_P(GgmlToFloat, MatchesGgmlBitForBit) {
  const Fixture f = load(GetParam());
  const GgmlTypeTraits& t = *find_ggml_type(f.type);
  ASSERT_EQ(t.name, GetParam());
  ASSERT_NE(t.to_float, nullptr);
  std::vector<float> y(f.y.size(), -1.0f), yr(f.yr.size(), -1.0f);
  t.to_float(f.q.data(), y.data(), f.n);
  t.to_float(f.r.data(), yr.data(), f.nr);
  std::int64_t i = first_difference(y, f.y);
  EXPECT_EQ(i, -1) << GetParam() << " quantized weights, element " << i << ": woq " << y[static_cast<std::size_t>(i)]
                   << " ggml " << f.y[static_cast<std::size_t>(i)];
  i = first_difference(yr, f.yr);
  EXPECT_EQ(i, -1) << GetParam() << " random bytes, element " << i << ": woq " << yr[static_cast<std::size_t>(i)]
                   << " ggml " << f.yr[static_cast<std::size_t>(i)];
  // The fixture exercises something: many distinct values.
  for (std::vector<float> distinct : {f.y, f.yr}) {
    std::sort(distinct.begin(), distinct.end());
    EXPECT_GT(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 16);
  }
}

TEST(GgmlTypes, ToFloatRejectsPartialBlocks) {
  for (const GgmlTypeTraits& t : ggml_types()) {
    if (t.to_float == nullptr || t.block_size == 1) continue;
    std::vector<std::uint8_t> blocks(static_cast<std::size_t>(t.type_size) * 2);
    std::vector<float> y(static_cast<std::size_t>(t.block_size) * 2);
    EXPECT_THROW(t.to_float(blocks.data(), y.data(), t.block_size + 1), Error) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgmlToFloat,
                         ::testing::Values("f16", "bf16", "f64", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K",
                                           "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq4_nl"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(GgmlTypes, F32ToFloatIsTheBytes) {
  const std::vector<std::uint32_t> words = {0x00000000u, 0x80000000u, 0x3f800000u, 0x7f800001u, 0xffc12345u,
                                            0x00000001u, 0x7f7fffffu, 0xc2f6e979u};
  std::vector<std::uint8_t> bytes;
  for (const std::uint32_t w : words)
    for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<std::uint8_t>(w >> (8 * k)));
  std::vector<float> y(words.size());
  ggml_type_traits(GgmlType::kF32).to_float(bytes.data(), y.data(), static_cast<std::int64_t>(y.size()));
  for (std::size_t i = 0; i < words.size(); ++i) EXPECT_EQ(bits(y[i]), words[i]) << i;
}

// ---- ggml's reference quantizers ---------------------------------------------

TEST(GgmlQuantize, Q4_0IsGgmlsReference) {
  const Fixture f = load("q4_0");
  std::vector<std::uint8_t> q(f.q.size());
  ggml::quantize_q4_0_ggml(f.x.data(), f.n, q.data());
  const std::int64_t i = first_difference(q, f.q);
  EXPECT_EQ(i, -1) << "block " << i / ggml::kQ4_0Bytes << " byte " << i % ggml::kQ4_0Bytes;

  // The fixture tells ggml's rule from woq's own sym_int4 rule (which divides
  // by the fp16 d and rounds half to even): some blocks come out differently.
  std::vector<std::uint8_t> woq_q(static_cast<std::size_t>(f.n / 2));
  std::vector<std::uint16_t> woq_scales(static_cast<std::size_t>(f.n / 32));
  sym_int4::quantize_row(f.x.data(), f.n, 32, Int4Range::kFull, woq_q.data(), woq_scales.data());
  std::vector<std::uint8_t> as_q4_0(f.q.size());
  ggml::q4_0_from_sym_int4(woq_q.data(), woq_scales.data(), f.n, as_q4_0.data());
  EXPECT_NE(first_difference(as_q4_0, f.q), -1);
}

TEST(GgmlQuantize, Q8_0IsGgmlsReference) {
  const Fixture f = load("q8_0");
  std::vector<std::uint8_t> q(f.q.size());
  ggml::quantize_q8_0_ggml(f.x.data(), f.n, q.data());
  const std::int64_t i = first_difference(q, f.q);
  EXPECT_EQ(i, -1) << "block " << i / ggml::kQ8_0Bytes << " byte " << i % ggml::kQ8_0Bytes;

  std::vector<std::int8_t> woq_q(static_cast<std::size_t>(f.n));
  std::vector<std::uint16_t> woq_scales(static_cast<std::size_t>(f.n / 32));
  sym_int8::quantize_row(f.x.data(), f.n, 32, woq_q.data(), woq_scales.data());
  std::vector<std::uint8_t> as_q8_0(f.q.size());
  ggml::q8_0_from_sym_int8(woq_q.data(), woq_scales.data(), f.n, as_q8_0.data());
  EXPECT_NE(first_difference(as_q8_0, f.q), -1) << "the ties (k + 0.5 with d = 1) should round differently";
}

// Every type woq writes: from_float gives the bytes ggml's from_float_ref
// wrote for the fixture weights (outliers, all-equal, negative-max, zero,
// tie and tiny blocks), and the types woq does not write have none.
class GgmlFromFloat : public ::testing::TestWithParam<std::string> {};

TEST_P(GgmlFromFloat, MatchesGgmlByteForByte) {
  const Fixture f = load(GetParam());
  const GgmlTypeTraits& t = *find_ggml_type(f.type);
  ASSERT_NE(t.from_float, nullptr) << t.name;
  std::vector<std::uint8_t> q(f.q.size(), 0xAA);
  t.from_float(f.x.data(), f.n, q.data());
  const std::int64_t i = first_difference(q, f.q);
  EXPECT_EQ(i, -1) << t.name << " block " << i / t.type_size << " byte " << i % t.type_size << ": woq "
                   << int(q[static_cast<std::size_t>(i)]) << " ggml " << int(f.q[static_cast<std::size_t>(i)]);
}

INSTANTIATE_TEST_SUITE_P(Types, GgmlFromFloat,
                         ::testing::Values("f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K",
                                           "q4_K", "q5_K", "q6_K", "iq4_nl"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(GgmlQuantize, FromFloatRefusesNonFiniteAndPartialBlocks) {
  std::size_t writers = 0;
  for (const GgmlTypeTraits& t : ggml_types()) {
    if (t.from_float == nullptr) continue;
    ++writers;
    if (t.block_size == 1) continue;  // f32/f16/bf16 carry NaN as a value
    std::vector<float> x(static_cast<std::size_t>(2 * t.block_size), 0.25f);
    std::vector<std::uint8_t> blocks(static_cast<std::size_t>(2 * t.type_size));
    EXPECT_NO_THROW(t.from_float(x.data(), 2 * t.block_size, blocks.data())) << t.name;
    EXPECT_THROW(t.from_float(x.data(), t.block_size + 1, blocks.data()), Error) << t.name;
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 1e9f}) {
      x[static_cast<std::size_t>(t.block_size) + 3] = bad;
      EXPECT_THROW(t.from_float(x.data(), 2 * t.block_size, blocks.data()), Error) << t.name << " " << bad;
    }
  }
  EXPECT_EQ(writers, 14u);  // f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K ... q6_K iq4_nl
}

// q8_0, q5_0 and iq4_nl blocks as sym_int8 group 32: int8 q times the fp16 scale is ggml's dequantized
// value, bit for bit, on ggml's quantized weights and on random blocks.
TEST(GgmlTypes, ToInt8IsLossless) {
  std::size_t lossless = 0;
  for (const char* name : {"q8_0", "q5_0", "iq4_nl"}) {
    const Fixture f = load(name);
    const GgmlTypeTraits& t = *find_ggml_type(f.type);
    ASSERT_NE(t.to_int8, nullptr) << name;
    ++lossless;
    for (const auto& [blocks, n, want] : {std::tuple{&f.q, f.n, &f.y}, std::tuple{&f.r, f.nr, &f.yr}}) {
      std::vector<std::int8_t> q(static_cast<std::size_t>(n));
      std::vector<std::uint16_t> scales(static_cast<std::size_t>(n / 32));
      EXPECT_TRUE(t.to_int8(blocks->data(), n, q.data(), scales.data())) << name;
      std::vector<float> got(static_cast<std::size_t>(n));
      sym_int8::dequantize_row(q.data(), scales.data(), n, 32, got.data());
      const std::int64_t i = first_difference(got, *want);
      EXPECT_EQ(i, -1) << name << " element " << i;
    }
  }
  std::size_t with = 0;
  for (const GgmlTypeTraits& t : ggml_types()) with += t.to_int8 != nullptr;
  EXPECT_EQ(with, lossless);
}

TEST(GgmlQuantize, RefusesWhatGgmlCannotQuantize) {
  std::vector<float> x(32, 0.5f);
  std::vector<std::uint8_t> blocks(64);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e7f}) {
    x[7] = bad;
    EXPECT_THROW(ggml::quantize_q4_0_ggml(x.data(), 32, blocks.data()), Error) << bad;
    EXPECT_THROW(ggml::quantize_q8_0_ggml(x.data(), 32, blocks.data()), Error) << bad;
  }
  x[7] = 0.5f;
  EXPECT_THROW(ggml::quantize_q4_0_ggml(x.data(), 16, blocks.data()), Error);
  EXPECT_THROW(ggml::quantize_q8_0_ggml(x.data(), 16, blocks.data()), Error);
}

// Scales so small that 1/d overflows (ggml's behaviour is undefined there):
// d is stored as zero, so the block must decode to zeros.
TEST(GgmlQuantize, SubnormalBlocksDecodeToZero) {
  std::vector<float> x(32);
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(static_cast<int>(j) - 13) * 1e-40f;
  for (const GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    std::vector<std::uint8_t> blocks(34);
    if (type == GgmlType::kQ4_0) ggml::quantize_q4_0_ggml(x.data(), 32, blocks.data());
    else ggml::quantize_q8_0_ggml(x.data(), 32, blocks.data());
    std::vector<float> y(32, 1.0f);
    ggml_type_traits(type).to_float(blocks.data(), y.data(), 32);
    for (const float v : y) EXPECT_EQ(v, 0.0f);
  }
}

// ---- converters ----------------------------------------------------------------

constexpr std::int64_t kK = 32 * 7;  // an odd number of blocks

TEST(GgmlConvert, SymInt4RoundTripsThroughQ4_0) {
  const Fixture f = load("q4_0");  // its weights: outliers, ties, all-equal, negative-max, zero blocks
  for (const Int4Range range : {Int4Range::kFull, Int4Range::kClip}) {
    std::vector<std::uint8_t> q(kK / 2), back(kK / 2, 0xAA);
    std::vector<std::uint16_t> scales(kK / 32), back_scales(kK / 32, 0xAAAA);
    sym_int4::quantize_row(f.x.data(), kK, 32, range, q.data(), scales.data());
    std::vector<std::uint8_t> blocks(static_cast<std::size_t>(kK / 32 * ggml::kQ4_0Bytes));
    ggml::q4_0_from_sym_int4(q.data(), scales.data(), kK, blocks.data());
    ggml::sym_int4_from_q4_0(blocks.data(), kK, back.data(), back_scales.data());
    EXPECT_EQ(back, q);
    EXPECT_EQ(back_scales, scales);

    std::vector<float> want(kK), got(kK);
    sym_int4::dequantize_row(q.data(), scales.data(), kK, 32, want.data());
    ggml_type_traits(GgmlType::kQ4_0).to_float(blocks.data(), got.data(), kK);
    const std::int64_t i = first_difference(got, want);
    EXPECT_EQ(i, -1) << "element " << i;
  }
}

// ggml's own Q4_0 blocks, read as sym_int4, decode to what ggml decodes them to.
TEST(GgmlConvert, GgmlQ4_0BlocksReadAsSymInt4) {
  const Fixture f = load("q4_0");
  std::vector<std::uint8_t> q(static_cast<std::size_t>(f.n / 2));
  std::vector<std::uint16_t> scales(static_cast<std::size_t>(f.n / 32));
  ggml::sym_int4_from_q4_0(f.q.data(), f.n, q.data(), scales.data());
  std::vector<float> got(static_cast<std::size_t>(f.n));
  sym_int4::dequantize_row(q.data(), scales.data(), f.n, 32, got.data());
  const std::int64_t i = first_difference(got, f.y);
  EXPECT_EQ(i, -1) << "element " << i;
  std::vector<std::uint8_t> again(f.q.size());
  ggml::q4_0_from_sym_int4(q.data(), scales.data(), f.n, again.data());
  EXPECT_EQ(again, f.q);
}

TEST(GgmlConvert, SymInt8RoundTripsThroughQ8_0) {
  const Fixture f = load("q8_0");
  std::vector<std::int8_t> q(kK), back(kK, 99);
  std::vector<std::uint16_t> scales(kK / 32), back_scales(kK / 32, 0xAAAA);
  sym_int8::quantize_row(f.x.data(), kK, 32, q.data(), scales.data());
  std::vector<std::uint8_t> blocks(static_cast<std::size_t>(kK / 32 * ggml::kQ8_0Bytes));
  ggml::q8_0_from_sym_int8(q.data(), scales.data(), kK, blocks.data());
  EXPECT_TRUE(ggml::sym_int8_from_q8_0(blocks.data(), kK, back.data(), back_scales.data()));
  EXPECT_EQ(back, q);
  EXPECT_EQ(back_scales, scales);

  std::vector<float> want(kK), got(kK);
  sym_int8::dequantize_row(q.data(), scales.data(), kK, 32, want.data());
  ggml_type_traits(GgmlType::kQ8_0).to_float(blocks.data(), got.data(), kK);
  const std::int64_t i = first_difference(got, want);
  EXPECT_EQ(i, -1) << "element " << i;
}

TEST(GgmlConvert, GgmlQ8_0BlocksReadAsSymInt8) {
  const Fixture f = load("q8_0");
  std::vector<std::int8_t> q(static_cast<std::size_t>(f.n));
  std::vector<std::uint16_t> scales(static_cast<std::size_t>(f.n / 32));
  EXPECT_TRUE(ggml::sym_int8_from_q8_0(f.q.data(), f.n, q.data(), scales.data()));
  std::vector<float> got(static_cast<std::size_t>(f.n));
  sym_int8::dequantize_row(q.data(), scales.data(), f.n, 32, got.data());
  EXPECT_EQ(first_difference(got, f.y), -1);

  // A block holding -128 (valid Q8_0, outside sym_int8's range) is reported, and still copied.
  std::vector<std::uint8_t> blocks(f.q.begin(), f.q.begin() + 3 * ggml::kQ8_0Bytes);
  std::vector<std::int8_t> q3(96);
  std::vector<std::uint16_t> s3(3);
  EXPECT_TRUE(ggml::sym_int8_from_q8_0(blocks.data(), 96, q3.data(), s3.data()));
  blocks[2 * ggml::kQ8_0Bytes + 2 + 5] = 0x80;
  EXPECT_FALSE(ggml::sym_int8_from_q8_0(blocks.data(), 96, q3.data(), s3.data()));
  EXPECT_EQ(q3[64 + 5], -128);
  std::vector<std::uint8_t> again(blocks.size());
  ggml::q8_0_from_sym_int8(q3.data(), s3.data(), 96, again.data());
  EXPECT_EQ(again, blocks);
}

TEST(GgmlConvert, RejectsPartialBlocks) {
  std::vector<std::uint8_t> bytes(64);
  std::vector<std::int8_t> q8(64);
  std::vector<std::uint16_t> scales(2);
  EXPECT_THROW(ggml::q4_0_from_sym_int4(bytes.data(), scales.data(), 48, bytes.data()), Error);
  EXPECT_THROW(ggml::sym_int4_from_q4_0(bytes.data(), 48, bytes.data(), scales.data()), Error);
  EXPECT_THROW(ggml::q8_0_from_sym_int8(q8.data(), scales.data(), 48, bytes.data()), Error);
  EXPECT_THROW(ggml::sym_int8_from_q8_0(bytes.data(), 48, q8.data(), scales.data()), Error);
}

}  // namespace
}  // namespace woq
