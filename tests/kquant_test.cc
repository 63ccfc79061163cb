// K-quant dot products against ggml itself: ggml's Q8_K quantizer and
// ggml_vec_dot_q<N>_K_q8_K (llama.cpp c392e5094's libggml-cpu, x86 AVX2
// branch) produced tests/data/ggml/q8_K.bin and q<N>_K_dot.bin (README
// there); woq's quantizer and every ISA's kernel must give their bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/half.h"
#include "formats/ggml_types.h"
#include "formats/kquant.h"
#include "ggml_fixture.h"
#include "core/thread_pool.h"
#include "kernels/kquant_dot.h"
#include "kernels/matmul.h"
#include "test_files.h"

namespace woq {
namespace {

using kquant::kQ8KBytes;
using kquant::kSuperBlock;

TEST(KQuant, Q8KIsGgmlsReference) {
  const test::Fixture f = test::load("q8_K");
  std::vector<std::uint8_t> q(f.q.size());
  kquant::quantize_q8_k(f.x.data(), f.n, q.data());
  // ggml leaves an all-zero block's bsums unwritten; compare them only where d != 0.
  for (std::int64_t b = 0; b < f.n / kSuperBlock; ++b) {
    const std::size_t at = static_cast<std::size_t>(b * kQ8KBytes);
    float d;
    std::memcpy(&d, f.q.data() + at, 4);
    const std::size_t len = d == 0.0f ? 4 + kSuperBlock : kQ8KBytes;
    EXPECT_EQ(std::memcmp(q.data() + at, f.q.data() + at, len), 0) << "block " << b;
  }
}

// One tests/data/ggml/<type>_dot.bin: "WOQFIX02"; u32 magic, type, n, rows, inputs, row bytes; the
// weight rows; then per input: x[n] f32, ggml's Q8_K blocks of x, and ggml's vec_dot of each row.
struct DotFixture {
  std::int64_t n = 0, rows = 0, row_bytes = 0;
  std::vector<std::uint8_t> w;
  std::vector<std::vector<float>> x, dots;
  std::vector<std::vector<std::uint8_t>> a;
};

DotFixture load_dot(const std::string& name) {
  std::uint32_t hdr[6];
  test::FixtureReader in(name + "_dot.bin", "WOQFIX02", hdr, 6);
  const auto take = [&](void* out, std::size_t len) { in.take(out, len); };
  DotFixture f;
  f.n = hdr[2];
  f.rows = hdr[3];
  f.row_bytes = hdr[5];
  f.w.resize(static_cast<std::size_t>(f.rows * f.row_bytes));
  take(f.w.data(), f.w.size());
  for (std::uint32_t i = 0; i < hdr[4]; ++i) {
    f.x.emplace_back(static_cast<std::size_t>(f.n));
    take(f.x.back().data(), f.x.back().size() * 4);
    f.a.emplace_back(static_cast<std::size_t>(f.n / kSuperBlock * kQ8KBytes));
    take(f.a.back().data(), f.a.back().size());
    f.dots.emplace_back(static_cast<std::size_t>(f.rows));
    take(f.dots.back().data(), f.dots.back().size() * 4);
  }
  in.finish();
  return f;
}

class KQuantDotTest : public ::testing::TestWithParam<LowBit> {};

// kquant_dot of `isa` for one token.
float dot_one(LowBit type, Isa isa, const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  float out = 0.0f;
  kquant_dot(type, isa)(w, a, 0, 1, blocks, &out);
  return out;
}

// Rows quantized by ggml from weights with outliers and rows of random bytes (every scale, min and
// quant bit pattern), against inputs with outliers, an all-zero super-block and tiny values.
TEST_P(KQuantDotTest, EveryIsaEqualsGgmlsVecDot) {
  const kquant::Format& format = *kquant::find(GetParam());
  const DotFixture f = load_dot(std::string(ggml_type_traits(format.ggml).name));
  ASSERT_EQ(f.row_bytes, f.n / kSuperBlock * format.block_bytes);
  for (std::size_t i = 0; i < f.x.size(); ++i) {
    std::vector<std::uint8_t> a(f.a[i].size());
    kquant::quantize_q8_k(f.x[i].data(), f.n, a.data());
    ASSERT_EQ(a, f.a[i]) << "input " << i;
    for (const Isa isa : available_isas()) {
      for (std::int64_t r = 0; r < f.rows; ++r) {
        const float got = dot_one(format.type, isa, f.w.data() + r * f.row_bytes, a.data(), f.n / kSuperBlock);
        EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(f.dots[i][static_cast<std::size_t>(r)]))
            << format.name << " " << isa_name(isa) << " input " << i << " row " << r << ": woq " << got << " ggml "
            << f.dots[i][static_cast<std::size_t>(r)];
      }
    }
  }
}

// The reference is the dot product of what the blocks hold: against f64 sums of ggml's dequantized
// weights times the dequantized activations (so a wrong layout fails here too, not only bitwise).
TEST_P(KQuantDotTest, ReferenceIsTheDotProductOfTheDequantizedValues) {
  const kquant::Format& format = *kquant::find(GetParam());
  const GgmlTypeTraits& traits = ggml_type_traits(format.ggml);
  const DotFixture f = load_dot(std::string(traits.name));
  std::vector<float> w(static_cast<std::size_t>(f.n)), a(static_cast<std::size_t>(f.n));
  for (std::size_t i = 0; i < f.x.size(); ++i) {
    ggml_type_traits(GgmlType::kQ8_K).to_float(f.a[i].data(), a.data(), f.n);
    for (std::int64_t r = 0; r < f.rows; ++r) {
      traits.to_float(f.w.data() + r * f.row_bytes, w.data(), f.n);
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t k = 0; k < f.n; ++k) {
        sum += static_cast<double>(w[static_cast<std::size_t>(k)]) * a[static_cast<std::size_t>(k)];
        magnitude += std::fabs(static_cast<double>(w[static_cast<std::size_t>(k)]) * a[static_cast<std::size_t>(k)]);
      }
      const float got = kquant_dot_reference(format.type, f.w.data() + r * f.row_bytes, f.a[i].data(), f.n / kSuperBlock);
      EXPECT_NEAR(got, sum, 1e-5 * magnitude + 1e-30) << format.name << " input " << i << " row " << r;
    }
  }
}

// `blocks` super-blocks of `format` of random bytes (every quant, scale and min pattern) with finite
// fp16 super-scales N(0, 0.01).
std::vector<std::uint8_t> random_blocks(const kquant::Format& format, std::int64_t blocks, std::mt19937& rng) {
  std::vector<std::uint8_t> w(static_cast<std::size_t>(blocks * format.block_bytes));
  for (auto& b : w) b = static_cast<std::uint8_t>(rng());
  std::normal_distribution<float> normal(0.0f, 0.01f);
  const bool q45 = format.type == LowBit::kQ4_K || format.type == LowBit::kQ5_K;
  const std::int64_t d_at = q45 ? 0 : format.block_bytes - (format.type == LowBit::kQ2_K ? 4 : 2);
  const int scales = format.type == LowBit::kQ3_K || format.type == LowBit::kQ6_K ? 1 : 2;
  for (std::int64_t b = 0; b < blocks; ++b)
    for (int j = 0; j < scales; ++j) {
      const std::uint16_t h = fp32_to_fp16(normal(rng));
      std::memcpy(w.data() + b * format.block_bytes + d_at + 2 * j, &h, 2);
    }
  return w;
}

// Long rows (Llama's K = 11008: 43 super-blocks).
TEST_P(KQuantDotTest, EveryIsaEqualsTheReferenceOnLongRows) {
  const kquant::Format& format = *kquant::find(GetParam());
  const std::int64_t k = 11008, blocks = k / kSuperBlock;
  std::mt19937 rng(7);
  const std::vector<std::uint8_t> w = random_blocks(format, blocks, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(k));
  for (float& v : x) v = normal(rng);
  std::vector<std::uint8_t> a(static_cast<std::size_t>(blocks * kQ8KBytes));
  kquant::quantize_q8_k(x.data(), k, a.data());
  const float ref = kquant_dot_reference(format.type, w.data(), a.data(), blocks);
  ASSERT_TRUE(std::isfinite(ref));
  for (const Isa isa : available_isas()) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(dot_one(format.type, isa, w.data(), a.data(), blocks)),
              std::bit_cast<std::uint32_t>(ref))
        << format.name << " " << isa_name(isa);
    // Several tokens at once: each token's own bits.
    std::vector<std::uint8_t> four(a.size() * kKQuantTokens);
    std::vector<float> want(kKQuantTokens);
    for (int j = 0; j < kKQuantTokens; ++j) {
      for (float& v : x) v = normal(rng);
      kquant::quantize_q8_k(x.data(), k, four.data() + j * a.size());
      want[static_cast<std::size_t>(j)] = kquant_dot_reference(format.type, w.data(), four.data() + j * a.size(), blocks);
    }
    for (int tokens = 1; tokens <= kKQuantTokens; ++tokens) {
      std::vector<float> out(kKQuantTokens, -1.0f);
      kquant_dot(format.type, isa)(w.data(), four.data(), static_cast<std::int64_t>(a.size()), tokens, blocks, out.data());
      for (int j = 0; j < tokens; ++j) EXPECT_EQ(out[static_cast<std::size_t>(j)], want[static_cast<std::size_t>(j)]) << tokens << " tokens, token " << j;
    }
  }
}

// matmul of a K-quant matrix: every output is kquant_dot of its row and token, for decode (m = 1)
// and prefill (m >= 4), odd row counts, 1 and 2 threads, every ISA, and a shared input across two
// formats; f32 activations take the float path on ggml's dequantized rows.
TEST_P(KQuantDotTest, MatmulIsTheReferenceDotOfEveryRowAndToken) {
  const kquant::Format& format = *kquant::find(GetParam());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool one(1), two(2);
  for (const std::int64_t k : {256, 768}) {
    for (const std::int64_t n : {1, 7, 13}) {
      QuantMatrix w = allocate_matrix(n, k, {format.type, 256});
      EXPECT_EQ(w.row_bytes, k / 256 * format.block_bytes);
      EXPECT_TRUE(w.scales.empty());
      w.data = random_blocks(format, n * k / 256, rng);
      QuantMatrix other = allocate_matrix(5, k, {LowBit::kQ6_K, 256});
      other.data = random_blocks(*kquant::find(LowBit::kQ6_K), 5 * k / 256, rng);
      prepare_for_kernels(w);
      EXPECT_EQ(w.interleave, 1);
      for (const std::int64_t m : {1, 2, 5, 9}) {
        std::vector<float> x(static_cast<std::size_t>(m * k));
        for (float& v : x) v = normal(rng);
        std::vector<float> want(static_cast<std::size_t>(m * n)), want_other(static_cast<std::size_t>(m * 5));
        std::vector<std::uint8_t> a(static_cast<std::size_t>(k / 256 * kQ8KBytes));
        for (std::int64_t t = 0; t < m; ++t) {
          kquant::quantize_q8_k(x.data() + t * k, k, a.data());
          for (std::int64_t r = 0; r < n; ++r)
            want[static_cast<std::size_t>(t * n + r)] =
                kquant_dot_reference(format.type, w.data.data() + r * w.row_bytes, a.data(), k / 256);
          for (std::int64_t r = 0; r < 5; ++r)
            want_other[static_cast<std::size_t>(t * 5 + r)] =
                kquant_dot_reference(LowBit::kQ6_K, other.data.data() + r * other.row_bytes, a.data(), k / 256);
        }
        for (const Isa isa : available_isas())
          for (ThreadPool* pool : {&one, &two}) {
            std::vector<float> y(want.size(), -1.0f), y_other(want_other.size(), -1.0f);
            const MatmulOutput outs[2] = {{&w, y.data()}, {&other, y_other.data()}};
            matmul_shared_input(outs, x.data(), m, *pool, isa);
            EXPECT_EQ(y, want) << format.name << " k " << k << " n " << n << " m " << m << " " << isa_name(isa);
            EXPECT_EQ(y_other, want_other) << "q6_k beside " << format.name;
          }
        // f32 activations: the dequantized row against x, to float rounding.
        QuantMatrix f32 = w;
        f32.activations = Activations::kF32;
        std::vector<float> y(want.size()), row(static_cast<std::size_t>(k));
        matmul(f32, x.data(), m, y.data(), two);
        for (std::int64_t t = 0; t < m; ++t)
          for (std::int64_t r = 0; r < n; ++r) {
            dequantize_row(w, r, row.data());
            double sum = 0.0, magnitude = 0.0;
            for (std::int64_t j = 0; j < k; ++j) {
              sum += static_cast<double>(row[static_cast<std::size_t>(j)]) * x[static_cast<std::size_t>(t * k + j)];
              magnitude += std::fabs(static_cast<double>(row[static_cast<std::size_t>(j)]) * x[static_cast<std::size_t>(t * k + j)]);
            }
            EXPECT_NEAR(y[static_cast<std::size_t>(t * n + r)], sum, 1e-5 * magnitude);
          }
      }
    }
  }
}

TEST(KQuant, MatricesNeedWholeSuperBlocks) {
  EXPECT_THROW(allocate_matrix(4, 300, {LowBit::kQ4_K, 256}), Error);
  for (const kquant::Format& f : kquant::formats()) EXPECT_EQ(parse_low_bit(f.name), f.type);
  // quantize_matrix writes ggml's reference blocks; a row that is not finite is refused, naming it.
  std::vector<float> x(2 * 512);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 7));
  const QuantMatrix w = quantize_matrix(x.data(), 2, 512, {LowBit::kQ5_K, 256});
  std::vector<std::uint8_t> want(2 * 2 * 176);
  kquant::quantize_q5_K(x.data(), 1024, want.data());
  EXPECT_TRUE(w.data == want);
  x[700] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize_matrix(x.data(), 2, 512, {LowBit::kQ5_K, 256}), Error);
  EXPECT_EQ(low_bit_name(LowBit::kQ6_K), "q6_k");
  EXPECT_TRUE(is_kquant(LowBit::kQ2_K));
  EXPECT_FALSE(is_quantized(LowBit::kQ2_K));
  EXPECT_FALSE(is_kquant(LowBit::kSymInt4));
}

INSTANTIATE_TEST_SUITE_P(Formats, KQuantDotTest,
                         ::testing::Values(LowBit::kQ2_K, LowBit::kQ3_K, LowBit::kQ4_K, LowBit::kQ5_K, LowBit::kQ6_K),
                         [](const ::testing::TestParamInfo<LowBit>& p) { return std::string(low_bit_name(p.param)); });

// A NaN or infinite input makes its block's d NaN, so every output it meets is NaN on every ISA (as
// woq's int8 path gives; ggml's quantizer would drop a NaN silently).
TEST(KQuant, NonFiniteActivationsGiveNaN) {
  const std::int64_t k = 512;
  std::vector<float> x(static_cast<std::size_t>(k), 0.5f);
  std::mt19937 rng(3);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    x[300] = bad;
    std::vector<std::uint8_t> a(2 * kQ8KBytes);
    kquant::quantize_q8_k(x.data(), k, a.data());
    float d0, d1;
    std::memcpy(&d0, a.data(), 4);
    std::memcpy(&d1, a.data() + kQ8KBytes, 4);
    EXPECT_EQ(d0, 1.0f / (-127.0f / 0.5f)) << "the finite block keeps ggml's scale";
    EXPECT_TRUE(std::isnan(d1));
    for (const kquant::Format& f : kquant::formats()) {
      const std::vector<std::uint8_t> w = random_blocks(f, 2, rng);
      for (const Isa isa : available_isas()) EXPECT_TRUE(std::isnan(dot_one(f.type, isa, w.data(), a.data(), 2))) << f.name;
    }
  }
}

TEST(KQuant, UnpackRefusesOtherFormats) {
  kquant::Unpacked u;
  const std::uint8_t block[256] = {};
  EXPECT_THROW(kquant::unpack(LowBit::kSymInt4, block, u), Error);
  EXPECT_THROW(kquant_dot(LowBit::kSymInt8), Error);
  EXPECT_THROW(kquant_dot_reference(LowBit::kFp16, block, block, 1), Error);
  std::vector<std::uint8_t> a(kQ8KBytes);
  const float x[100] = {};
  EXPECT_THROW(kquant::quantize_q8_k(x, 100, a.data()), Error);
}

}  // namespace
}  // namespace woq
