// Dot products of the block formats kept as stored against ggml itself:
// ggml's Q8_K / Q8_1 quantizers and ggml_vec_dot_q<N>_K_q8_K /
// ggml_vec_dot_q<4|5>_1_q8_1 (llama.cpp c392e5094's libggml-cpu, x86 AVX2
// branch) produced tests/data/ggml/q8_K.bin and <type>_dot.bin (README
// there); woq's quantizers and every ISA's kernel must give their bits.
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
// weight rows; then per input: x[n] f32, ggml's activation blocks of x (Q8_K or Q8_1), and ggml's
// vec_dot of each row.
struct DotFixture {
  std::int64_t n = 0, rows = 0, row_bytes = 0;
  std::vector<std::uint8_t> w;
  std::vector<std::vector<float>> x, dots;
  std::vector<std::vector<std::uint8_t>> a;
};

DotFixture load_dot(const kquant::Format& format) {
  std::uint32_t hdr[6];
  test::FixtureReader in(std::string(ggml_type_traits(format.ggml).name) + "_dot.bin", "WOQFIX02", hdr, 6);
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
    f.a.emplace_back(static_cast<std::size_t>(kquant::activation_bytes(format, f.n)));
    take(f.a.back().data(), f.a.back().size());
    f.dots.emplace_back(static_cast<std::size_t>(f.rows));
    take(f.dots.back().data(), f.dots.back().size() * 4);
  }
  in.finish();
  return f;
}

class KQuantDotTest : public ::testing::TestWithParam<LowBit> {};

// The values of one token's activation blocks: Q8_K by ggml's dequantizer; Q8_1 (which ggml has none
// for) as d · q per block of 32.
void dequantize_activations(const kquant::Format& format, const std::uint8_t* a, std::int64_t n, float* out) {
  if (format.activation == GgmlType::kQ8_K) return ggml_type_traits(GgmlType::kQ8_K).to_float(a, out, n);
  for (std::int64_t b = 0; b < n / 32; ++b, a += kquant::kQ8_1Bytes) {
    std::uint16_t d;
    std::memcpy(&d, a, 2);
    for (int j = 0; j < 32; ++j) out[32 * b + j] = fp16_to_fp32(d) * static_cast<float>(static_cast<std::int8_t>(a[4 + j]));
  }
}

// kquant_dot of `isa` for one token.
float dot_one(LowBit type, Isa isa, const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  float out = 0.0f;
  kquant_dot(type, isa)(w, a, 0, 1, blocks, &out);
  return out;
}

// Rows quantized by ggml from weights with outliers and rows of random bytes (every scale, min and
// quant bit pattern), against inputs with outliers, an all-zero super-block and tiny values (q4_1 /
// q5_1: and large ones).
TEST_P(KQuantDotTest, EveryIsaEqualsGgmlsVecDot) {
  const kquant::Format& format = *kquant::find(GetParam());
  const DotFixture f = load_dot(format);
  ASSERT_EQ(f.row_bytes, f.n / format.block * format.block_bytes);
  for (std::size_t i = 0; i < f.x.size(); ++i) {
    std::vector<std::uint8_t> a(f.a[i].size());
    kquant::quantize_activations(format, f.x[i].data(), f.n, a.data());
    ASSERT_EQ(a, f.a[i]) << "input " << i;
    for (const Isa isa : available_isas()) {
      for (std::int64_t r = 0; r < f.rows; ++r) {
        const float got = dot_one(format.type, isa, f.w.data() + r * f.row_bytes, a.data(), f.n / format.block);
        EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(f.dots[i][static_cast<std::size_t>(r)]))
            << format.name << " " << isa_name(isa) << " input " << i << " row " << r << ": woq " << got << " ggml "
            << f.dots[i][static_cast<std::size_t>(r)];
      }
    }
  }
}

// The reference is the dot product of what the blocks hold: against f64 sums of ggml's dequantized
// weights times the dequantized activations (so a wrong layout fails here too, not only bitwise).
// q4_1 / q5_1 weights are d · q + m: ggml meets the min m with the activations' stored fp16 sum s
// rather than their values, so the sum there is Σ (w - m) · a + m · s per block.
TEST_P(KQuantDotTest, ReferenceIsTheDotProductOfTheDequantizedValues) {
  const kquant::Format& format = *kquant::find(GetParam());
  const GgmlTypeTraits& traits = ggml_type_traits(format.ggml);
  const DotFixture f = load_dot(format);
  std::vector<float> w(static_cast<std::size_t>(f.n)), a(static_cast<std::size_t>(f.n));
  for (std::size_t i = 0; i < f.x.size(); ++i) {
    dequantize_activations(format, f.a[i].data(), f.n, a.data());
    for (std::int64_t r = 0; r < f.rows; ++r) {
      traits.to_float(f.w.data() + r * f.row_bytes, w.data(), f.n);
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t k = 0; k < f.n; ++k) {
        double m = 0.0;
        if (format.activation == GgmlType::kQ8_1) {
          const std::uint8_t* wb = f.w.data() + r * f.row_bytes + k / 32 * format.block_bytes;
          const std::uint8_t* ab = f.a[i].data() + k / 32 * kquant::kQ8_1Bytes;
          std::uint16_t h[2];
          std::memcpy(h, wb, 4);
          m = fp16_to_fp32(h[1]);
          std::memcpy(h, ab, 4);
          if (k % 32 == 0) sum += m * fp16_to_fp32(h[1]);
        }
        const double term = (w[static_cast<std::size_t>(k)] - m) * a[static_cast<std::size_t>(k)];
        sum += term;
        magnitude += std::fabs(term);
      }
      const float got = kquant_dot_reference(format.type, f.w.data() + r * f.row_bytes, f.a[i].data(), f.n / format.block);
      EXPECT_NEAR(got, sum, 1e-5 * magnitude + 1e-30) << format.name << " input " << i << " row " << r;
    }
  }
}

// `blocks` blocks of `format` of random bytes (every quant, scale and min pattern) with finite fp16
// (super-)block scales and mins N(0, 0.01).
std::vector<std::uint8_t> random_blocks(const kquant::Format& format, std::int64_t blocks, std::mt19937& rng) {
  std::vector<std::uint8_t> w(static_cast<std::size_t>(blocks * format.block_bytes));
  for (auto& b : w) b = static_cast<std::uint8_t>(rng());
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (std::int64_t b = 0; b < blocks; ++b)
    for (const std::int64_t at : {format.d_offset, format.dmin_offset}) {
      if (at < 0) continue;
      const std::uint16_t h = fp32_to_fp16(normal(rng));
      std::memcpy(w.data() + b * format.block_bytes + at, &h, 2);
    }
  return w;
}

// Long rows (Llama's K = 11008: 43 super-blocks, 344 blocks of 32).
TEST_P(KQuantDotTest, EveryIsaEqualsTheReferenceOnLongRows) {
  const kquant::Format& format = *kquant::find(GetParam());
  const std::int64_t k = 11008, blocks = k / format.block;
  std::mt19937 rng(7);
  const std::vector<std::uint8_t> w = random_blocks(format, blocks, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(k));
  for (float& v : x) v = normal(rng);
  std::vector<std::uint8_t> a(static_cast<std::size_t>(kquant::activation_bytes(format, k)));
  kquant::quantize_activations(format, x.data(), k, a.data());
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
      kquant::quantize_activations(format, x.data(), k, four.data() + j * a.size());
      want[static_cast<std::size_t>(j)] = kquant_dot_reference(format.type, w.data(), four.data() + j * a.size(), blocks);
    }
    for (int tokens = 1; tokens <= kKQuantTokens; ++tokens) {
      std::vector<float> out(kKQuantTokens, -1.0f);
      kquant_dot(format.type, isa)(w.data(), four.data(), static_cast<std::int64_t>(a.size()), tokens, blocks, out.data());
      for (int j = 0; j < tokens; ++j) EXPECT_EQ(out[static_cast<std::size_t>(j)], want[static_cast<std::size_t>(j)]) << tokens << " tokens, token " << j;
    }
  }
}

// The outputs of `w` for m tokens of x: the reference dot of each row with each token's activations.
std::vector<float> reference_outputs(const QuantMatrix& w, const std::vector<float>& x, std::int64_t m) {
  const kquant::Format& format = *kquant::find(w.type);
  const std::int64_t k = w.cols;
  std::vector<float> want(static_cast<std::size_t>(m * w.rows));
  std::vector<std::uint8_t> a(static_cast<std::size_t>(kquant::activation_bytes(format, k)));
  for (std::int64_t t = 0; t < m; ++t) {
    kquant::quantize_activations(format, x.data() + t * k, k, a.data());
    for (std::int64_t r = 0; r < w.rows; ++r)
      want[static_cast<std::size_t>(t * w.rows + r)] =
          kquant_dot_reference(w.type, w.data.data() + r * w.row_bytes, a.data(), k / format.block);
  }
  return want;
}

// matmul of a block-format matrix: every output is kquant_dot of its row and token, for decode (m = 1)
// and prefill (m >= 4), odd row counts, 1 and 2 threads, every ISA, and a shared input with a second
// matrix (q6_K; for q4_1 / q5_1 at K = 96 the other of the two, at K = 256 / 768 q6_K: the other
// activation blocks); f32 activations take the float path on ggml's dequantized rows.
TEST_P(KQuantDotTest, MatmulIsTheReferenceDotOfEveryRowAndToken) {
  const kquant::Format& format = *kquant::find(GetParam());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool one(1), two(2);
  for (const std::int64_t k : {96, 256, 768}) {
    if (k % format.block != 0) continue;
    const kquant::Format& beside =
        *kquant::find(k % 256 == 0 ? LowBit::kQ6_K : format.type == LowBit::kQ4_1 ? LowBit::kQ5_1 : LowBit::kQ4_1);
    for (const std::int64_t n : {1, 7, 13}) {
      QuantMatrix w = allocate_matrix(n, k, {format.type, format.block});
      EXPECT_EQ(w.row_bytes, k / format.block * format.block_bytes);
      EXPECT_TRUE(w.scales.empty());
      w.data = random_blocks(format, n * k / format.block, rng);
      QuantMatrix other = allocate_matrix(5, k, {beside.type, beside.block});
      other.data = random_blocks(beside, 5 * k / beside.block, rng);
      prepare_for_kernels(w);
      EXPECT_EQ(w.interleave, 1);
      for (const std::int64_t m : {1, 2, 5, 9}) {
        std::vector<float> x(static_cast<std::size_t>(m * k));
        for (float& v : x) v = normal(rng);
        const std::vector<float> want = reference_outputs(w, x, m), want_other = reference_outputs(other, x, m);
        for (const Isa isa : available_isas())
          for (ThreadPool* pool : {&one, &two}) {
            std::vector<float> y(want.size(), -1.0f), y_other(want_other.size(), -1.0f);
            const MatmulOutput outs[2] = {{&w, y.data()}, {&other, y_other.data()}};
            matmul_shared_input(outs, x.data(), m, *pool, isa);
            EXPECT_EQ(y, want) << format.name << " k " << k << " n " << n << " m " << m << " " << isa_name(isa);
            EXPECT_EQ(y_other, want_other) << beside.name << " beside " << format.name;
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
                         ::testing::Values(LowBit::kQ2_K, LowBit::kQ3_K, LowBit::kQ4_K, LowBit::kQ5_K, LowBit::kQ6_K,
                                           LowBit::kQ4_1, LowBit::kQ5_1),
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
    std::vector<std::uint8_t> a1(16 * kquant::kQ8_1Bytes);
    kquant::quantize_q8_1(x.data(), k, a1.data());
    std::uint16_t d[2];
    std::memcpy(d, a1.data(), 4);
    EXPECT_EQ(fp16_to_fp32(d[0]), fp16_to_fp32(fp32_to_fp16(0.5f / 127.0f))) << "a finite block keeps ggml's scale";
    std::memcpy(d, a1.data() + 9 * kquant::kQ8_1Bytes, 4);  // element 300's block
    EXPECT_TRUE(std::isnan(fp16_to_fp32(d[0])) && std::isnan(fp16_to_fp32(d[1])));
    for (const kquant::Format& f : kquant::formats()) {
      const std::vector<std::uint8_t> w = random_blocks(f, k / f.block, rng);
      const std::uint8_t* act = f.activation == GgmlType::kQ8_K ? a.data() : a1.data();
      for (const Isa isa : available_isas())
        EXPECT_TRUE(std::isnan(dot_one(f.type, isa, w.data(), act, k / f.block))) << f.name;
    }
  }
}

// ggml's x86 quantize_row_q8_1 rounds x · (127 / amax) half to even (vroundps), not half away from zero
// as its reference does: with amax = 127 (id = 1), 2.5 -> 2, -3.5 -> -4, 0.5 -> 0; s = d · Σ q.
TEST(KQuant, Q8_1RoundsHalfToEvenAsGgmlsX86Build) {
  float x[32] = {127.0f, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f};
  std::uint8_t a[kquant::kQ8_1Bytes];
  kquant::quantize_q8_1(x, 32, a);
  const std::int8_t want[6] = {127, 2, -4, 0, 0, 2};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(static_cast<std::int8_t>(a[4 + j]), want[j]) << j;
  std::uint16_t h[2];
  std::memcpy(h, a, 4);
  EXPECT_EQ(fp16_to_fp32(h[0]), 1.0f);
  EXPECT_EQ(fp16_to_fp32(h[1]), 127.0f);
  // amax below 127 / FLT_MAX: 127 / amax is infinite and ggml's vcvtps2dq + packs give -128 for every value
  // (zeros too: 0 · inf is NaN) and its int32 sum of them wraps to 0: d and s are fp16 +0 (ggml's bytes).
  const float tiny[32] = {1e-38f, -5e-39f};
  kquant::quantize_q8_1(tiny, 32, a);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(static_cast<std::int8_t>(a[4 + j]), -128) << j;
  std::memcpy(h, a, 4);
  EXPECT_EQ(h[0], 0u);
  EXPECT_EQ(h[1], 0u);
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
  EXPECT_THROW(kquant::quantize_q8_1(x, 100, a.data()), Error);
  EXPECT_THROW(kquant::unpack(LowBit::kQ4_1, block, u), Error);
  EXPECT_THROW(allocate_matrix(4, 100, {LowBit::kQ5_1, 32}), Error);
}

}  // namespace
}  // namespace woq
