#include "quantize/gptq.h"

#include <cblas.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "formats/format_traits.h"
#include "formats/group_rule.h"
#include "formats/int_matrix.h"
#include "kernels/blas.h"

extern "C" {
// LAPACK (Fortran interface), provided by OpenBLAS or reference LAPACK.
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dtrtri_(const char* uplo, const char* diag, const int* n, double* a, const int* lda, int* info);
}

namespace woq {

namespace {

std::size_t at(std::int64_t r, std::int64_t c, std::int64_t ld) { return static_cast<std::size_t>(r * ld + c); }

// Columns quantized one by one between two dgemm updates inside a block (the reference's per-column update of the
// whole block costs N * K * block_size scalar flops; this leaves N * K * kSubBlock of them).
constexpr std::int64_t kSubBlock = 16;

// Calls f(i, j) for every 0 <= i <= j < k, in 64 x 64 tiles: f's transposed accesses stay in cache.
template <typename F>
void for_upper_tiles(std::int64_t k, F f) {
  constexpr std::int64_t kTile = 64;
  for (std::int64_t i0 = 0; i0 < k; i0 += kTile)
    for (std::int64_t j0 = i0; j0 < k; j0 += kTile)
      for (std::int64_t i = i0; i < std::min(k, i0 + kTile); ++i)
        for (std::int64_t j = std::max(i, j0); j < std::min(k, j0 + kTile); ++j) f(i, j);
}

// Replaces the symmetric positive definite `a` [k, k] (row-major) by the
// upper Cholesky factor U of its inverse, a^-1 = U^T U. With J the reversal
// of indices, chol(J a J) = M (lower) gives a = R R^T with R = J M J upper,
// so a^-1 = (R^-1)^T R^-1 and U = R^-1 = J M^-1 J: one Cholesky and one
// triangular inverse (2k^3/3 flops) instead of Cholesky, inverse, Cholesky.
// LAPACK is column-major, so its lower triangle is our upper one.
constexpr std::int64_t kParallelCholeskyK = 4096;

void inverse_cholesky_upper(std::vector<double>& a, std::int64_t k, int threads) {
  std::vector<double> rev(a.size());
  for (std::int64_t i = 0; i < k; ++i)
    for (std::int64_t j = 0; j < k; ++j) rev[at(i, j, k)] = a[at(k - 1 - i, k - 1 - j, k)];
  const int n = static_cast<int>(k);
  int info = 0;
  // GPTQ's one O(K^3) step (K = 14336 for Llama-3-8B's down_proj: ~40 s a layer on one thread) runs on
  // woq's thread count (-t) from K = kParallelCholeskyK up; below, on one thread: OpenBLAS's threads wait
  // in a sched_yield loop for a while after each call, which costs more than they save on a small matrix
  // and, on a machine whose other cores are busy, many times over (the `small` preset, 2 cores, the other
  // busy: 22.5 s on OpenBLAS's threads, 15.2 s on one). The factor is the same bits at any count.
  std::optional<ScopedBlasThreads> blas_threads;
  if (k < kParallelCholeskyK) {
    blas_threads.emplace(1);
  } else if (threads > 0) {
    blas_threads.emplace(threads);
  }
  dpotrf_("L", &n, rev.data(), &n, &info);
  if (info > 0)
    fail("GPTQ: the damped Hessian is not positive definite (leading minor {} of {}); raise --damp-percent", info,
         n);
  if (info == 0) dtrtri_("L", "N", &n, rev.data(), &n, &info);
  if (info != 0) fail("GPTQ: inverting the Hessian failed (LAPACK info {}); raise --damp-percent", info);
  // rev's row-major upper triangle holds (M^-1)^T: U[i][j] = M^-1[k-1-i][k-1-j] = rev[k-1-j][k-1-i].
  std::fill(a.begin(), a.end(), 0.0);
  for_upper_tiles(k, [&](std::int64_t i, std::int64_t j) { a[at(i, j, k)] = rev[at(k - 1 - j, k - 1 - i, k)]; });
}

}  // namespace

Hessian::Hessian(std::int64_t k) : k_(k) {
  if (k < 1) fail("Hessian: K must be positive, got {}", k);
  sum_.assign(static_cast<std::size_t>(k * k), 0.0f);
}

void Hessian::add(const float* x, std::int64_t rows, ThreadPool* pool) {
  if (rows <= 0) return;
  if (pool != nullptr) {
    parallel_ssyrk_upper(*pool, rows, k_, x, sum_.data());
  } else {
    // Row-major C = X^T X, upper triangle: column-major C' = C^T, lower.
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(k_), static_cast<int>(rows), 1.0f, x,
                static_cast<int>(k_), 1.0f, sum_.data(), static_cast<int>(k_));
  }
  rows_ += rows;
}

std::vector<double> Hessian::matrix() const {
  if (rows_ == 0) fail("Hessian: no calibration rows were added");
  std::vector<double> h(sum_.size());
  const double scale = 2.0 / static_cast<double>(rows_);
  for_upper_tiles(k_, [&](std::int64_t i, std::int64_t j) { h[at(i, j, k_)] = h[at(j, i, k_)] = scale * sum_[at(i, j, k_)]; });
  return h;
}

GptqHessian prepare_gptq(std::vector<double> h, std::int64_t k, const GptqOptions& options, int threads) {
  if (k < 1) fail("GPTQ: K must be positive, got {}", k);
  if (h.size() != static_cast<std::size_t>(k * k)) fail("GPTQ: Hessian has {} entries, expected {}", h.size(), k * k);
  if (!(options.damp_percent > 0 && options.damp_percent <= 1))
    fail("GPTQ: damp_percent must be in (0, 1], got {}", options.damp_percent);
  GptqHessian p;
  p.k = k;
  p.dead.assign(static_cast<std::size_t>(k), false);
  for (std::int64_t i = 0; i < k; ++i)
    if (h[at(i, i, k)] == 0.0) {  // dead input: nothing to reconstruct
      h[at(i, i, k)] = 1.0;
      p.dead[static_cast<std::size_t>(i)] = true;
    }
  // Processing order: by decreasing diag(H) with desc_act (stable for ties).
  p.perm.resize(static_cast<std::size_t>(k));
  std::iota(p.perm.begin(), p.perm.end(), 0);
  if (options.desc_act) {
    std::stable_sort(p.perm.begin(), p.perm.end(),
                     [&](std::int32_t a, std::int32_t b) { return h[at(a, a, k)] > h[at(b, b, k)]; });
    std::vector<double> hp(h.size());
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < k; ++j)
        hp[at(i, j, k)] = h[at(p.perm[static_cast<std::size_t>(i)], p.perm[static_cast<std::size_t>(j)], k)];
    h.swap(hp);
  }
  double mean_diag = 0;
  for (std::int64_t i = 0; i < k; ++i) mean_diag += h[at(i, i, k)];
  mean_diag /= static_cast<double>(k);
  for (std::int64_t i = 0; i < k; ++i) h[at(i, i, k)] += options.damp_percent * mean_diag;
  inverse_cholesky_upper(h, k, threads);
  p.u = std::move(h);
  return p;
}

QuantMatrix gptq_quantize(const float* w_in, std::int64_t n, std::int64_t k, std::vector<double> h,
                          const GptqOptions& options, ThreadPool& pool) {
  return gptq_quantize(w_in, n, k, prepare_gptq(std::move(h), k, options, pool.size()), options, pool);
}

QuantMatrix gptq_quantize(const float* w_in, std::int64_t n, std::int64_t k, const GptqHessian& prepared,
                          const GptqOptions& options, ThreadPool& pool) {
  const QuantSpec& spec = options.spec;
  if (!is_quantized(spec.type)) fail("GPTQ quantizes to integer formats, not {}", low_bit_name(spec.type));
  validate(spec);
  if (n < 1 || k < 1) fail("GPTQ: empty matrix [{}, {}]", n, k);
  if (prepared.k != k) fail("GPTQ: the Hessian is for K = {}, the matrix has K = {}", prepared.k, k);
  if (options.block_size < 1) fail("GPTQ: block_size must be positive, got {}", options.block_size);
  const bool per_channel = spec.group_size == -1 || spec.group_size >= k;
  // The zero of a group's unsigned integers, as checkpoints store them.
  const FormatTraits& format = format_traits(spec.type);
  const auto stored_zero = [&](const GroupRule& rule) { return format.fixed_zero >= 0 ? format.fixed_zero : rule.zero; };
  const std::int64_t g = per_channel ? k : spec.group_size;
  const std::int64_t groups = (k + g - 1) / g;
  const std::vector<std::int32_t>& perm = prepared.perm;
  const std::vector<double>& u = prepared.u;

  std::vector<double> w(static_cast<std::size_t>(n * k));
  std::copy_n(w_in, w.size(), w.begin());
  for (std::int64_t i = 0; i < k; ++i)
    if (prepared.dead[static_cast<std::size_t>(i)])
      for (std::int64_t r = 0; r < n; ++r) w[at(r, i, k)] = 0.0;

  // Rules fitted once on the (original) weights: per channel, or static groups.
  std::vector<GroupRule> rules(static_cast<std::size_t>(n * groups));
  const bool fit_up_front = per_channel || options.static_groups;
  if (fit_up_front)
    pool.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
      std::vector<float> x(static_cast<std::size_t>(g));
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t gi = 0; gi < groups; ++gi) {
          const std::int64_t len = std::min(g, k - gi * g);
          for (std::int64_t j = 0; j < len; ++j) x[static_cast<std::size_t>(j)] = static_cast<float>(w[at(r, gi * g + j, k)]);
          rules[at(r, gi, groups)] = fit_group(spec.type, spec.int4_range, x.data(), len);
        }
    });

  if (options.desc_act) {  // W in processing order
    std::vector<double> wp(w.size());
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t j = 0; j < k; ++j) wp[at(r, j, k)] = w[at(r, perm[static_cast<std::size_t>(j)], k)];
    w.swap(wp);
  }

  // Groups form in processing order unless fitted up front.
  const std::int64_t block_size = std::min(options.block_size, k);
  const std::int64_t block =
      per_channel || options.static_groups ? block_size : std::max(g, block_size / g * g);
  std::vector<std::uint8_t> q(static_cast<std::size_t>(n * k));  // stored integers, processing order
  // Rows are independent given U: each of the pool's threads solves its own rows, its BLAS calls on one thread.
  const ScopedBlasThreads one_blas_thread(1);
  pool.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
    const std::int64_t rows = r1 - r0;
    double* const w0 = w.data() + r0 * k;
    std::vector<double> err(static_cast<std::size_t>(rows * block));
    std::vector<float> x(static_cast<std::size_t>(g));
    for (std::int64_t i1 = 0; i1 < k; i1 += block) {
      const std::int64_t i2 = std::min(k, i1 + block);
      // The block's columns in sub-blocks of kSubBlock: column by column inside one (each error updates the
      // sub-block's later columns), then one dgemm carries the sub-block's errors to the rest of the block. A group
      // fitted as it forms opens a sub-block, so that its columns hold every earlier column's update when fitted.
      for (std::int64_t s1 = i1; s1 < i2;) {
        std::int64_t s2 = std::min(i2, s1 + kSubBlock);
        if (!fit_up_front) s2 = std::min(s2, (s1 / g + 1) * g);
        for (std::int64_t r = r0; r < r1; ++r) {
          double* row = w.data() + r * k;
          for (std::int64_t j = s1; j < s2; ++j) {
            const std::int64_t feature = perm[static_cast<std::size_t>(j)];
            GroupRule* rule;
            if (fit_up_front) {
              rule = &rules[at(r, per_channel ? 0 : feature / g, groups)];
            } else {
              rule = &rules[at(r, j / g, groups)];
              if (j % g == 0) {
                const std::int64_t len = std::min(g, k - j);
                for (std::int64_t c = 0; c < len; ++c) x[static_cast<std::size_t>(c)] = static_cast<float>(row[j + c]);
                *rule = fit_group(spec.type, spec.int4_range, x.data(), len);
              }
            }
            const int qi = rule->quantize(static_cast<float>(row[j]));
            q[at(r, j, k)] = static_cast<std::uint8_t>(qi - rule->zero + stored_zero(*rule));
            const double e = (row[j] - static_cast<double>(rule->value(qi))) / u[at(j, j, k)];
            for (std::int64_t c = j + 1; c < s2; ++c) row[c] -= e * u[at(j, c, k)];
            err[at(r - r0, j - i1, block)] = e;
          }
        }
        if (s2 < i2)
          cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(i2 - s2),
                      static_cast<int>(s2 - s1), -1.0, err.data() + (s1 - i1), static_cast<int>(block),
                      u.data() + s1 * k + s2, static_cast<int>(k), 1.0, w0 + s2, static_cast<int>(k));
        s1 = s2;
      }
      if (i2 < k)  // lazy batch update of the columns after the block
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(k - i2),
                    static_cast<int>(i2 - i1), -1.0, err.data(), static_cast<int>(block), u.data() + i1 * k + i2,
                    static_cast<int>(k), 1.0, w0 + i2, static_cast<int>(k));
    }
  });

  // Back to input-feature order, in the integer form every checkpoint shares.
  IntMatrix m;
  m.bits = format.value_bits;
  m.rows = n;
  m.cols = k;
  m.groups = groups;
  m.q.resize(q.size());
  m.zero.resize(static_cast<std::size_t>(n * groups));
  m.scale.resize(m.zero.size());
  m.g_idx.resize(static_cast<std::size_t>(k));
  for (std::int64_t j = 0; j < k; ++j) {
    const std::int64_t feature = perm[static_cast<std::size_t>(j)];
    m.g_idx[static_cast<std::size_t>(feature)] =
        static_cast<std::int32_t>(per_channel ? 0 : (options.static_groups ? feature / g : j / g));
    for (std::int64_t r = 0; r < n; ++r) m.q[at(r, feature, k)] = q[at(r, j, k)];
  }
  for (std::size_t i = 0; i < rules.size(); ++i) {
    m.zero[i] = static_cast<std::uint16_t>(stored_zero(rules[i]));
    m.scale[i] = rules[i].scale;
  }
  QuantMatrix out = from_int_matrix(m, spec.group_size, format.fixed_zero >= 0, &pool);
  out.int4_range = spec.int4_range;
  return out;
}

}  // namespace woq
