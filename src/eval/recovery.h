// Recovery: how much of the original's accuracy a quantized variant keeps,
// with standard errors that account for both being scored on the same items.
#pragma once

#include <cstdint>
#include <vector>

namespace woq {

/// A recovery percentage and its standard error (both in percent); NaN where
/// one is undefined (a baseline mean of 0) or cannot be estimated (one item).
struct Recovery {
  double percent = 0;
  double standard_error = 0;
};

/// 100 · mean(variant) / mean(baseline) of one task metric scored item by item
/// on the same items (baseline[i] and variant[i] are item i's scores, e.g. 0/1
/// accuracy or an mc2 probability). The standard error is a paired bootstrap:
/// `resamples` draws of the items with replacement, the ratio recomputed on
/// each draw, seeded by `seed` (so two variants that agree item by item with
/// the baseline get 0, however noisy the task). Throws woq::Error when the
/// vectors differ in length or are empty; a zero baseline mean gives percent
/// = NaN, fewer than two items standard_error = NaN.
Recovery task_recovery(const std::vector<double>& baseline, const std::vector<double>& variant,
                       std::int64_t resamples, std::uint64_t seed);

/// 100 · PPL(baseline) / PPL(variant) from per-token negative log-likelihoods
/// of the same tokens: 100 · exp(mean(nll_b) − mean(nll_v)), with the
/// delta-method standard error percent · sd(d) / sqrt(n) of the paired
/// differences d = nll_v − nll_b (tokens treated as independent, as
/// llama-perplexity's error bar does). Throws woq::Error as task_recovery.
Recovery perplexity_recovery(const std::vector<double>& baseline_nll, const std::vector<double>& variant_nll);

/// The plain average of independent recoveries (different tasks), with the
/// standard error sqrt(Σ se²) / n, over the parts whose percent is defined
/// (not NaN); NaN when none is. Throws woq::Error for an empty list.
Recovery mean_recovery(const std::vector<Recovery>& parts);

}  // namespace woq
