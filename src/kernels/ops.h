// Element-wise and row-wise operations of a transformer, on fp32 vectors.
// They know nothing of any model; the model composes them.
#pragma once

#include <cstdint>

namespace woq {

/// RMSNorm (Zhang & Sennrich 2019), as HF LlamaRMSNorm: out = x / sqrt(mean(x²) + eps) * weight.
/// x, weight, out: [n]; out may alias x. The mean is accumulated in double.
void rms_norm(const float* x, const float* weight, std::int64_t n, float eps, float* out);

/// Rotary position embedding (Su et al. 2021, RoFormer) in HF's rotate_half
/// layout, applied in place to `heads` vectors of `head_dim` at x[h * head_dim]:
/// for i < head_dim/2, (x_i, x_{i+d/2}) is rotated by angle pos · inv_freq[i].
/// inv_freq: [head_dim / 2].
void rope(float* x, std::int64_t heads, std::int64_t head_dim, std::int64_t pos,
          const float* inv_freq);

/// In-place softmax over x[0, n), numerically stable (max subtracted).
void softmax(float* x, std::int64_t n);

/// log(sum_i exp(x[i])) over x[0, n), in double, shifted by the maximum: the
/// normalizer of every log-probability woq reports (eval, the server's logprobs).
double log_sum_exp(const float* x, std::int64_t n);

/// -log softmax(logits)[target] in double: log_sum_exp(logits) - logits[target].
double token_nll(const float* logits, std::int64_t vocab, std::int32_t target);

/// SwiGLU gate (Shazeer 2020): gate[i] = silu(gate[i]) * up[i], silu(v) = v / (1 + e^-v).
void swiglu(float* gate, const float* up, std::int64_t n);

}  // namespace woq
