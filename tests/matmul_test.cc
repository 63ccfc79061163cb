// Every ISA's matmul against an f64 reference over the dequantized weights,
// for every format, odd shapes, several input counts and thread counts.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/int_matrix.h"
#include "formats/interleave.h"
#include "test_files.h"

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
/// The cases of MatmulTest that take the integer or the bf16 path (interleaved_cases).
class MatmulIntegerTest : public MatmulTest {};

const std::vector<Case> kCases = {
    Case{LowBit::kFp32, 0}, Case{LowBit::kFp16, 0}, Case{LowBit::kBf16, 0},
    Case{LowBit::kSymInt4, 32}, Case{LowBit::kSymInt4, 128}, Case{LowBit::kSymInt4, -1},
    Case{LowBit::kAsymInt4, 32}, Case{LowBit::kAsymInt4, -1},
    Case{LowBit::kAsymInt4, 64}, Case{LowBit::kAsymInt4, 128}, Case{LowBit::kSymInt4, 96},
    Case{LowBit::kSymInt8, 96}, Case{LowBit::kSymInt4, 16},
    Case{LowBit::kSymInt8, 32}, Case{LowBit::kSymInt8, -1}, Case{LowBit::kSymInt8, 48},
    Case{LowBit::kSymInt4, 32, Activations::kF32}, Case{LowBit::kAsymInt4, 128, Activations::kF32},
    Case{LowBit::kSymInt8, -1, Activations::kF32}, Case{LowBit::kSymInt8, 32, Activations::kF32},
    Case{LowBit::kSymInt4, 32, Activations::kBf16}, Case{LowBit::kAsymInt4, 128, Activations::kBf16},
    Case{LowBit::kAsymInt4, 32, Activations::kBf16}, Case{LowBit::kSymInt8, -1, Activations::kBf16},
    Case{LowBit::kSymInt8, 32, Activations::kBf16}, Case{LowBit::kSymInt8, 96, Activations::kBf16},
    Case{LowBit::kSymInt4, -1, Activations::kBf16},
    Case{LowBit::kSymInt8, -1, Activations::kInt16}, Case{LowBit::kSymInt8, 32, Activations::kInt16},
    Case{LowBit::kSymInt8, 96, Activations::kInt16}, Case{LowBit::kSymInt4, 32, Activations::kInt16},
    Case{LowBit::kAsymInt4, 128, Activations::kInt16}, Case{LowBit::kAsymInt4, 32, Activations::kInt16}};

TEST_P(MatmulTest, MatchesF64Reference) {
  const Case c = GetParam();
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {1, 1}, {1, 64}, {7, 33}, {13, 172}, {3, 4096 + 17}, {64, 96}, {33, 40}, {5, 256}};
  for (const auto& [n, k] : shapes) {
    const auto wf = random_vector(n * k, static_cast<std::uint32_t>(n * 1000 + k), 0.02f);
    QuantMatrix w = quantize_matrix(wf.data(), n, k, {c.type, c.group, Int4Range::kFull});
    w.activations = c.activations;
    prepare_for_kernels(w);
    std::vector<float> deq(static_cast<std::size_t>(n * k));
    for (std::int64_t r = 0; r < n; ++r) dequantize_row(w, r, deq.data() + r * k);
    for (const std::int64_t m : {1, 3, 4, 7, 16, 512}) {
      if (m == 512 && n * k > 64 * 172) continue;  // keeps the f64 reference cheap
      const auto x = random_vector(m * k, static_cast<std::uint32_t>(m + k), 1.0f);
      // The integer path multiplies by int8-quantized activations: the
      // reference uses exactly those values (dequantized), in f64.
      std::vector<float> xe = x;
      if (uses_bf16_path(w))  // the bf16 path: the inputs rounded to bf16
        for (float& v : xe) v = bf16_to_fp32(round_to_bf16(v));
      if (uses_q8_path(w)) {  // int8 or int16 activations
        Q8Activations a;
        if (w.activations == Activations::kInt16) quantize_activations_int16(x.data(), m, k, a);
        else quantize_activations(x.data(), m, k, a, Isa::kScalar);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < k; ++j)
            xe[static_cast<std::size_t>(i * k + j)] =
                a.d[static_cast<std::size_t>(i * a.padded + j / kQ8Block)] * static_cast<float>(a.value(i, j));
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
  // K with a scalar tail (100) and with a step of 8 (4136).
  for (const std::int64_t k : {100, 4096 + 40}) {
    const std::int64_t n = 37;
    const auto wf = random_vector(n * k, 11, 0.02f);
    QuantMatrix w = quantize_matrix(wf.data(), n, k, {c.type, c.group, Int4Range::kFull});
    w.activations = c.activations;
    prepare_for_kernels(w);
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
          ASSERT_EQ(y[i], alone[i]) << "k " << k << " batch " << batch << " at " << i << " isa " << isa_name(isa);
      }
    }
  }
}

// The integer path: every ISA computes the scalar reference's float
// operations in its order, so the outputs are the same bits. So does the bf16
// path on every ISA but amx (whose tiles sum in their own order: MatchesF64Reference).
TEST_P(MatmulIntegerTest, IntegerPathOfEveryIsaEqualsScalarBitForBit) {
  const Case c = GetParam();
  // 40 rows = 5 groups of 8: two threads get 4 + 1 (an odd count for avx512's group pairs).
  for (const auto& [n, k] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 32}, {9, 100}, {40, 352}, {23, 4096 + 17}}) {
    auto wf = random_vector(n * k, static_cast<std::uint32_t>(n + k), 0.05f);
    // Extreme stored values: an all-positive row (asym zero point 0, nibbles up to 15), an all-negative
    // one (zero point 15) and a row at one magnitude (sym_int4's -8, sym_int8's +-127).
    for (std::int64_t j = 0; j < k; ++j) {
      if (n > 2) wf[static_cast<std::size_t>(k + j)] = std::fabs(wf[static_cast<std::size_t>(k + j)]);
      if (n > 2) wf[static_cast<std::size_t>(2 * k + j)] = -std::fabs(wf[static_cast<std::size_t>(2 * k + j)]);
      if (n > 3) wf[static_cast<std::size_t>(3 * k + j)] = j % 2 == 0 ? 0.1f : -0.1f;
    }
    QuantMatrix w = quantize_matrix(wf.data(), n, k, {c.type, c.group, Int4Range::kFull});
    w.activations = c.activations;
    ASSERT_TRUE(uses_q8_path(w) || uses_bf16_path(w)) << "n=" << n << " k=" << k << " takes the float path";
    prepare_for_kernels(w);
    // 16, 17, 33 and 48 tokens: tiles of 16 (amx) with and without a rest.
    for (const std::int64_t m : {1, 2, 5, 13, 16, 17, 33, 48}) {
      const auto x = random_vector(m * k, static_cast<std::uint32_t>(m), 1.0f);
      ThreadPool one(1), two(2);
      std::vector<float> ref(static_cast<std::size_t>(m * n));
      matmul(w, x.data(), m, ref.data(), one, Isa::kScalar);
      for (const Isa isa : available_isas())
        for (ThreadPool* pool : {&one, &two}) {
          if (isa == Isa::kAmx && uses_bf16_path(w)) continue;
          std::vector<float> y(ref.size());
          matmul(w, x.data(), m, y.data(), *pool, isa);
          ASSERT_EQ(y, ref) << "n=" << n << " k=" << k << " m=" << m << " isa=" << isa_name(isa);
        }
    }
  }
}

// bf16 activations: nearest even, subnormals to a signed zero, NaN quieted (VCVTNEPS2BF16), on every ISA.
TEST(Bf16Activations, EveryIsaRoundsLikeVcvtneps2bf16) {
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // halfway: to even (down)
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256), 0x3f82);  // halfway: to even (up)
  EXPECT_EQ(round_to_bf16(-1e-39f), 0x8000);            // subnormal: signed zero
  EXPECT_EQ(round_to_bf16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);  // signalling NaN: quieted
  EXPECT_EQ(round_to_bf16(3.4028235e38f), 0x7f80);      // rounds up to infinity
  std::mt19937 rng(7);
  std::vector<float> x(1000 + 13);
  for (auto& v : x) v = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));  // every class of value
  x[5] = 1e-39f;
  x[6] = -0.0f;
  for (const Isa isa : available_isas()) {
    std::vector<std::uint16_t> got(x.size() + 1, 0xabcd);
    detail::kernels(isa).round_bf16(x.data(), static_cast<std::int64_t>(x.size()), got.data());
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], round_to_bf16(x[i])) << "isa " << isa_name(isa) << " at " << i;
    EXPECT_EQ(got.back(), 0xabcd) << "wrote past the end: " << isa_name(isa);
  }
}

TEST(Interleave, RoundTripsAndEveryReaderSeesTheSameMatrix) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 1}, {7, 33}, {9, 64}, {17, 100}, {8, 4096 + 17}};
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kAsymInt4, LowBit::kSymInt8})
    for (const std::int64_t group : {32, 64, -1})
      for (const auto& [n, k] : shapes) {
        SCOPED_TRACE(::testing::Message() << low_bit_name(type) << " g" << group << " " << n << "x" << k);
        const auto wf = random_vector(n * k, static_cast<std::uint32_t>(n * 7 + k), 0.05f);
        const QuantMatrix flat = quantize_matrix(wf.data(), n, k, {type, group, Int4Range::kFull});
        QuantMatrix w = flat;
        ThreadPool pool(2);
        interleave_rows(w, &pool);
        ASSERT_EQ(w.interleave, kInterleaveRows);
        EXPECT_EQ(w.data.size(), static_cast<std::size_t>((n + 7) / 8 * ((k + 31) / 32) * interleaved_block_bytes(type)));
        std::vector<float> a(static_cast<std::size_t>(k)), b(a.size());
        for (std::int64_t r = 0; r < n; ++r) {
          dequantize_row(flat, r, a.data());
          dequantize_row(w, r, b.data());
          ASSERT_EQ(a, b) << "row " << r;
        }
        const IntMatrix ia = to_int_matrix(flat), ib = to_int_matrix(w);
        EXPECT_EQ(ia.q, ib.q);
        EXPECT_EQ(ia.scale, ib.scale);
        EXPECT_EQ(ia.zero, ib.zero);
        deinterleave_rows(w);
        EXPECT_EQ(w.interleave, 1);
        EXPECT_EQ(w.data, flat.data);
        EXPECT_EQ(w.scales, flat.scales);
        EXPECT_EQ(w.zeros, flat.zeros);
      }
  QuantMatrix g16 = quantize_matrix(random_vector(64, 1, 0.05f).data(), 2, 32, {LowBit::kSymInt4, 16, Int4Range::kFull});
  EXPECT_THROW(interleave_rows(g16), Error);
}

// quantize_for_kernels writes the interleaved blocks in one pass, each row fitted and rounded by the ISA's
// vectors: the bytes of quantize_matrix then prepare_for_kernels on every ISA, for every integer format and
// range, group sizes that interleave and ones that do not (those stay row-major), row counts off the groups
// of 8, K off the vectors' lanes; rows that test the rules' edges: an all-zero row (scale 0), sym_int4's
// first of two equal magnitudes (-a before +a: the scale's sign), an outlier. A NaN is refused by row and
// column as quantize_matrix refuses it.
TEST(Interleave, QuantizeForKernelsEqualsQuantizeThenPrepareOnEveryIsa) {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1, 32}, {7, 33}, {9, 64}, {17, 256}, {8, 4096 + 17}};
  ThreadPool pool(2);
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kAsymInt4, LowBit::kSymInt8})
    for (const Int4Range range : {Int4Range::kFull, Int4Range::kClip})
      for (const std::int64_t group : {32, 64, 128, 16, -1})
        for (const auto& [n, k] : shapes) {
          auto wf = random_vector(n * k, static_cast<std::uint32_t>(n * 5 + k), 0.05f);
          if (n > 3) {
            wf[static_cast<std::size_t>(3 * k)] = 1.5f;
            std::fill_n(wf.begin() + k, k, 0.0f);
            for (std::int64_t j = 0; j + 20 < k; j += 32) {  // -0.2 then +0.2 in every group of row 2
              wf[static_cast<std::size_t>(2 * k + j + 3)] = -0.2f;
              wf[static_cast<std::size_t>(2 * k + j + 20)] = 0.2f;
            }
          }
          if (n > 4)  // -0 and subnormals (their scales flush to fp16 zero or its subnormals)
            for (std::int64_t j = 0; j < k; ++j)
              wf[static_cast<std::size_t>(4 * k + j)] = j % 3 == 0 ? -0.0f : j % 3 == 1 ? 1e-40f : -1e-39f;
          const QuantSpec spec{type, group, range};
          const RowReader read = [&](std::int64_t r, float* out) { std::copy_n(wf.data() + r * k, k, out); };
          for (const Activations act : {Activations::kInt8, Activations::kInt16, Activations::kF32}) {
            QuantMatrix want = quantize_matrix(read, n, k, spec, &pool);
            want.activations = act;
            prepare_for_kernels(want, &pool);
            for (const Isa isa : available_isas()) {
              SCOPED_TRACE(::testing::Message() << low_bit_name(type) << " g" << group << " " << n << "x" << k << " "
                                                << isa_name(isa));
              const QuantMatrix got = quantize_for_kernels(read, n, k, spec, act, pool, isa);
              EXPECT_EQ(got.interleave, want.interleave);
              EXPECT_EQ(got.activations, act);
              EXPECT_EQ(got.data, want.data);
              EXPECT_EQ(got.scales, want.scales);
              EXPECT_EQ(got.zeros, want.zeros);
            }
          }
        }
  const float four[4] = {1, 2, 3, 4};
  std::int32_t q4[4];
  GroupRule rule[4];
  EXPECT_NE(test::error_of([&] { quantize_row_groups(LowBit::kAsymInt4, Int4Range::kFull, four, 4, 0, q4, rule); })
                .find("group 0"),
            std::string::npos);  // not a loop without end
  // NaN, inf and a scale beyond fp16 (1e30): quantize_matrix's error, word for word.
  const std::int64_t n = 11, k = 96;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 1e30f}) {
    auto wf = random_vector(n * k, 9, 0.05f);
    wf[static_cast<std::size_t>(9 * k + 70)] = bad;
    const RowReader read = [&](std::int64_t r, float* out) { std::copy_n(wf.data() + r * k, k, out); };
    for (const LowBit type : {LowBit::kAsymInt4, LowBit::kSymInt4, LowBit::kSymInt8}) {
      const std::string want = test::error_of([&] { quantize_matrix(read, n, k, {type, 32}, &pool); });
      EXPECT_NE(want.find("row 9"), std::string::npos) << want;
      for (const Isa isa : available_isas())
        EXPECT_EQ(test::error_of([&] { quantize_for_kernels(read, n, k, {type, 32}, Activations::kInt16, pool, isa); }),
                  want)
            << isa_name(isa);
    }
  }
}

TEST(Interleave, IntegerPathRefusesAMatrixNotPrepared) {
  const auto wf = random_vector(8 * 64, 3, 0.05f);
  const QuantMatrix w = quantize_matrix(wf.data(), 8, 64, {LowBit::kSymInt4, 32, Int4Range::kFull});
  const auto x = random_vector(64, 4, 1.0f);
  std::vector<float> y(8);
  ThreadPool pool(1);
  try {
    matmul(w, x.data(), 1, y.data(), pool);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prepare_for_kernels"), std::string::npos) << e.what();
  }
}

// A prepared matrix switched to f32 activations (as explain does) still
// multiplies exactly as the row-major one.
TEST(Interleave, FloatPathReadsAPreparedMatrix) {
  const std::int64_t n = 13, k = 100;
  const auto wf = random_vector(n * k, 5, 0.05f);
  QuantMatrix flat = quantize_matrix(wf.data(), n, k, {LowBit::kAsymInt4, 32, Int4Range::kFull});
  flat.activations = Activations::kF32;
  QuantMatrix w = flat;
  w.activations = Activations::kInt8;
  prepare_for_kernels(w);
  w.activations = Activations::kF32;
  ThreadPool pool(2);
  for (const std::int64_t m : {1, 6}) {
    const auto x = random_vector(m * k, 6, 1.0f);
    std::vector<float> y1(static_cast<std::size_t>(m * n)), y2(y1.size());
    matmul(flat, x.data(), m, y1.data(), pool);
    matmul(w, x.data(), m, y2.data(), pool);
    EXPECT_EQ(y1, y2) << m;
  }
}

// matmul_shared_input (fused q/k/v, gate/up): each matrix's outputs are the
// bits of its own matmul, for matrices of different row counts (not multiples
// of 8 or of the work grain), formats, paths and act-orders, every ISA, 1 and 2 threads.
TEST(SharedInput, EqualsOneMatmulPerMatrixBitForBit) {
  const std::int64_t k = 4096 + 96;
  struct Spec {
    std::int64_t rows;
    QuantSpec spec;
    Activations act;
    bool act_order;
  };
  const std::vector<std::vector<Spec>> sets = {
      {{37, {LowBit::kSymInt4, 32, Int4Range::kFull}, Activations::kInt8, false},
       {9, {LowBit::kSymInt4, 32, Int4Range::kFull}, Activations::kInt8, false},
       {70, {LowBit::kAsymInt4, 64, Int4Range::kFull}, Activations::kInt8, false},
       {1, {LowBit::kSymInt8, -1, Int4Range::kFull}, Activations::kInt8, false}},
      {{21, {LowBit::kSymInt8, 32, Int4Range::kFull}, Activations::kF32, false},
       {19, {LowBit::kFp16, 0, Int4Range::kFull}, Activations::kInt8, false}},
      {{24, {LowBit::kSymInt4, 32, Int4Range::kFull}, Activations::kInt8, false},
       {16, {LowBit::kSymInt4, 32, Int4Range::kFull}, Activations::kF32, false},
       {8, {LowBit::kSymInt4, 32, Int4Range::kFull}, Activations::kInt8, true}},
  };
  std::uint32_t seed = 100;
  for (const auto& set : sets) {
    std::vector<QuantMatrix> ws;
    for (const Spec& sp : set) {
      const auto wf = random_vector(sp.rows * k, seed++, 0.05f);
      ws.push_back(quantize_matrix(wf.data(), sp.rows, k, sp.spec));
      ws.back().activations = sp.act;
      if (sp.act_order) {
        ws.back().input_order.resize(static_cast<std::size_t>(k));
        for (std::int64_t j = 0; j < k; ++j) ws.back().input_order[static_cast<std::size_t>(j)] = static_cast<std::int32_t>((j * 7 + 3) % k);
      }
      prepare_for_kernels(ws.back());
    }
    for (const std::int64_t m : {1, 3, 4, 13}) {
      const auto x = random_vector(m * k, seed++, 1.0f);
      for (const int threads : {1, 2}) {
        ThreadPool pool(threads);
        for (const Isa isa : available_isas()) {
          std::vector<std::vector<float>> got(ws.size());
          std::vector<MatmulOutput> outs;
          for (std::size_t i = 0; i < ws.size(); ++i) {
            got[i].assign(static_cast<std::size_t>(m * ws[i].rows), std::nanf(""));
            outs.push_back({&ws[i], got[i].data()});
          }
          matmul_shared_input(outs, x.data(), m, pool, isa);
          for (std::size_t i = 0; i < ws.size(); ++i) {
            std::vector<float> alone(got[i].size());
            matmul(ws[i], x.data(), m, alone.data(), pool, isa);
            ASSERT_EQ(got[i], alone) << "matrix " << i << " m=" << m << " threads=" << threads << " isa=" << isa_name(isa);
          }
        }
      }
    }
  }
  QuantMatrix narrow = quantize_matrix(random_vector(8 * 64, 1, 0.05f).data(), 8, 64, {LowBit::kSymInt4, 32, Int4Range::kFull});
  prepare_for_kernels(narrow);
  QuantMatrix wide = quantize_matrix(random_vector(8 * 96, 2, 0.05f).data(), 8, 96, {LowBit::kSymInt4, 32, Int4Range::kFull});
  prepare_for_kernels(wide);
  std::vector<float> x(96), y1(8), y2(8);
  ThreadPool pool(1);
  const std::vector<MatmulOutput> mixed = {{&narrow, y1.data()}, {&wide, y2.data()}};
  EXPECT_THROW(matmul_shared_input(mixed, x.data(), 1, pool), Error);
}

// One Workspace carried through calls of every path, format, width and token
// count, larger and smaller by turns (what a model's passes do): each call
// gives the bits of a call with a fresh Workspace, so no kernel reads what an
// earlier call left in its buffers.
TEST(Workspace, ReusedBuffersGiveTheBitsOfFreshOnes) {
  struct Spec {
    std::int64_t rows, k;
    QuantSpec spec;
    Activations act;
  };
  const std::vector<Spec> specs = {
      {40, 4096 + 96, {LowBit::kSymInt8, 32, Int4Range::kFull}, Activations::kInt16},
      {24, 160, {LowBit::kSymInt8, -1, Int4Range::kFull}, Activations::kInt16},
      {18, 960 + 32, {LowBit::kSymInt8, 96, Int4Range::kFull}, Activations::kInt16},  // odd scale units
      {33, 1000, {LowBit::kAsymInt4, 128, Int4Range::kFull}, Activations::kInt8},
      {17, 4096, {LowBit::kSymInt4, 32, Int4Range::kFull}, Activations::kBf16},
      {9, 96, {LowBit::kSymInt8, 32, Int4Range::kFull}, Activations::kBf16},
      {19, 2048 + 7, {LowBit::kSymInt8, 32, Int4Range::kFull}, Activations::kF32},
      {21, 300, {LowBit::kFp16, 0, Int4Range::kFull}, Activations::kF32},
  };
  std::uint32_t seed = 300;
  std::vector<QuantMatrix> ws;
  for (const Spec& sp : specs) {
    ws.push_back(quantize_matrix(random_vector(sp.rows * sp.k, seed++, 0.05f).data(), sp.rows, sp.k, sp.spec));
    ws.back().activations = sp.act;
    prepare_for_kernels(ws.back());
  }
  for (const int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (const Isa isa : available_isas()) {
      Workspace reused;
      for (const std::int64_t m : {48, 1, 33, 5, 16, 2}) {
        for (std::size_t i = 0; i < ws.size(); ++i) {
          const std::size_t at = (i + static_cast<std::size_t>(m)) % ws.size();  // a different order each round
          const auto x = random_vector(m * ws[at].cols, seed++, 1.0f);
          std::vector<float> got(static_cast<std::size_t>(m * ws[at].rows)), fresh(got.size());
          matmul(ws[at], x.data(), m, got.data(), pool, reused, isa);
          matmul(ws[at], x.data(), m, fresh.data(), pool, isa);
          ASSERT_EQ(got, fresh) << "matrix " << at << " m=" << m << " threads=" << threads << " isa=" << isa_name(isa);
        }
      }
    }
  }
}

// A NaN or an infinity among the inputs makes the outputs NaN on every ISA and
// integer format (the quantized activations must not turn it into a finite value).
TEST(Q8Activations, NonFiniteInputsGiveNaNOnEveryIsa) {
  const std::int64_t n = 17, k = 100;
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kAsymInt4, LowBit::kSymInt8}) {
    QuantMatrix w = quantize_matrix(random_vector(n * k, 3, 0.05f).data(), n, k, {type, 32, Int4Range::kFull});
    w.activations = Activations::kInt8;
    prepare_for_kernels(w);
    for (const float bad : {std::nanf(""), INFINITY, -INFINITY})
      for (const std::int64_t at : {0, 5, 31, 40, 99}) {
        auto x = random_vector(2 * k, 4, 1.0f);
        x[static_cast<std::size_t>(k + at)] = bad;  // second row only
        ThreadPool pool(2);
        for (const Isa isa : available_isas()) {
          std::vector<float> y(static_cast<std::size_t>(2 * n));
          matmul(w, x.data(), 2, y.data(), pool, isa);
          for (std::int64_t r = 0; r < n; ++r) {
            ASSERT_TRUE(std::isfinite(y[static_cast<std::size_t>(r)])) << isa_name(isa);
            ASSERT_TRUE(std::isnan(y[static_cast<std::size_t>(n + r)]))
                << low_bit_name(type) << " " << bad << " at " << at << " isa " << isa_name(isa) << " row " << r;
          }
        }
      }
  }
}

// Every ISA the machine lacks is named, so a run says what it did not test.
void report_missing_isas() {
  for (const Isa isa : all_isas())
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

// The float path's register tiles (several rows and tokens per step) give each
// product dot_f32's bits: every remainder of k (the step of 16, the one step of
// 8, the scalar tail), rows and tokens past a tile's edge, padded rows.
TEST(VectorOps, DotTilesEqualDotF32BitForBit) {
  for (const Isa isa : available_isas()) {
    const detail::RowKernels& kern = detail::kernels(isa);
    if (kern.dot_f32_tile == nullptr) continue;  // the scalar table walks dot_f32 itself
    for (const std::int64_t k : {1, 7, 8, 9, 15, 16, 23, 24, 31, 100, 4096 + 40 + 5}) {
      const std::int64_t ldw = k + 3, rows = 70, m = 13;
      const auto w = random_vector(rows * ldw, static_cast<std::uint32_t>(k), 1.0f);
      const auto x = random_vector(m * k, static_cast<std::uint32_t>(k + 1), 1.0f);
      for (const std::int64_t r : {1, 2, 5, 9, 70})  // 70: past the rows whose accumulators are kept at once
        for (const std::int64_t t : {1, 4, 7, 13}) {
          std::vector<float> y(static_cast<std::size_t>(t * 80), -1.0f);
          kern.dot_f32_tile(w.data(), ldw, r, x.data(), t, k, y.data(), 80);
          for (std::int64_t i = 0; i < t; ++i)
            for (std::int64_t j = 0; j < 80; ++j) {
              const float want = j < r ? kern.dot_f32(w.data() + j * ldw, x.data() + i * k, k) : -1.0f;
              ASSERT_EQ(y[static_cast<std::size_t>(i * 80 + j)], want)
                  << isa_name(isa) << " k " << k << " rows " << r << " tokens " << t << " at " << i << "," << j;
            }
        }
    }
  }
}

TEST(Q8Activations, EveryIsaMatchesScalarBitForBitAndRoundsToNearest) {
  report_missing_isas();
  for (const Isa isa : available_isas())
  for (const std::int64_t k : {1, 31, 32, 33, 172, 4096 + 17}) {
    {
      auto x = random_vector(3 * k, static_cast<std::uint32_t>(k), 2.0f);
      x[0] = 0.0f;
      Q8Activations s, v;
      quantize_activations(x.data(), 3, k, s, Isa::kScalar);
      quantize_activations(x.data(), 3, k, v, isa);
      ASSERT_EQ(s.q, v.q) << k << " " << isa_name(isa);
      ASSERT_EQ(s.d, v.d) << k;
      ASSERT_EQ(s.qsum, v.qsum) << k;
      for (std::int64_t r = 0; r < 3; ++r)
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t b = j / kQ8Block, i = j % kQ8Block;
          const float d = s.d[static_cast<std::size_t>(r * s.padded + b)];
          const float xq = d * s.row(r)[b * kQ8Block + i];
          ASSERT_LE(std::fabs(xq - x[static_cast<std::size_t>(r * k + j)]), d * 0.5001f + 1e-30f);
        }
    }
  }
}

// The int16 split on every ISA is the scalar one bit for bit: every v in [-32512, 32512] (x = v with each
// unit's amax 32512, so x / d = v: AVX2's (n · 32897) >> 23 for floor((v + 127) / 255) is exact on the whole
// domain), ragged ends, a non-finite unit, tiny and zero units; split over a pool's threads as well.
TEST(Q8Activations, Int16EveryIsaAndPoolMatchScalarBitForBit) {
  report_missing_isas();
  const auto same = [](const Q8Activations& s, const Q8Activations& v, const std::string& what) {
    ASSERT_EQ(s.q, v.q) << what;
    ASSERT_EQ(s.lo, v.lo) << what;
    ASSERT_EQ(s.qsum, v.qsum) << what;
    ASSERT_EQ(s.d.size(), v.d.size()) << what;
    for (std::size_t i = 0; i < s.d.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(s.d[i]), std::bit_cast<std::uint32_t>(v.d[i])) << what << " d " << i;
  };
  std::vector<float> every;  // units of 127 values of v after one of 32512
  for (int v = -kInt16Max; v <= kInt16Max; ++v) {
    if (every.size() % 128 == 0) every.push_back(static_cast<float>(kInt16Max));
    every.push_back(static_cast<float>(v));
  }
  const std::int64_t k_every = 128 * 64, built = static_cast<std::int64_t>(every.size());
  every.resize((every.size() + k_every - 1) / k_every * k_every, 1.0f);
  ThreadPool pool(2);
  for (const Isa isa : available_isas()) {
    {
      const std::int64_t m = static_cast<std::int64_t>(every.size()) / k_every;
      Q8Activations s, v, p;
      quantize_activations_int16(every.data(), m, k_every, s, Isa::kScalar);
      quantize_activations_int16(every.data(), m, k_every, v, isa);
      quantize_activations_int16(every.data(), m, k_every, p, isa, &pool);
      same(s, v, "every v " + std::string(isa_name(isa)));
      same(s, p, "every v, pool " + std::string(isa_name(isa)));
      int seen = 0;  // the scalar split is what the layout says
      for (std::int64_t t = 0; t < m; ++t)
        for (std::int64_t j = 0; j < k_every && t * k_every + j < built; ++j) {
          const float want = every[static_cast<std::size_t>(t * k_every + j)];
          ASSERT_EQ(static_cast<float>(s.value(t, j)), want) << t << " " << j;
          seen += want == -kInt16Max;
        }
      ASSERT_GE(seen, 1);
    }
    for (const std::int64_t k : {1, 31, 127, 128, 129, 300, 4096 + 17}) {
      const std::int64_t m = 37;
      auto x = random_vector(m * k, static_cast<std::uint32_t>(k + 5), 3.0f);
      for (std::int64_t j = 0; j < std::min<std::int64_t>(k, 128); ++j) x[static_cast<std::size_t>(k + j)] = 1e-36f;
      for (std::int64_t j = 0; j < std::min<std::int64_t>(k, 128); ++j) x[static_cast<std::size_t>(2 * k + j)] = 0.0f;
      x[static_cast<std::size_t>(3 * k + k / 2)] = std::numeric_limits<float>::quiet_NaN();
      x[static_cast<std::size_t>(4 * k)] = -std::numeric_limits<float>::infinity();
      x[static_cast<std::size_t>(5 * k + k - 1)] = -1e30f;
      x[static_cast<std::size_t>(6 * k)] = -0.0f;
      Q8Activations s, v, p;
      quantize_activations_int16(x.data(), m, k, s, Isa::kScalar);
      quantize_activations_int16(x.data(), m, k, v, isa);
      quantize_activations_int16(x.data(), m, k, p, isa, &pool);
      same(s, v, "k " + std::to_string(k) + " " + std::string(isa_name(isa)));
      same(s, p, "k " + std::to_string(k) + " pool " + std::string(isa_name(isa)));
      Q8Activations s8, p8;  // int8 activations split over the pool too
      quantize_activations(x.data(), m, k, s8, Isa::kScalar);
      quantize_activations(x.data(), m, k, p8, isa, &pool);
      ASSERT_EQ(s8.q, p8.q) << k << " " << isa_name(isa);
      ASSERT_EQ(s8.qsum, p8.qsum) << k;
    }
  }
}

// int16 activations: each value is 255·hi + lo with |hi|, |lo| <= 127 (what AVX2's sign trick and VNNI
// take), within d/2 of the input, d = amax / 32512 per 128 inputs (their largest value at +-32512: hi = lo
// = 127), d stored in each of their 4 blocks; qsum is each block's sum; 128 inputs with a NaN or an
// infinity get zeros and d = NaN.
TEST(Q8Activations, Int16SplitsIntoTwoInt8PartsAndRoundsToNearest) {
  for (const std::int64_t k : {1, 31, 32, 33, 172, 4096 + 17}) {
    auto x = random_vector(3 * k, static_cast<std::uint32_t>(k), 2.0f);
    x[0] = 0.0f;
    if (k > 40) x[static_cast<std::size_t>(k + 35)] = -1e4f;  // one unit with a huge range
    Q8Activations a;
    quantize_activations_int16(x.data(), 3, k, a);
    ASSERT_TRUE(a.wide);
    ASSERT_EQ(a.scale_blocks, 4);
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t j0 = 0; j0 < k; j0 += 128) {
        const std::int64_t n = std::min<std::int64_t>(128, k - j0);
        const float d = a.d[static_cast<std::size_t>(r * a.padded + j0 / kQ8Block)];
        float amax = 0;
        int vmax = 0;
        std::vector<int> sums(4, 0);
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t j = j0 + i;
          const std::size_t at = static_cast<std::size_t>(r * a.padded * kQ8Block + j);
          ASSERT_LE(std::abs(a.q[at]), 127);
          ASSERT_LE(std::abs(a.lo[at]), 127);
          const int v = a.value(r, j);
          ASSERT_EQ(v, 255 * a.q[at] + a.lo[at]);
          ASSERT_EQ(a.d[static_cast<std::size_t>(r * a.padded + j / kQ8Block)], d);
          const float xv = x[static_cast<std::size_t>(r * k + j)];
          // d/2, plus the fp32 rounding of x / d at |v| up to 32512 (~2^-9 of d).
          ASSERT_LE(std::fabs(d * static_cast<float>(v) - xv), d * 0.505f + 1e-30f) << k << " " << j;
          amax = std::max(amax, std::fabs(xv));
          vmax = std::max(vmax, std::abs(v));
          sums[static_cast<std::size_t>(i / kQ8Block)] += v;
        }
        EXPECT_EQ(d, amax / 32512.0f);
        if (amax > 0) {
          EXPECT_EQ(vmax, kInt16Max);
        }
        for (std::int64_t b = j0 / kQ8Block; b < (j0 + n + kQ8Block - 1) / kQ8Block; ++b)
          EXPECT_EQ(a.qsum[static_cast<std::size_t>(r * a.padded + b)], sums[static_cast<std::size_t>(b - j0 / kQ8Block)]);
      }
  }
  std::vector<float> x(256 + 64, 0.5f);
  x[200] = std::numeric_limits<float>::infinity();
  Q8Activations a;
  quantize_activations_int16(x.data(), 1, 320, a);
  EXPECT_EQ(a.d[0], 0.5f / 32512.0f);
  for (std::int64_t b = 4; b < 8; ++b) EXPECT_TRUE(std::isnan(a.d[static_cast<std::size_t>(b)])) << b;
  EXPECT_EQ(a.d[8], 0.5f / 32512.0f);
  for (std::int64_t j = 128; j < 256; ++j) EXPECT_EQ(a.value(0, j), 0);
  // A product with such inputs is NaN, as with int8 activations.
  QuantMatrix w = quantize_matrix(random_vector(8 * 320, 9, 0.05f).data(), 8, 320, {LowBit::kSymInt8, 32, Int4Range::kFull});
  w.activations = Activations::kInt16;
  prepare_for_kernels(w);
  ThreadPool pool(1);
  for (const Isa isa : available_isas()) {
    std::vector<float> y(8);
    matmul(w, x.data(), 1, y.data(), pool, isa);
    for (const float v : y) EXPECT_TRUE(std::isnan(v)) << isa_name(isa);
  }
}

// Inputs so small that q_max / amax overflows (from the attack review: 32512 / 1e-35 = inf made every value of
// the unit -amax, zeros included) quantize to zeros, int8 and int16 alike, on every ISA; a larger tiny input keeps
// its sign and size.
TEST(Q8Activations, TinyInputsRoundToZeroNotToInfinity) {
  QuantMatrix w = quantize_matrix(std::vector<float>(256, 1.0f).data(), 1, 256, {LowBit::kSymInt8, -1, Int4Range::kFull});
  ThreadPool pool(1);
  for (const Activations act : {Activations::kInt8, Activations::kInt16}) {
    QuantMatrix wa = w;
    wa.activations = act;
    prepare_for_kernels(wa);
    for (const float tiny : {1e-35f, 1e-38f, 1e-40f, 1e-33f}) {
      std::vector<float> x(256, 0.0f);
      x[0] = tiny;
      for (const Isa isa : available_isas()) {
        float y = std::nanf("");
        matmul(wa, x.data(), 1, &y, pool, isa);
        SCOPED_TRACE(::testing::Message() << activations_name(act) << " " << tiny << " " << isa_name(isa));
        ASSERT_TRUE(std::isfinite(y));
        ASSERT_GE(y, 0.0f);  // never the wrong sign
        ASSERT_LE(y, 1.01f * tiny);
        if (tiny == 1e-33f) {
          EXPECT_NEAR(y, tiny, 0.01f * tiny);  // representable: kept
        }
      }
    }
  }
}

// A case's test name: format, group, activations.
std::string case_name(const ::testing::TestParamInfo<Case>& param_info) {
  const Case& c = param_info.param;
  return std::string(low_bit_name(c.type)) + "_g" + (c.group < 0 ? "channel" : std::to_string(c.group)) +
         (c.activations == Activations::kInt8 ? "" : "_" + std::string(activations_name(c.activations)) + "act");
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest, ::testing::ValuesIn(kCases), case_name);

// The cases that take the integer or the bf16 path (matmul's own rule, asked of a 1 x 384 matrix).
std::vector<Case> interleaved_cases() {
  std::vector<Case> out;
  for (const Case& c : kCases) {
    QuantMatrix w = quantize_matrix(random_vector(384, 1, 0.05f).data(), 1, 384, {c.type, c.group, Int4Range::kFull});
    w.activations = c.activations;
    if (uses_q8_path(w) || uses_bf16_path(w)) out.push_back(c);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Interleaved, MatmulIntegerTest, ::testing::ValuesIn(interleaved_cases()), case_name);

}  // namespace
}  // namespace woq
