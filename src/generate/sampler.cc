#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace woq {

std::int32_t argmax(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void apply_penalties(std::span<float> logits, std::span<const std::pair<std::int32_t, std::int32_t>> counts,
                     float presence, float frequency) {
  for (const auto& [id, count] : counts)
    if (count > 0) logits[static_cast<std::size_t>(id)] -= presence + frequency * static_cast<float>(count);
}

void validate(const Penalties& p) {
  // Bounded so that a penalized logit stays finite (1e-45 would make it inf and the softmax NaN).
  if (!(p.repeat >= 1e-3f && p.repeat <= 1e3f)) fail("repeat_penalty must be in [0.001, 1000], got {}", p.repeat);
  if (p.last_n < -1) fail("repeat_last_n must be >= -1 (-1 = all tokens, 0 = off), got {}", p.last_n);
  if (!(std::fabs(p.presence) <= 1e3f) || !(std::fabs(p.frequency) <= 1e3f))
    fail("presence_penalty and frequency_penalty must be in [-1000, 1000], got {} and {}", p.presence, p.frequency);
}

void apply_penalties(std::span<float> logits, std::span<const std::int32_t> history, const Penalties& p) {
  if (!p.active()) return;
  const std::size_t n = p.last_n < 0 ? history.size() : std::min(history.size(), static_cast<std::size_t>(p.last_n));
  std::map<std::int32_t, std::int32_t> counts;
  for (const std::int32_t id : history.last(n))
    if (id >= 0 && static_cast<std::size_t>(id) < logits.size()) ++counts[id];
  for (const auto& [id, count] : counts) {
    float& l = logits[static_cast<std::size_t>(id)];
    l = l > 0 ? l / p.repeat : l * p.repeat;
  }
  const std::vector<std::pair<std::int32_t, std::int32_t>> pairs(counts.begin(), counts.end());
  apply_penalties(logits, pairs, p.presence, p.frequency);
}

void validate(const SamplingParams& params) {
  if (!(params.temperature >= 0.0f && std::isfinite(params.temperature)))
    fail("temperature must be finite and >= 0, got {}", params.temperature);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) fail("top_p must be in (0, 1], got {}", params.top_p);
  if (params.top_k < 0) fail("top_k must be >= 0 (0 = all tokens), got {}", params.top_k);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { validate(params); }

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

std::int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return argmax(logits);
  const auto vocab = static_cast<std::int32_t>(logits.size());
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const auto by_logit = [&](std::int32_t a, std::int32_t b) {
    const float la = logits[static_cast<std::size_t>(a)];
    const float lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  const std::int32_t k = params_.top_k > 0 ? std::min(params_.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), by_logit);
  order.resize(static_cast<std::size_t>(k));

  // Softmax of logit / T over the kept tokens, in double.
  std::vector<double> p(order.size());
  const double max = logits[static_cast<std::size_t>(order[0])];
  double sum = 0.0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    p[i] = std::exp((logits[static_cast<std::size_t>(order[i])] - max) / params_.temperature);
    sum += p[i];
  }
  std::size_t kept = order.size();
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      cum += p[i] / sum;
      if (cum >= params_.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  const double total = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(kept), 0.0);
  double r = uniform() * total;
  for (std::size_t i = 0; i < kept; ++i) {
    r -= p[i];
    if (r < 0.0) return order[i];
  }
  return order[kept - 1];
}

}  // namespace woq
