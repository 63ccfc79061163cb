#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

namespace woq {

void rms_norm(const float* x, const float* weight, std::int64_t n, float eps, float* out) {
  double ss = 0.0;
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

void rope(float* x, std::int64_t heads, std::int64_t head_dim, std::int64_t pos,
          const float* inv_freq) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(angle);
    const float s = std::sin(angle);
    for (std::int64_t h = 0; h < heads; ++h) {
      float* v = x + h * head_dim;
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

void softmax(float* x, std::int64_t n) {
  const float max = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (std::int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

double log_sum_exp(const float* x, std::int64_t n) {
  const double max = *std::max_element(x, x + n);
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - max);
  return max + std::log(sum);
}

double token_nll(const float* logits, std::int64_t vocab, std::int32_t target) {
  return log_sum_exp(logits, vocab) - logits[target];
}

}  // namespace woq
