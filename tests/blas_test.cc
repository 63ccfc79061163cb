// parallel_sgemm_nt and parallel_ssyrk_upper: the same bits at every pool
// size (GPTQ's output must not depend on --threads) and close to a float64
// reference, at sizes that leave partial panels and bands.
#include "kernels/blas.h"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace woq {
namespace {

std::vector<float> heavy_tailed(std::int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> d(3.0f);  // outliers, as activations have
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = d(rng);
  return v;
}

struct Shape {
  std::int64_t rows, n, k;
};

class ParallelBlas : public ::testing::TestWithParam<int> {};

TEST_P(ParallelBlas, SgemmNtIsTheSameAtAnyPoolSizeAndNearTheF64Product) {
  ThreadPool pool(GetParam()), one(1);
  for (const Shape s : {Shape{1, 1, 1}, Shape{3, 7, 5}, Shape{17, 300, 96}, Shape{64, 33, 257}, Shape{40, 700, 64}}) {
    const auto x = heavy_tailed(s.rows * s.k, 1), w = heavy_tailed(s.n * s.k, 2);
    std::vector<float> got(static_cast<std::size_t>(s.rows * s.n), -1.0f), want(got.size(), -2.0f);
    parallel_sgemm_nt(pool, s.rows, s.n, s.k, x.data(), w.data(), got.data());
    parallel_sgemm_nt(one, s.rows, s.n, s.k, x.data(), w.data(), want.data());
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t j = 0; j < s.n; ++j) {
        const std::size_t i = static_cast<std::size_t>(r * s.n + j);
        ASSERT_EQ(got[i], want[i]) << s.rows << "x" << s.n << "x" << s.k << " at " << r << "," << j;
        double ref = 0, mag = 0;
        for (std::int64_t c = 0; c < s.k; ++c) {
          const double p = static_cast<double>(x[static_cast<std::size_t>(r * s.k + c)]) * w[static_cast<std::size_t>(j * s.k + c)];
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(got[i], ref, 1e-5 * mag + 1e-6);
      }
  }
}

TEST_P(ParallelBlas, SsyrkUpperIsTheSameAtAnyPoolSizeNearTheF64ProductAndLeavesTheLowerTriangle) {
  ThreadPool pool(GetParam()), one(1);
  for (const Shape s : {Shape{1, 0, 1}, Shape{5, 0, 3}, Shape{40, 0, 100}, Shape{129, 0, 513}}) {
    const auto x = heavy_tailed(s.rows * s.k, 3);
    const auto start = heavy_tailed(s.k * s.k, 4);  // it accumulates: c += x^T x
    std::vector<float> got = start, want = start;
    parallel_ssyrk_upper(pool, s.rows, s.k, x.data(), got.data());
    parallel_ssyrk_upper(one, s.rows, s.k, x.data(), want.data());
    for (std::int64_t i = 0; i < s.k; ++i)
      for (std::int64_t j = 0; j < s.k; ++j) {
        const std::size_t at = static_cast<std::size_t>(i * s.k + j);
        if (j < i) {
          ASSERT_EQ(got[at], start[at]) << "lower triangle changed at " << i << "," << j;
          continue;
        }
        ASSERT_EQ(got[at], want[at]) << s.rows << "x" << s.k << " at " << i << "," << j;
        double ref = start[at], mag = std::fabs(start[at]);
        for (std::int64_t r = 0; r < s.rows; ++r) {
          const double p = static_cast<double>(x[static_cast<std::size_t>(r * s.k + i)]) * x[static_cast<std::size_t>(r * s.k + j)];
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(got[at], ref, 1e-5 * mag + 1e-6);
      }
  }
}

// AWQ's clipping errors: d_r h d_rᵀ of strided rows (ld > len).
TEST(Blas, QuadraticFormsAreNearTheF64Sums) {
  const ScopedBlasThreads one_blas_thread(1);
  std::vector<float> scratch;
  for (const Shape s : {Shape{1, 1, 1}, Shape{65, 32, 80}, Shape{130, 17, 17}, Shape{7, 128, 300}}) {
    const std::int64_t rows = s.rows, len = s.n, ld = s.k;
    const auto d = heavy_tailed(rows * ld, 5), x = heavy_tailed(3 * len, 6);
    std::vector<float> h(static_cast<std::size_t>(len * len));  // a Gram matrix: symmetric, positive semi-definite
    for (std::int64_t a = 0; a < len; ++a)
      for (std::int64_t b = 0; b < len; ++b)
        for (std::int64_t t = 0; t < 3; ++t)
          h[static_cast<std::size_t>(a * len + b)] += x[static_cast<std::size_t>(t * len + a)] * x[static_cast<std::size_t>(t * len + b)];
    std::vector<double> got(static_cast<std::size_t>(rows), -1);
    quadratic_forms(rows, len, d.data(), ld, h.data(), got.data(), scratch);
    for (std::int64_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      for (std::int64_t a = 0; a < len; ++a)
        for (std::int64_t b = 0; b < len; ++b) {
          const double p = static_cast<double>(d[static_cast<std::size_t>(r * ld + a)]) *
                           h[static_cast<std::size_t>(a * len + b)] * d[static_cast<std::size_t>(r * ld + b)];
          ref += p;
          mag += std::fabs(p);
        }
      ASSERT_NEAR(got[static_cast<std::size_t>(r)], ref, 1e-5 * mag + 1e-9) << rows << "x" << len << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ParallelBlas, ::testing::Values(1, 2, 3, 7));

}  // namespace
}  // namespace woq
