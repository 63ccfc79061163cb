#include "model/llama.h"

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace woq {

namespace {

// RoPE inverse frequencies theta^(-2i/d), adjusted by rope_scaling as in
// transformers' modeling_rope_utils (_compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters).
std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const std::int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  const RopeScaling& rs = c.rope_scaling;
  for (std::int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    if (rs.type == RopeScaling::Type::kLinear) {
      f /= rs.factor;
    } else if (rs.type == RopeScaling::Type::kLlama3) {
      const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
      const double low_wavelen = old_ctx / rs.low_freq_factor;
      const double high_wavelen = old_ctx / rs.high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= rs.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
    }
    inv[static_cast<std::size_t>(i)] = static_cast<float>(f);
  }
  return inv;
}

void add_bias(float* x, const std::vector<float>& bias, std::int64_t rows) {
  if (bias.empty()) return;
  const auto n = static_cast<std::int64_t>(bias.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < n; ++i) x[r * n + i] += bias[static_cast<std::size_t>(i)];
}

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, ThreadPool& pool)
    : config_(std::move(config)), pool_(&pool), inv_freq_(rope_inv_freq(config_)) {}

std::int64_t LlamaModel::context_limit() const {
  const std::int64_t limit = config_.max_position_embeddings;
  return config_.sliding_window > 0 ? std::min(limit, config_.sliding_window) : limit;
}

std::uint64_t LlamaModel::weight_bytes_per_token() const {
  std::uint64_t bytes = (lm_head_ ? *lm_head_ : embed_).bytes() +
                        static_cast<std::uint64_t>(embed_.row_bytes) + final_norm_.size() * sizeof(float);
  for (const LayerWeights& w : layers_) {
    for (const QuantMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.gate, &w.up, &w.down}) bytes += m->bytes();
    bytes += (w.attn_norm.size() + w.mlp_norm.size() + w.bq.size() + w.bk.size() + w.bv.size()) * sizeof(float);
  }
  return bytes;
}

KVCache LlamaModel::make_cache(std::int64_t capacity) const {
  if (capacity < 1 || capacity > context_limit())
    fail("a context of {} tokens is outside [1, {}] (max_position_embeddings{})", capacity,
         context_limit(), config_.sliding_window > 0 ? " or sliding_window" : "");
  return KVCache(config_.num_hidden_layers, capacity, config_.kv_dim());
}

// Causal scaled dot-product attention of t_count new query rows (positions
// pos0 + t) over cached positions [0, pos0 + t]. GQA: query head h reads KV
// head h / (heads / kv_heads). q, out: [t_count, q_dim].
void LlamaModel::attention(const float* q, std::int64_t t_count, std::int64_t pos0,
                           std::int64_t layer, KVCache& cache, float* out) {
  const std::int64_t heads = config_.num_attention_heads;
  const std::int64_t d = config_.head_dim;
  const std::int64_t group = heads / config_.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  pool_->parallel_for(t_count * heads, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> scores(static_cast<std::size_t>(pos0 + t_count));
    for (std::int64_t job = begin; job < end; ++job) {
      // Causal rows grow with t: jobs alternate between early and late tokens
      // (0, T-1, 1, T-2, ...) so that contiguous chunks carry equal work.
      const std::int64_t u = job / heads;
      const std::int64_t t = u % 2 == 0 ? u / 2 : t_count - 1 - u / 2;
      const std::int64_t h = job % heads;
      const std::int64_t kv_off = (h / group) * d;
      const float* qh = q + t * config_.q_dim() + h * d;
      const std::int64_t n = pos0 + t + 1;
      for (std::int64_t s = 0; s < n; ++s) {
        scores[static_cast<std::size_t>(s)] = dot(qh, cache.key(layer, s) + kv_off, d) * scale;
      }
      softmax(scores.data(), n);
      float* oh = out + t * config_.q_dim() + h * d;
      std::fill(oh, oh + d, 0.0f);
      for (std::int64_t s = 0; s < n; ++s)
        axpy(scores[static_cast<std::size_t>(s)], cache.value(layer, s) + kv_off, oh, d);
    }
  });
}

void LlamaModel::forward(std::span<const std::int32_t> tokens, KVCache& cache, bool all_logits,
                         std::vector<float>& logits) {
  const ModelConfig& c = config_;
  const auto t_count = static_cast<std::int64_t>(tokens.size());
  if (t_count == 0) fail("forward: no tokens");
  const std::int64_t pos0 = cache.size();
  if (pos0 + t_count > cache.capacity)
    fail("context full: {} cached + {} new tokens exceed the cache of {}", pos0, t_count, cache.capacity);
  const std::int64_t hidden = c.hidden_size;
  const std::int64_t q_dim = c.q_dim();
  const std::int64_t kv_dim = c.kv_dim();
  const std::int64_t inter = c.intermediate_size;

  std::vector<float> x(static_cast<std::size_t>(t_count * hidden));        // (T, hidden) residual
  std::vector<float> xn(x.size());                                           // (T, hidden) normed
  std::vector<float> q(static_cast<std::size_t>(t_count * q_dim));         // (T, q_dim)
  std::vector<float> k(static_cast<std::size_t>(t_count * kv_dim));        // (T, kv_dim)
  std::vector<float> v(k.size());                                            // (T, kv_dim)
  std::vector<float> att(q.size());                                          // (T, q_dim)
  std::vector<float> gate(static_cast<std::size_t>(t_count * inter));      // (T, intermediate)
  std::vector<float> up(gate.size());                                        // (T, intermediate)
  std::vector<float> proj(x.size());                                         // (T, hidden)

  for (std::int64_t t = 0; t < t_count; ++t) {
    const std::int32_t id = tokens[static_cast<std::size_t>(t)];
    if (id < 0 || id >= c.vocab_size) fail("token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
    dequantize_row(embed_, id, x.data() + t * hidden);
  }
  auto norm_rows = [&](const std::vector<float>& weight) {
    for (std::int64_t t = 0; t < t_count; ++t)
      rms_norm(x.data() + t * hidden, weight.data(), hidden, static_cast<float>(c.rms_norm_eps),
               xn.data() + t * hidden);
  };

  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = layers_[static_cast<std::size_t>(l)];
    norm_rows(w.attn_norm);
    matmul(w.wq, xn.data(), t_count, q.data(), *pool_);
    matmul(w.wk, xn.data(), t_count, k.data(), *pool_);
    matmul(w.wv, xn.data(), t_count, v.data(), *pool_);
    add_bias(q.data(), w.bq, t_count);
    add_bias(k.data(), w.bk, t_count);
    add_bias(v.data(), w.bv, t_count);
    for (std::int64_t t = 0; t < t_count; ++t) {
      rope(q.data() + t * q_dim, c.num_attention_heads, c.head_dim, pos0 + t, inv_freq_.data());
      rope(k.data() + t * kv_dim, c.num_key_value_heads, c.head_dim, pos0 + t, inv_freq_.data());
      std::copy_n(k.data() + t * kv_dim, kv_dim, cache.key(l, pos0 + t));
      std::copy_n(v.data() + t * kv_dim, kv_dim, cache.value(l, pos0 + t));
    }
    attention(q.data(), t_count, pos0, l, cache, att.data());
    matmul(w.wo, att.data(), t_count, proj.data(), *pool_);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];

    norm_rows(w.mlp_norm);
    matmul(w.gate, xn.data(), t_count, gate.data(), *pool_);
    matmul(w.up, xn.data(), t_count, up.data(), *pool_);
    swiglu(gate.data(), up.data(), t_count * inter);
    matmul(w.down, gate.data(), t_count, proj.data(), *pool_);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  cache.length = pos0 + t_count;

  const std::int64_t first = all_logits ? 0 : t_count - 1;
  const std::int64_t rows = t_count - first;
  for (std::int64_t t = first; t < t_count; ++t)
    rms_norm(x.data() + t * hidden, final_norm_.data(), hidden, static_cast<float>(c.rms_norm_eps),
             xn.data() + (t - first) * hidden);
  logits.resize(static_cast<std::size_t>(rows * c.vocab_size));
  matmul(lm_head_ ? *lm_head_ : embed_, xn.data(), rows, logits.data(), *pool_);
}

}  // namespace woq
