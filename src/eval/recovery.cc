#include "eval/recovery.h"

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"

namespace woq {

namespace {

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

void check_paired(std::size_t b, std::size_t v, const char* what) {
  if (b == 0) fail("{} recovery of zero items", what);
  if (b != v) fail("{} recovery: the baseline has {} items, the variant {}", what, b, v);
}

double ratio(double variant_sum, double baseline_sum) {
  return baseline_sum == 0 ? std::numeric_limits<double>::quiet_NaN() : 100.0 * variant_sum / baseline_sum;
}

}  // namespace

Recovery task_recovery(const std::vector<double>& baseline, const std::vector<double>& variant, std::int64_t resamples,
                       std::uint64_t seed) {
  check_paired(baseline.size(), variant.size(), "task");
  double sb = 0, sv = 0;
  for (std::size_t i = 0; i < baseline.size(); ++i) {
    sb += baseline[i];
    sv += variant[i];
  }
  Recovery r{ratio(sv, sb), kUnknown};
  if (baseline.size() < 2 || resamples < 2 || std::isnan(r.percent)) return r;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, baseline.size() - 1);
  double sum = 0, sum2 = 0;
  std::int64_t n = 0;
  for (std::int64_t k = 0; k < resamples; ++k) {
    double b = 0, v = 0;
    for (std::size_t i = 0; i < baseline.size(); ++i) {
      const std::size_t j = pick(rng);
      b += baseline[j];
      v += variant[j];
    }
    if (b == 0) continue;  // a draw with no baseline success has no ratio
    const double x = 100.0 * v / b;
    sum += x;
    sum2 += x * x;
    ++n;
  }
  if (n > 1) {
    const double mean = sum / static_cast<double>(n);
    r.standard_error = 0;
    r.standard_error = std::sqrt(std::max(0.0, (sum2 - static_cast<double>(n) * mean * mean) / static_cast<double>(n - 1)));
  }
  return r;
}

Recovery perplexity_recovery(const std::vector<double>& baseline_nll, const std::vector<double>& variant_nll) {
  check_paired(baseline_nll.size(), variant_nll.size(), "perplexity");
  const double n = static_cast<double>(baseline_nll.size());
  double sum = 0;
  for (std::size_t i = 0; i < baseline_nll.size(); ++i) sum += variant_nll[i] - baseline_nll[i];
  const double mean = sum / n;
  double var = 0;
  for (std::size_t i = 0; i < baseline_nll.size(); ++i) {
    const double d = variant_nll[i] - baseline_nll[i] - mean;
    var += d * d;
  }
  Recovery r{100.0 * std::exp(-mean), kUnknown};
  if (baseline_nll.size() > 1) r.standard_error = r.percent * std::sqrt(var / (n - 1) / n);
  return r;
}

Recovery mean_recovery(const std::vector<Recovery>& parts) {
  if (parts.empty()) fail("average recovery of no metrics");
  Recovery r;
  double var = 0;
  std::size_t defined = 0;
  for (const Recovery& p : parts) {
    if (std::isnan(p.percent)) continue;
    ++defined;
    r.percent += p.percent;
    var += p.standard_error * p.standard_error;  // NaN (unknown) stays NaN
  }
  if (defined == 0) return {kUnknown, kUnknown};
  const double n = static_cast<double>(defined);
  r.percent /= n;
  r.standard_error = std::sqrt(var) / n;
  return r;
}

}  // namespace woq
