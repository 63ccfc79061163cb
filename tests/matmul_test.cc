// Every ISA's matmul against an f64 reference over the dequantized weights,
// for every format, odd shapes, several input counts and thread counts.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/thread_pool.h"

namespace woq {
namespace {

std::vector<float> random_vector(std::int64_t n, std::uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = normal(rng);
  return v;
}

struct Case {
  LowBit type;
  std::int64_t group;
  Activations activations = Activations::kInt8;
};

class MatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulTest, MatchesF64Reference) {
  const Case c = GetParam();
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {1, 64}, {7, 33}, {13, 172}, {3, 4096 + 17}, {64, 96}, {33, 40}, {5, 256}};
  for (const auto& [n, k] : shapes) {
    const auto wf = random_vector(n * k, static_cast<std::uint32_t>(n * 1000 + k), 0.02f);
    QuantMatrix w = quantize_matrix(wf.data(), n, k, {c.type, c.group, Int4Range::kFull});
    w.activations = c.activations;
    std::vector<float> deq(static_cast<std::size_t>(n * k));
    for (std::int64_t r = 0; r < n; ++r) dequantize_row(w, r, deq.data() + r * k);
    for (const std::int64_t m : {1, 3, 4, 7, 16, 512}) {
      if (m == 512 && n * k > 64 * 172) continue;  // keeps the f64 reference cheap
      const auto x = random_vector(m * k, static_cast<std::uint32_t>(m + k), 1.0f);
      // The integer path multiplies by int8-quantized activations: the
      // reference uses exactly those values (dequantized), in f64.
      std::vector<float> xe = x;
      if (uses_q8_path(w)) {
        Q8Activations a;
        quantize_activations(x.data(), m, k, Q8Layout::kNatural, a, Isa::kScalar);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < k; ++j)
            xe[static_cast<std::size_t>(i * k + j)] =
                a.d[static_cast<std::size_t>(i * a.padded + j / kQ8Block)] * a.row(i)[j];
      }
      std::vector<double> ref(static_cast<std::size_t>(m * n)), bound(ref.size());
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t r = 0; r < n; ++r) {
          double s = 0, a = 0;
          for (std::int64_t j = 0; j < k; ++j) {
            const double p = static_cast<double>(deq[static_cast<std::size_t>(r * k + j)]) * xe[static_cast<std::size_t>(i * k + j)];
            s += p;
            a += std::fabs(p);
          }
          ref[static_cast<std::size_t>(i * n + r)] = s;
          bound[static_cast<std::size_t>(i * n + r)] = a;
        }
      for (const int threads : {1, 2}) {
        ThreadPool pool(threads);
        for (const Isa isa : available_isas()) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k << " m=" << m << " threads="
                                            << threads << " isa=" << isa_name(isa));
          std::vector<float> y(static_cast<std::size_t>(m * n), std::nanf(""));
          matmul(w, x.data(), m, y.data(), pool, isa);
          for (std::size_t i = 0; i < y.size(); ++i) {
            // float accumulation error: a few ulps of the sum of |terms| per term count.
            const double tol = 1e-6 * bound[i] * std::sqrt(static_cast<double>(k)) + 1e-30;
            ASSERT_NEAR(y[i], ref[i], tol) << "at " << i;
          }
        }
      }
    }
  }
}

// Batch invariance (woq serve's greedy decoding): each output row is
// bit-identical whether its input row runs alone or among m others, for every
// format and ISA, so a sequence's tokens do not depend on the batch it decodes in.
TEST_P(MatmulTest, RowsAreBitIdenticalAtAnyBatchSize) {
  const Case c = GetParam();
  const std::int64_t n = 37, k = 4096 + 40;
  const auto wf = random_vector(n * k, 11, 0.02f);
  QuantMatrix w = quantize_matrix(wf.data(), n, k, {c.type, c.group, Int4Range::kFull});
  w.activations = c.activations;
  const std::int64_t m = 19;
  const auto x = random_vector(m * k, 12, 1.0f);
  ThreadPool pool(2);
  for (const Isa isa : available_isas()) {
    std::vector<float> alone(static_cast<std::size_t>(m * n));
    for (std::int64_t i = 0; i < m; ++i) matmul(w, x.data() + i * k, 1, alone.data() + i * n, pool, isa);
    for (const std::int64_t batch : {2, 3, 4, 5, 8, 19}) {
      std::vector<float> y(static_cast<std::size_t>(batch * n));
      matmul(w, x.data(), batch, y.data(), pool, isa);
      for (std::size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(y[i], alone[i]) << "batch " << batch << " at " << i << " isa " << isa_name(isa);
    }
  }
}

// Every ISA the machine lacks is named, so a run says what it did not test.
void report_missing_isas() {
  for (const Isa isa : {Isa::kScalar, Isa::kAvx2})
    if (!cpu_supports(isa)) std::printf("not tested here: %s (needs %s)\n", isa_name(isa).data(), isa_requirements(isa).data());
}

TEST(VectorOps, DotAndAxpyMatchScalar) {
  report_missing_isas();
  for (const Isa isa : available_isas())
  for (const std::int64_t n : {1, 7, 8, 17, 128, 1001}) {
    const auto a = random_vector(n, static_cast<std::uint32_t>(n), 1.0f);
    const auto b = random_vector(n, static_cast<std::uint32_t>(n + 1), 1.0f);
    double ref = 0, mag = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(a[static_cast<std::size_t>(i)]) * b[static_cast<std::size_t>(i)];
      mag += std::fabs(static_cast<double>(a[static_cast<std::size_t>(i)]) * b[static_cast<std::size_t>(i)]);
    }
    EXPECT_NEAR(dot(a.data(), b.data(), n, isa), ref, 1e-6 * mag * static_cast<double>(n) + 1e-30) << n;
    auto y1 = b, y2 = b;
    axpy(0.37f, a.data(), y1.data(), n, isa);
    axpy(0.37f, a.data(), y2.data(), n, Isa::kScalar);
    for (std::size_t i = 0; i < y1.size(); ++i)
      ASSERT_NEAR(y1[i], y2[i], 1e-6f * (std::fabs(y2[i]) + 1.0f)) << n << " " << isa_name(isa);
  }
}

TEST(Q8Activations, EveryIsaMatchesScalarBitForBitAndRoundsToNearest) {
  report_missing_isas();
  for (const Isa isa : available_isas())
  for (const std::int64_t k : {1, 31, 32, 33, 172, 4096 + 17}) {
    for (const Q8Layout layout : {Q8Layout::kNatural, Q8Layout::kPairedNibbles}) {
      auto x = random_vector(3 * k, static_cast<std::uint32_t>(k), 2.0f);
      x[0] = 0.0f;
      Q8Activations s, v;
      quantize_activations(x.data(), 3, k, layout, s, Isa::kScalar);
      quantize_activations(x.data(), 3, k, layout, v, isa);
      ASSERT_EQ(s.q, v.q) << k << " " << isa_name(isa);
      ASSERT_EQ(s.d, v.d) << k;
      ASSERT_EQ(s.sum, v.sum) << k;
      for (std::int64_t r = 0; r < 3; ++r)
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t b = j / kQ8Block, i = j % kQ8Block;
          const float d = s.d[static_cast<std::size_t>(r * s.padded + b)];
          const float xq = d * s.row(r)[q8_offset(layout, b, i)];
          ASSERT_LE(std::fabs(xq - x[static_cast<std::size_t>(r * k + j)]), d * 0.5001f + 1e-30f);
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, MatmulTest,
    ::testing::Values(Case{LowBit::kFp32, 0}, Case{LowBit::kFp16, 0}, Case{LowBit::kBf16, 0},
                      Case{LowBit::kSymInt4, 32}, Case{LowBit::kSymInt4, 128}, Case{LowBit::kSymInt4, -1},
                      Case{LowBit::kAsymInt4, 32}, Case{LowBit::kAsymInt4, -1},
                      Case{LowBit::kAsymInt4, 64}, Case{LowBit::kSymInt4, 16},
                      Case{LowBit::kSymInt8, 32}, Case{LowBit::kSymInt8, -1}, Case{LowBit::kSymInt8, 48},
                      Case{LowBit::kSymInt4, 32, Activations::kF32}, Case{LowBit::kAsymInt4, 128, Activations::kF32},
                      Case{LowBit::kSymInt8, -1, Activations::kF32}, Case{LowBit::kSymInt8, 32, Activations::kF32}),
    [](const auto& param_info) {
      const Case& c = param_info.param;
      return std::string(low_bit_name(c.type)) + "_g" + (c.group < 0 ? "channel" : std::to_string(c.group)) +
             (c.activations == Activations::kF32 ? "_f32act" : "");
    });

}  // namespace
}  // namespace woq
