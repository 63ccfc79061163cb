#include "eval/logit_compare.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "eval/perplexity.h"

namespace woq {

namespace {

// log-softmax of x[0, n) in double.
std::vector<double> log_softmax(const float* x, std::int64_t n) {
  const double log_z = log_sum_exp(x, n);
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = x[i] - log_z;
  return out;
}

}  // namespace

LogitAgreement compare_logits(std::span<const float> ref, std::span<const float> cand,
                              std::int64_t vocab) {
  if (vocab <= 0 || ref.size() != cand.size() || ref.size() % static_cast<std::size_t>(vocab) != 0)
    fail("compare_logits: {} and {} logits do not form equal [positions, {}] arrays", ref.size(),
         cand.size(), vocab);
  LogitAgreement a;
  a.positions = static_cast<std::int64_t>(ref.size()) / vocab;
  std::int64_t same = 0;
  double kl_sum = 0.0;
  for (std::int64_t p = 0; p < a.positions; ++p) {
    const float* r = ref.data() + p * vocab;
    const float* c = cand.data() + p * vocab;
    if (std::max_element(r, r + vocab) - r == std::max_element(c, c + vocab) - c) ++same;
    const auto lr = log_softmax(r, vocab);
    const auto lc = log_softmax(c, vocab);
    double kl = 0.0;
    for (std::size_t i = 0; i < lr.size(); ++i) kl += std::exp(lr[i]) * (lr[i] - lc[i]);
    kl_sum += kl;
    a.max_kl = std::max(a.max_kl, kl);
  }
  if (a.positions > 0) {
    a.top1_agreement = static_cast<double>(same) / static_cast<double>(a.positions);
    a.mean_kl = kl_sum / static_cast<double>(a.positions);
  }
  return a;
}

}  // namespace woq
