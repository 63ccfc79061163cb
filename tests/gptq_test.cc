// GPTQ against an independent f64 implementation written here (column by
// column, no lazy batches, textbook Cholesky), and against RTN on the layer
// output error with correlated inputs.
#include "quantize/gptq.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "formats/group_rule.h"
#include "kernels/blas.h"
#include "test_files.h"

namespace woq {
namespace {

using Mat = std::vector<double>;  // row-major

// Calibration inputs with correlated features: X = Z * A, Z ~ N(0, 1),
// A mixing features (and feature 5 dead when `dead`).
std::vector<float> correlated_inputs(std::int64_t t, std::int64_t k, std::uint32_t seed, bool dead) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Mat a(static_cast<std::size_t>(k * k));
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < k; ++j)
      a[static_cast<std::size_t>(i * k + j)] = (i == j ? 1.0 : 0.0) + 0.3 * normal(rng) * (std::abs(i - j) < 8 ? 1.0 : 0.1);
  std::vector<float> x(static_cast<std::size_t>(t * k));
  std::vector<double> z(static_cast<std::size_t>(k));
  for (std::int64_t r = 0; r < t; ++r) {
    for (auto& v : z) v = normal(rng);
    for (std::int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < k; ++i) s += z[static_cast<std::size_t>(i)] * a[static_cast<std::size_t>(i * k + j)];
      x[static_cast<std::size_t>(r * k + j)] = static_cast<float>(s * (1.0 + 0.1 * static_cast<double>(j % 7)));
    }
    if (dead) x[static_cast<std::size_t>(r * k + 5)] = 0.0f;
  }
  return x;
}

std::vector<float> random_weights(std::int64_t n, std::int64_t k, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<std::size_t>(n * k));
  for (auto& v : w) v = normal(rng);
  return w;
}

Mat hessian_f64(const std::vector<float>& x, std::int64_t t, std::int64_t k) {
  Mat h(static_cast<std::size_t>(k * k), 0.0);
  for (std::int64_t r = 0; r < t; ++r)
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < k; ++j)
        h[static_cast<std::size_t>(i * k + j)] += 2.0 / static_cast<double>(t) * x[static_cast<std::size_t>(r * k + i)] *
                                                  x[static_cast<std::size_t>(r * k + j)];
  return h;
}

// Textbook Cholesky: lower L with a = L L^T.
Mat cholesky(const Mat& a, std::int64_t k) {
  Mat l(a.size(), 0.0);
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j <= i; ++j) {
      double s = a[static_cast<std::size_t>(i * k + j)];
      for (std::int64_t p = 0; p < j; ++p) s -= l[static_cast<std::size_t>(i * k + p)] * l[static_cast<std::size_t>(j * k + p)];
      l[static_cast<std::size_t>(i * k + j)] = i == j ? std::sqrt(s) : s / l[static_cast<std::size_t>(j * k + j)];
    }
  return l;
}

// Inverse of a symmetric positive definite matrix through its Cholesky factor.
Mat spd_inverse(const Mat& a, std::int64_t k) {
  const Mat l = cholesky(a, k);
  Mat inv(a.size(), 0.0);
  for (std::int64_t col = 0; col < k; ++col) {  // solve L L^T x = e_col
    std::vector<double> y(static_cast<std::size_t>(k));
    for (std::int64_t i = 0; i < k; ++i) {
      double s = i == col ? 1.0 : 0.0;
      for (std::int64_t p = 0; p < i; ++p) s -= l[static_cast<std::size_t>(i * k + p)] * y[static_cast<std::size_t>(p)];
      y[static_cast<std::size_t>(i)] = s / l[static_cast<std::size_t>(i * k + i)];
    }
    for (std::int64_t i = k - 1; i >= 0; --i) {
      double s = y[static_cast<std::size_t>(i)];
      for (std::int64_t p = i + 1; p < k; ++p) s -= l[static_cast<std::size_t>(p * k + i)] * inv[static_cast<std::size_t>(p * k + col)];
      inv[static_cast<std::size_t>(i * k + col)] = s / l[static_cast<std::size_t>(i * k + i)];
    }
  }
  return inv;
}

struct Reference {
  std::vector<float> dequant;         // [n, k] in input-feature order
  std::vector<std::uint16_t> scales;  // [n, groups] in processing order of groups
  std::vector<int> zeros;             // [n, groups]
  std::vector<std::int32_t> perm;     // processing order
};

Reference reference_gptq(const std::vector<float>& w_in, std::int64_t n, std::int64_t k, Mat h, const GptqOptions& o) {
  const bool per_channel = o.spec.group_size == -1;
  const std::int64_t g = per_channel ? k : o.spec.group_size;
  const std::int64_t groups = (k + g - 1) / g;
  Mat w(w_in.begin(), w_in.end());
  for (std::int64_t i = 0; i < k; ++i)
    if (h[static_cast<std::size_t>(i * k + i)] == 0) {
      h[static_cast<std::size_t>(i * k + i)] = 1;
      for (std::int64_t r = 0; r < n; ++r) w[static_cast<std::size_t>(r * k + i)] = 0;
    }
  auto fit = [&](std::int64_t r, const std::vector<std::int64_t>& cols) {
    std::vector<float> x;
    for (const auto c : cols) x.push_back(static_cast<float>(w[static_cast<std::size_t>(r * k + c)]));
    return fit_group(o.spec.type, o.spec.int4_range, x.data(), static_cast<std::int64_t>(x.size()));
  };
  Reference ref;
  ref.perm.resize(static_cast<std::size_t>(k));
  std::iota(ref.perm.begin(), ref.perm.end(), 0);
  if (o.desc_act)
    std::stable_sort(ref.perm.begin(), ref.perm.end(), [&](std::int32_t a, std::int32_t b) {
      return h[static_cast<std::size_t>(a * k + a)] > h[static_cast<std::size_t>(b * k + b)];
    });
  // Rules by original group (static / per channel), fitted before any update.
  std::vector<GroupRule> fixed(static_cast<std::size_t>(n * groups));
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t gi = 0; gi < groups; ++gi) {
      std::vector<std::int64_t> cols;
      for (std::int64_t c = gi * g; c < std::min(k, (gi + 1) * g); ++c) cols.push_back(c);
      fixed[static_cast<std::size_t>(r * groups + gi)] = fit(r, cols);
    }
  Mat hp(h.size());
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < k; ++j)
      hp[static_cast<std::size_t>(i * k + j)] = h[static_cast<std::size_t>(ref.perm[static_cast<std::size_t>(i)] * k + ref.perm[static_cast<std::size_t>(j)])];
  double mean = 0;
  for (std::int64_t i = 0; i < k; ++i) mean += hp[static_cast<std::size_t>(i * k + i)] / static_cast<double>(k);
  for (std::int64_t i = 0; i < k; ++i) hp[static_cast<std::size_t>(i * k + i)] += o.damp_percent * mean;
  const Mat l = cholesky(spd_inverse(hp, k), k);  // U = L^T: U[j][c] = L[c][j]
  ref.dequant.assign(static_cast<std::size_t>(n * k), 0.0f);
  ref.scales.assign(static_cast<std::size_t>(n * groups), 0);
  ref.zeros.assign(ref.scales.size(), 0);
  for (std::int64_t r = 0; r < n; ++r) {
    GroupRule rule;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t f = ref.perm[static_cast<std::size_t>(j)];
      std::int64_t slot = 0;
      if (per_channel) {
        rule = fixed[static_cast<std::size_t>(r * groups)];
      } else if (o.static_groups) {
        rule = fixed[static_cast<std::size_t>(r * groups + f / g)];
        slot = f / g;
      } else {
        slot = j / g;
        if (j % g == 0) {
          std::vector<std::int64_t> cols;
          for (std::int64_t c = j; c < std::min(k, j + g); ++c) cols.push_back(ref.perm[static_cast<std::size_t>(c)]);
          rule = fit(r, cols);
        }
      }
      ref.scales[static_cast<std::size_t>(r * groups + slot)] = rule.scale;
      ref.zeros[static_cast<std::size_t>(r * groups + slot)] = rule.zero;
      const double x = w[static_cast<std::size_t>(r * k + f)];
      const float deq = rule.value(rule.quantize(static_cast<float>(x)));
      ref.dequant[static_cast<std::size_t>(r * k + f)] = deq;
      const double e = (x - deq) / l[static_cast<std::size_t>(j * k + j)];
      for (std::int64_t c = j + 1; c < k; ++c)
        w[static_cast<std::size_t>(r * k + ref.perm[static_cast<std::size_t>(c)])] -= e * l[static_cast<std::size_t>(c * k + j)];
    }
  }
  return ref;
}

struct Case {
  QuantSpec spec;
  bool desc_act;
  bool static_groups;
};

TEST(Gptq, MatchesF64Reference) {
  const std::int64_t n = 64, k = 96, t = 256;
  const auto x = correlated_inputs(t, k, 1, true);
  const auto w = random_weights(n, k, 2);
  const Mat h = hessian_f64(x, t, k);
  ThreadPool pool(2);
  std::vector<Case> cases;
  for (const QuantSpec spec : {QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt4, 16, Int4Range::kClip},
                               QuantSpec{LowBit::kAsymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt8, 32, Int4Range::kFull},
                               QuantSpec{LowBit::kSymInt8, -1, Int4Range::kFull}, QuantSpec{LowBit::kAsymInt4, -1, Int4Range::kFull},
                               QuantSpec{LowBit::kAsymInt4, 12, Int4Range::kFull}})  // 12: groups start inside sub-blocks
    for (const bool desc_act : {false, true})
      for (const bool static_groups : {false, true}) cases.push_back({spec, desc_act, static_groups});
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << low_bit_name(c.spec.type) << " g" << c.spec.group_size << " "
                                      << int4_range_name(c.spec.int4_range) << " desc_act=" << c.desc_act
                                      << " static=" << c.static_groups);
    GptqOptions o;
    o.spec = c.spec;
    o.desc_act = c.desc_act;
    o.static_groups = c.static_groups;
    o.block_size = 40;  // not a multiple of the group size: exercises the rounding of blocks
    const QuantMatrix got = gptq_quantize(w.data(), n, k, h, o, pool);
    const Reference ref = reference_gptq(w, n, k, h, o);
    std::vector<float> row(static_cast<std::size_t>(k));
    for (std::int64_t r = 0; r < n; ++r) {
      dequantize_row(got, r, row.data());
      for (std::int64_t j = 0; j < k; ++j) ASSERT_EQ(row[static_cast<std::size_t>(j)], ref.dequant[static_cast<std::size_t>(r * k + j)]) << r << "," << j;
    }
    EXPECT_EQ(got.scales, ref.scales);
    if (c.spec.type == LowBit::kAsymInt4) {
      for (std::size_t i = 0; i < ref.zeros.size(); ++i) ASSERT_EQ(got.zeros[i], ref.zeros[i]) << i;
    }
    const bool act_order = c.desc_act && !c.static_groups && c.spec.group_size != -1;
    if (act_order) {  // same groups (the order inside a group is free)
      ASSERT_EQ(got.input_order.size(), static_cast<std::size_t>(k));
      std::vector<std::int64_t> got_group(static_cast<std::size_t>(k)), ref_group(static_cast<std::size_t>(k));
      for (std::int64_t j = 0; j < k; ++j) {
        got_group[static_cast<std::size_t>(got.input_order[static_cast<std::size_t>(j)])] = j / c.spec.group_size;
        ref_group[static_cast<std::size_t>(ref.perm[static_cast<std::size_t>(j)])] = j / c.spec.group_size;
      }
      EXPECT_EQ(got_group, ref_group);
    } else {
      EXPECT_TRUE(got.input_order.empty());
    }
    for (std::int64_t r = 0; r < n; ++r) EXPECT_EQ(row[5], 0.0f);  // the dead input
  }
}

TEST(Gptq, HessianAccumulatesTwoXtXOverRows) {
  const std::int64_t k = 40, t = 100;
  const auto x = correlated_inputs(t, k, 3, false);
  Hessian h(k);
  h.add(x.data(), 60);
  h.add(x.data() + 60 * k, 40);
  const Mat got = h.matrix();
  const Mat want = hessian_f64(x, t, k);
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
  EXPECT_THROW(Hessian(k).matrix(), Error);
}

// ||W X^T - W_hat X^T||^2 over the calibration rows.
double output_error(const std::vector<float>& w, const QuantMatrix& q, const std::vector<float>& x, std::int64_t t) {
  const std::int64_t n = q.rows, k = q.cols;
  std::vector<float> row(static_cast<std::size_t>(k));
  double total = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    dequantize_row(q, r, row.data());
    for (std::int64_t s = 0; s < t; ++s) {
      double d = 0;
      for (std::int64_t j = 0; j < k; ++j)
        d += (static_cast<double>(w[static_cast<std::size_t>(r * k + j)]) - row[static_cast<std::size_t>(j)]) * x[static_cast<std::size_t>(s * k + j)];
      total += d * d;
    }
  }
  return total;
}

TEST(Gptq, BeatsRoundToNearestOnLayerOutput) {
  const std::int64_t n = 96, k = 256, t = 512;
  const auto x = correlated_inputs(t, k, 4, false);
  const auto w = random_weights(n, k, 5);
  Hessian h(k);
  h.add(x.data(), t);
  ThreadPool pool(2);
  for (const QuantSpec spec : {QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt4, 128, Int4Range::kClip},
                               QuantSpec{LowBit::kAsymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt8, -1, Int4Range::kFull},
                               QuantSpec{LowBit::kSymInt8, 32, Int4Range::kFull}})
    for (const bool desc_act : {false, true}) {
      GptqOptions o;
      o.spec = spec;
      o.desc_act = desc_act;
      const double rtn = output_error(w, quantize_matrix(w.data(), n, k, spec), x, t);
      const double gptq = output_error(w, gptq_quantize(w.data(), n, k, h.matrix(), o, pool), x, t);
      std::printf("GPTQ/RTN output error %-9s g%-4lld %s desc_act=%d: %.3f\n", std::string(low_bit_name(spec.type)).c_str(),
                  static_cast<long long>(spec.group_size), std::string(int4_range_name(spec.int4_range)).c_str(), desc_act,
                  gptq / rtn);
      EXPECT_LE(gptq, 0.8 * rtn) << low_bit_name(spec.type) << " g" << spec.group_size;
    }
}

TEST(Gptq, RejectsBadSettings) {
  const auto w = random_weights(4, 8, 1);
  ThreadPool pool(1);
  GptqOptions o;
  o.spec = {LowBit::kFp16, 32, Int4Range::kFull};
  EXPECT_THROW(gptq_quantize(w.data(), 4, 8, Mat(64, 0.0), o, pool), Error);
  o.spec = {LowBit::kSymInt4, 8, Int4Range::kFull};
  EXPECT_THROW(gptq_quantize(w.data(), 4, 8, Mat(10, 0.0), o, pool), Error);  // wrong Hessian size
  Mat indefinite(64, 0.0);
  for (int i = 0; i < 8; ++i) indefinite[static_cast<std::size_t>(i * 8 + i)] = i == 3 ? -50.0 : 1.0;
  try {
    gptq_quantize(w.data(), 4, 8, indefinite, o, pool);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("raise --damp-percent"), std::string::npos) << e.what();
  }
}

// Two quantizations at once (Python threads) overlap their scopes: the count from before the first comes back
// only when the last ends, and the one left alone keeps its single thread.
TEST(Blas, OverlappingScopesRestoreTheCountFromBeforeTheFirst) {
  const int before = blas_threads();
  auto a = std::make_unique<ScopedBlasThreads>(1);
  auto b = std::make_unique<ScopedBlasThreads>(1);
  if (before == 0) WOQ_SKIP_WITHOUT_REFERENCE("the BLAS is not OpenBLAS (tools/install-deps.sh installs it)");
  a.reset();
  EXPECT_EQ(blas_threads(), 1);
  b.reset();
  EXPECT_EQ(blas_threads(), before);
}

}  // namespace
}  // namespace woq
