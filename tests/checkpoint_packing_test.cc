// GPTQ and compressed-tensors bit layouts against a reference packer written
// here from the format description (not from the production code), the
// IntMatrix <-> QuantMatrix conversions, and act-order matrices.
#include "formats/checkpoint_packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "test_files.h"

namespace woq {
namespace {

// Reference GPTQ packing: bit position b*k of column n's bit stream, so the
// word is (b*k)/32 and the shift (b*k)%32 (equivalent to the k/(32/b),
// b*(k%(32/b)) of the format description, written differently on purpose).
struct RefGptq {
  std::vector<std::uint32_t> qweight, qzeros;
};

RefGptq ref_pack_gptq(const IntMatrix& m, bool v1) {
  const std::int64_t b = m.bits;
  const std::int64_t qrows = (m.cols * b + 31) / 32, zcols = (m.rows * b + 31) / 32;
  RefGptq r;
  r.qweight.assign(static_cast<std::size_t>(qrows * m.rows), 0);
  r.qzeros.assign(static_cast<std::size_t>(m.groups * zcols), 0);
  for (std::int64_t n = 0; n < m.rows; ++n) {
    for (std::int64_t k = 0; k < m.cols; ++k) {
      const std::uint32_t v = m.q[static_cast<std::size_t>(n * m.cols + k)];
      r.qweight[static_cast<std::size_t>((b * k) / 32 * m.rows + n)] |= v << ((b * k) % 32);
    }
    for (std::int64_t g = 0; g < m.groups; ++g) {
      const std::uint32_t z = m.zero[static_cast<std::size_t>(n * m.groups + g)] - (v1 ? 1u : 0u);
      r.qzeros[static_cast<std::size_t>(g * zcols + (b * n) / 32)] |= z << ((b * n) % 32);
    }
  }
  return r;
}

// GPTQ's desc_act group map: features sorted by a random "importance",
// the i-th most important in group i / g.
std::vector<std::int32_t> act_order_g_idx(std::int64_t k, std::int64_t g, std::uint32_t seed) {
  std::vector<std::int32_t> perm(static_cast<std::size_t>(k));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<std::int32_t> g_idx(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < k; ++i) g_idx[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] =
      static_cast<std::int32_t>(i / g);
  return g_idx;
}

IntMatrix random_int_matrix(int bits, bool sym, std::int64_t n, std::int64_t k, std::int64_t g, bool desc_act,
                            std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::int64_t gs = g == -1 ? k : g;
  IntMatrix m;
  m.bits = bits;
  m.rows = n;
  m.cols = k;
  m.groups = (k + gs - 1) / gs;
  std::uniform_int_distribution<int> q(0, (1 << bits) - 1), z(1, (1 << bits) - 1);
  std::uniform_real_distribution<float> s(-0.05f, 0.05f);
  for (std::int64_t i = 0; i < n * k; ++i) m.q.push_back(static_cast<std::uint8_t>(q(rng)));
  for (std::int64_t i = 0; i < n * m.groups; ++i) {
    m.zero.push_back(static_cast<std::uint16_t>(sym ? 1 << (bits - 1) : z(rng)));
    m.scale.push_back(fp32_to_fp16(s(rng)));
  }
  if (desc_act) {
    m.g_idx = act_order_g_idx(k, gs, seed + 1);
  } else {
    for (std::int64_t i = 0; i < k; ++i) m.g_idx.push_back(static_cast<std::int32_t>(i / gs));
  }
  return m;
}

void expect_same(const IntMatrix& a, const IntMatrix& b) {
  EXPECT_EQ(a.bits, b.bits);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.zero, b.zero);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.g_idx, b.g_idx);
}

// W[n, k] by the definition, in f64.
double element(const IntMatrix& m, std::int64_t n, std::int64_t k) {
  const std::size_t g = static_cast<std::size_t>(n * m.groups + m.g_idx[static_cast<std::size_t>(k)]);
  return (static_cast<double>(m.q[static_cast<std::size_t>(n * m.cols + k)]) - m.zero[g]) * fp16_to_fp32(m.scale[g]);
}

TEST(GptqPacking, MatchesReferenceLayoutAndRoundTrips) {
  for (const int bits : {4, 8})
    for (const bool sym : {true, false})
      for (const bool v1 : {true, false})
        for (const bool desc_act : {false, true})
          for (const auto& [n, k, g] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
                   {20, 172, 32}, {64, 96, 32}, {1, 8, -1}, {9, 130, 64}}) {
            SCOPED_TRACE(::testing::Message() << bits << "-bit sym=" << sym << " v1=" << v1 << " desc_act=" << desc_act
                                              << " n=" << n << " k=" << k << " g=" << g);
            const IntMatrix m = random_int_matrix(bits, sym, n, k, g, desc_act, static_cast<std::uint32_t>(n + k));
            ThreadPool pool(3);  // octets of rows over the threads: the same words as one thread's
            const GptqTensors t = pack_gptq(m, v1 ? GptqZeros::kV1 : GptqZeros::kV2, &pool);
            const RefGptq ref = ref_pack_gptq(m, v1);
            ASSERT_EQ(t.qweight.size(), ref.qweight.size());
            ASSERT_EQ(t.qzeros.size(), ref.qzeros.size());
            for (std::size_t i = 0; i < ref.qweight.size(); ++i)
              ASSERT_EQ(static_cast<std::uint32_t>(t.qweight[i]), ref.qweight[i]) << "qweight word " << i;
            for (std::size_t i = 0; i < ref.qzeros.size(); ++i)
              ASSERT_EQ(static_cast<std::uint32_t>(t.qzeros[i]), ref.qzeros[i]) << "qzeros word " << i;
            for (std::int64_t r = 0; r < n; ++r)  // scales are [groups, N]
              for (std::int64_t gi = 0; gi < m.groups; ++gi)
                ASSERT_EQ(t.scales[static_cast<std::size_t>(gi * n + r)], m.scale[static_cast<std::size_t>(r * m.groups + gi)]);
            EXPECT_EQ(t.g_idx, m.g_idx);
            std::vector<std::string> warnings;
            expect_same(unpack_gptq(t, v1 ? GptqZeros::kV1 : GptqZeros::kV2, sym, warnings), m);
            EXPECT_TRUE(warnings.empty());
          }
}

TEST(GptqPacking, V1CannotStoreZeroPointZero) {
  IntMatrix m = random_int_matrix(4, false, 4, 64, 32, false, 1);
  m.zero[5] = 0;
  try {
    pack_gptq(m, GptqZeros::kV1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 2 group 1 has zero point 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gptq_v2"), std::string::npos) << e.what();
  }
  std::vector<std::string> warnings;
  expect_same(unpack_gptq(pack_gptq(m, GptqZeros::kV2), GptqZeros::kV2, false, warnings), m);
}

TEST(GptqPacking, DetectsV2ZerosLabelledV1) {
  for (const int bits : {4, 8}) {
    const IntMatrix m = random_int_matrix(bits, true, 16, 64, 32, false, 3);
    const GptqTensors v2 = pack_gptq(m, GptqZeros::kV2);  // stored zeros 8 / 128
    std::vector<std::string> warnings;
    const IntMatrix read = unpack_gptq(v2, GptqZeros::kV1, true, warnings);
    expect_same(read, m);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("read as gptq_v2"), std::string::npos) << warnings[0];
  }
}

TEST(GptqPacking, WrappedV1ZeroReadsAsZeroWithWarning) {
  IntMatrix m = random_int_matrix(4, false, 8, 32, 32, false, 4);
  GptqTensors t = pack_gptq(m, GptqZeros::kV2);
  t.qzeros[0] = static_cast<std::int32_t>((static_cast<std::uint32_t>(t.qzeros[0]) & ~0xfu) | 0xfu);  // row 0: -1 in v1
  std::vector<std::string> warnings;
  const IntMatrix read = unpack_gptq(t, GptqZeros::kV1, false, warnings);
  EXPECT_EQ(read.zero[0], 0);
  ASSERT_EQ(warnings.size(), 1u);
}

TEST(PackQuantized, MatchesReferenceLayout) {
  for (const int bits : {4, 8})
    for (const bool sym : {true, false})
      for (const auto& [n, k, g] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
               {20, 172, 32}, {16, 64, -1}, {3, 40, 8}}) {
        SCOPED_TRACE(::testing::Message() << bits << "-bit sym=" << sym << " n=" << n << " k=" << k);
        // Signed values and zero points, as compressed-tensors quantizes them.
        std::mt19937 rng(static_cast<std::uint32_t>(n * k + bits));
        const int lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
        std::uniform_int_distribution<int> val(lo, hi);
        const std::int64_t groups = g == -1 ? 1 : (k + g - 1) / g;
        const std::int64_t b = bits;
        PackQuantizedTensors t;
        t.bits = bits;
        t.n = n;
        t.k = k;
        t.groups = groups;
        std::vector<int> q(static_cast<std::size_t>(n * k)), zp(static_cast<std::size_t>(n * groups), 0);
        t.weight_packed.assign(static_cast<std::size_t>(n * ((k * b + 31) / 32)), 0);
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t c = 0; c < k; ++c) {
            const int v = val(rng);
            q[static_cast<std::size_t>(r * k + c)] = v;
            auto& word = t.weight_packed[static_cast<std::size_t>(r * ((k * b + 31) / 32) + (b * c) / 32)];
            word = static_cast<std::int32_t>(static_cast<std::uint32_t>(word) |
                                             (static_cast<std::uint32_t>(v + (1 << (bits - 1))) << ((b * c) % 32)));
          }
        std::uniform_real_distribution<float> s(0.001f, 0.05f);
        for (std::int64_t i = 0; i < n * groups; ++i) t.weight_scale.push_back(fp32_to_fp16(s(rng)));
        if (!sym) {
          t.weight_zero_point.assign(static_cast<std::size_t>((n * b + 31) / 32 * groups), 0);
          for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t gi = 0; gi < groups; ++gi) {
              const int z = val(rng);
              zp[static_cast<std::size_t>(r * groups + gi)] = z;
              auto& word = t.weight_zero_point[static_cast<std::size_t>((b * r) / 32 * groups + gi)];
              word = static_cast<std::int32_t>(static_cast<std::uint32_t>(word) |
                                               (static_cast<std::uint32_t>(z + (1 << (bits - 1))) << ((b * r) % 32)));
            }
        }
        const IntMatrix m = unpack_pack_quantized(t, g);
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t c = 0; c < k; ++c) {
            const std::size_t gi = static_cast<std::size_t>(r * groups + (g == -1 ? 0 : c / g));
            const double want = (q[static_cast<std::size_t>(r * k + c)] - zp[gi]) * static_cast<double>(fp16_to_fp32(t.weight_scale[gi]));
            ASSERT_EQ(element(m, r, c), want) << r << "," << c;
          }
      }
}

TEST(IntMatrix, RoundTripsEveryQuantizedFormatExactly) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(20 * 172);
  for (auto& x : w) x = normal(rng);
  for (const QuantSpec spec : {QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt4, 64, Int4Range::kClip},
                               QuantSpec{LowBit::kAsymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt8, 128, Int4Range::kFull},
                               QuantSpec{LowBit::kSymInt8, -1, Int4Range::kFull}}) {
    const QuantMatrix q = quantize_matrix(w.data(), 20, 172, spec);
    const IntMatrix m = to_int_matrix(q);
    ThreadPool pool(3);
    expect_same(to_int_matrix(q, &pool), m);
    const QuantMatrix back = from_int_matrix(m, spec.group_size, spec.type != LowBit::kAsymInt4);
    EXPECT_EQ(back.type, q.type);
    EXPECT_EQ(back.data, q.data);
    EXPECT_EQ(back.scales, q.scales);
    EXPECT_EQ(back.zeros, q.zeros);
    EXPECT_TRUE(back.input_order.empty());
    for (std::int64_t r = 0; r < 20; ++r)
      for (std::int64_t k = 0; k < 172; ++k) {
        std::vector<float> row(172);
        dequantize_row(q, r, row.data());
        ASSERT_EQ(element(m, r, k), row[static_cast<std::size_t>(k)]);
      }
  }
}

TEST(IntMatrix, ActOrderDequantizesByDefinitionAndMultipliesLikeGatheredInput) {
  ThreadPool one(1), two(2);
  for (const int bits : {4, 8})
    for (const bool sym : {true, false}) {
      if (bits == 8 && !sym) continue;
      const std::int64_t n = 24, k = 256, g = 64;
      const IntMatrix m = random_int_matrix(bits, sym, n, k, g, true, 11);
      QuantMatrix w = from_int_matrix(m, g, sym);
      prepare_for_kernels(w);  // read back below through the kernels' layout where it applies
      ASSERT_EQ(w.input_order.size(), static_cast<std::size_t>(k));
      std::vector<float> row(static_cast<std::size_t>(k));
      for (std::int64_t r = 0; r < n; ++r) {
        dequantize_row(w, r, row.data());
        for (std::int64_t c = 0; c < k; ++c) ASSERT_EQ(row[static_cast<std::size_t>(c)], element(m, r, c));
      }
      expect_same(to_int_matrix(w), m);
      QuantMatrix stored = w;  // the same storage without the gather
      stored.input_order.clear();
      for (const std::int64_t tokens : {1, 7}) {
        std::vector<float> x(static_cast<std::size_t>(tokens * k)), xg(x.size());
        std::mt19937 rng(static_cast<std::uint32_t>(tokens));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (auto& v : x) v = normal(rng);
        for (std::int64_t t = 0; t < tokens; ++t)
          for (std::int64_t c = 0; c < k; ++c)
            xg[static_cast<std::size_t>(t * k + c)] = x[static_cast<std::size_t>(t * k + w.input_order[static_cast<std::size_t>(c)])];
        for (const Isa isa : available_isas())
          for (ThreadPool* pool : {&one, &two}) {
            std::vector<float> y(static_cast<std::size_t>(tokens * n)), yg(y.size());
            matmul(w, x.data(), tokens, y.data(), *pool, isa);
            matmul(stored, xg.data(), tokens, yg.data(), *pool, isa);
            EXPECT_EQ(y, yg);
          }
      }
    }
}

TEST(IntMatrix, RejectsWhatWoqCannotRepresent) {
  auto expect_error = [](const IntMatrix& m, std::int64_t g, bool sym, const std::string& what) {
    try {
      from_int_matrix(m, g, sym);
      ADD_FAILURE() << "expected an error containing " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  IntMatrix m = random_int_matrix(4, true, 4, 64, 32, false, 5);
  IntMatrix three = m;
  three.bits = 3;
  expect_error(three, 32, true, "bits = 3 is not supported");
  expect_error(random_int_matrix(8, false, 4, 64, 32, false, 5), 32, false, "8-bit asymmetric");
  IntMatrix bad_zero = m;
  bad_zero.zero[3] = 7;
  expect_error(bad_zero, 32, true, "row 1 group 1: zero point 7 in a symmetric checkpoint");
  IntMatrix out_of_range = m;
  out_of_range.g_idx[10] = 2;
  expect_error(out_of_range, 32, true, "g_idx[10] = 2 is outside [0, 2)");
  IntMatrix lopsided = m;
  lopsided.g_idx[0] = 1;  // group 0 gets 31 features, group 1 gets 33
  expect_error(lopsided, 32, true, "g_idx maps 31 input features to group 0");
}

// AutoAWQ's words, written out by hand from gemm.py / gemv.py: GEMM nibble j of word w holds column
// 8w + order[j] (order 0, 2, 4, 6, 1, 3, 5, 7) of the transposed [K, N] integers; GEMV nibble j holds k = 8w + j.
TEST(AwqPacking, WordsAreAutoAwqs) {
  IntMatrix m = random_int_matrix(4, false, 8, 32, 32, false, 7);
  for (std::int64_t n = 0; n < 8; ++n) {
    for (std::int64_t k = 0; k < 32; ++k) m.q[static_cast<std::size_t>(n * 32 + k)] = static_cast<std::uint8_t>((n + k) % 16);
    m.zero[static_cast<std::size_t>(n)] = static_cast<std::uint16_t>(n + 8);
  }
  const AwqTensors gemm = pack_awq(m, AwqVersion::kGemm, 32);
  EXPECT_EQ(gemm.qweight_shape(), (std::vector<std::int64_t>{32, 1}));
  EXPECT_EQ(static_cast<std::uint32_t>(gemm.qweight[0]), 0x75316420u);  // k = 0: value n at nibble j, n = order[j]
  EXPECT_EQ(static_cast<std::uint32_t>(gemm.qweight[1]), 0x86427531u);  // k = 1: n + 1
  EXPECT_EQ(static_cast<std::uint32_t>(gemm.qzeros[0]), 0xfdb9eca8u);   // zeros n + 8 in the same order
  EXPECT_EQ(gemm.scales[3], m.scale[3]);                                 // [G, N]
  const AwqTensors gemv = pack_awq(m, AwqVersion::kGemv, 32);
  EXPECT_EQ(gemv.qweight_shape(), (std::vector<std::int64_t>{8, 4}));
  EXPECT_EQ(gemv.qzeros_shape(), (std::vector<std::int64_t>{8, 4}));  // calculate_zeros_width(32, 32) = 4
  EXPECT_EQ(gemv.scales_shape(), (std::vector<std::int64_t>{8, 32}));
  EXPECT_EQ(static_cast<std::uint32_t>(gemv.qweight[0]), 0x76543210u);  // row 0, k = 0..7
  EXPECT_EQ(static_cast<std::uint32_t>(gemv.qweight[4 + 1]), 0x0fedcba9u);  // row 1, k = 8..15: 9..15, 0
  EXPECT_EQ(static_cast<std::uint32_t>(gemv.qzeros[4 * 2]), 10u);  // row 2, group 0
  EXPECT_EQ(gemv.scales[8 * 0 + 32 * 2], m.scale[2]);
  EXPECT_EQ(gemv.scales[32 * 2 + 1], 0);  // padding
  EXPECT_EQ(awq_gemv_zeros_width(4096, 128), 4);
  EXPECT_EQ(awq_gemv_zeros_width(11008, 128), 11);
  EXPECT_EQ(awq_gemv_zeros_width(4096, 64), 8);
  EXPECT_EQ(awq_gemv_zeros_width(4096, 32), 16);
  EXPECT_EQ(awq_gemv_zeros_width(2816, 32), 12);  // 88 groups: 11 words, rounded up to 12
}

TEST(AwqPacking, RoundTripsAndRefusesWhatAwqCannotHold) {
  for (const AwqVersion v : {AwqVersion::kGemm, AwqVersion::kGemv})
    for (const std::int64_t g : {32, 64, 128}) {
      const IntMatrix m = random_int_matrix(4, false, 24, 256, g, false, static_cast<std::uint32_t>(g));
      const AwqTensors t = pack_awq(m, v, g);
      expect_same(unpack_awq(t), m);
      ThreadPool pool(2);  // octets of rows over the threads: the same words
      const AwqTensors p = pack_awq(m, v, g, &pool);
      EXPECT_EQ(p.qweight, t.qweight);
      EXPECT_EQ(p.qzeros, t.qzeros);
      EXPECT_EQ(p.scales, t.scales);
    }
  const auto error = test::error_of;
  EXPECT_NE(error([] { awq_layout(AwqVersion::kGemm, 172, 64, 32); }).find("N = 172 is not a multiple of 8"),
            std::string::npos);
  EXPECT_NE(error([] { awq_layout(AwqVersion::kGemm, 64, 172, 32); }).find("K = 172 is not a multiple of group_size 32"),
            std::string::npos);
  EXPECT_NE(error([] { awq_layout(AwqVersion::kGemv, 64, 96, 96); }).find("group sizes 32, 64 and >= 128"),
            std::string::npos);
  const IntMatrix eight = random_int_matrix(8, true, 8, 32, 32, false, 1);
  EXPECT_NE(error([&] { pack_awq(eight, AwqVersion::kGemm, 32); }).find("4-bit"), std::string::npos);
  const IntMatrix act_order = random_int_matrix(4, false, 8, 64, 32, true, 1);
  EXPECT_NE(error([&] { pack_awq(act_order, AwqVersion::kGemm, 32); }).find("no act order"), std::string::npos);
}

}  // namespace
}  // namespace woq
