#include "quantize/awq.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/blas.h"

namespace woq {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::size_t idx(LinearRole role) { return static_cast<std::size_t>(role); }

// Mean |x| per channel of rows [R, k] (AutoAWQ's x_mean), summed in f64.
std::vector<double> channel_abs_mean(const std::vector<float>& x, std::int64_t k) {
  std::vector<double> mean(static_cast<std::size_t>(k), 0.0);
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / k;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < k; ++c) mean[static_cast<std::size_t>(c)] += std::abs(x[static_cast<std::size_t>(r * k + c)]);
  for (double& m : mean) m /= static_cast<double>(std::max<std::int64_t>(rows, 1));
  return mean;
}

// Columns of [rows, k] row-major `m` multiplied (divide = false) or divided by s.
void scale_columns(std::vector<float>& m, std::int64_t k, const std::vector<float>& s, bool divide) {
  for (std::size_t i = 0; i < m.size(); ++i) {
    const float f = s[i % static_cast<std::size_t>(k)];
    m[i] = divide ? m[i] / f : m[i] * f;
  }
}

// W [n, k] as `spec` stores it, dequantized: the values round to nearest gives.
std::vector<float> fake_quantize(const std::vector<float>& w, std::int64_t n, std::int64_t k, const QuantSpec& spec,
                                 ThreadPool& pool) {
  const QuantMatrix q = quantize_matrix(w.data(), n, k, spec, &pool);
  std::vector<float> out(w.size());
  pool.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) dequantize_row(q, r, out.data() + r * k);
  });
  return out;
}

// Q(W·s)/s of W [n, k] in `spec`.
std::vector<float> scaled_fake_quantize(const std::vector<float>& w, std::int64_t n, std::int64_t k,
                                        const std::vector<float>& s, const QuantSpec& spec, ThreadPool& pool) {
  std::vector<float> ws = w;
  scale_columns(ws, k, s, false);
  std::vector<float> q = fake_quantize(ws, n, k, spec, pool);
  scale_columns(q, k, s, true);
  return q;
}

double mean_squared_error(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    sum += d * d;
  }
  return sum / static_cast<double>(std::max<std::size_t>(a.size(), 1));
}

// y [rows, n] = x [rows, k] W^T.
std::vector<float> matmul(ThreadPool& pool, const std::vector<float>& x, const std::vector<float>& w, std::int64_t n,
                          std::int64_t k) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / k;
  std::vector<float> y(static_cast<std::size_t>(rows * n));
  parallel_sgemm_nt(pool, rows, n, k, x.data(), w.data(), y.data());
  return y;
}

// The Llama MLP down(silu(gate x) * up x) on rows x [R, hidden].
std::vector<float> mlp(ThreadPool& pool, const std::vector<float>& x, const std::vector<float>& gate,
                       const std::vector<float>& up, const std::vector<float>& down, std::int64_t hidden,
                       std::int64_t inter) {
  std::vector<float> g = matmul(pool, x, gate, inter, hidden);
  const std::vector<float> u = matmul(pool, x, up, inter, hidden);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  return matmul(pool, g, down, hidden, inter);
}

// Clips W [n, k] per output row and group to the threshold (max |W| of the group shrunk by i / grid,
// i < grid / 2) whose quantized group output on the sampled inputs x [T, k] is closest to the float one
// (AutoAWQ's _compute_best_clip).
void clip_weights(std::vector<float>& w, std::int64_t n, std::int64_t k, const std::vector<float>& x,
                  const QuantSpec& spec, int grid, ThreadPool& pool) {
  const std::int64_t g_len = spec.group_size <= 0 ? k : std::min(spec.group_size, k);
  const std::int64_t groups = (k + g_len - 1) / g_len;
  const std::int64_t t = static_cast<std::int64_t>(x.size()) / k;
  // Each group's columns of x and of W, contiguous.
  const auto columns = [&](const std::vector<float>& m, std::int64_t rows, std::int64_t g) {
    const std::int64_t c0 = g * g_len, len = std::min(g_len, k - c0);
    std::vector<float> out(static_cast<std::size_t>(rows * len));
    for (std::int64_t r = 0; r < rows; ++r)
      std::copy_n(m.begin() + r * k + c0, len, out.begin() + r * len);
    return out;
  };
  std::vector<std::vector<float>> xg(static_cast<std::size_t>(groups)), org(static_cast<std::size_t>(groups));
  std::vector<float> amax(static_cast<std::size_t>(n * groups), 0.0f);
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t len = std::min(g_len, k - g * g_len);
    xg[static_cast<std::size_t>(g)] = columns(x, t, g);
    org[static_cast<std::size_t>(g)] = matmul(pool, xg[static_cast<std::size_t>(g)], columns(w, n, g), n, len);
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t c = 0; c < len; ++c)
        amax[static_cast<std::size_t>(r * groups + g)] =
            std::max(amax[static_cast<std::size_t>(r * groups + g)], std::abs(w[static_cast<std::size_t>(r * k + g * g_len + c)]));
  }
  std::vector<float> best = amax;
  std::vector<double> best_err(amax.size(), std::numeric_limits<double>::infinity());
  for (int i = 0; i < grid / 2; ++i) {
    const float shrink = 1.0f - static_cast<float>(i) / static_cast<float>(grid);
    std::vector<float> clipped = w;
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t c = 0; c < k; ++c) {
        const float m = amax[static_cast<std::size_t>(r * groups + c / g_len)] * shrink;
        float& v = clipped[static_cast<std::size_t>(r * k + c)];
        v = std::clamp(v, -m, m);
      }
    const std::vector<float> q = fake_quantize(clipped, n, k, spec, pool);
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t len = std::min(g_len, k - g * g_len);
      const std::vector<float> out = matmul(pool, xg[static_cast<std::size_t>(g)], columns(q, n, g), n, len);
      const std::vector<float>& ref = org[static_cast<std::size_t>(g)];
      for (std::int64_t r = 0; r < n; ++r) {
        double err = 0;
        for (std::int64_t s = 0; s < t; ++s) {
          const double d = static_cast<double>(out[static_cast<std::size_t>(s * n + r)]) - ref[static_cast<std::size_t>(s * n + r)];
          err += d * d;
        }
        const std::size_t j = static_cast<std::size_t>(r * groups + g);
        if (err / static_cast<double>(t) < best_err[j]) {
          best_err[j] = err / static_cast<double>(t);
          best[j] = amax[j] * shrink;
        }
      }
    }
  }
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < k; ++c) {
      const float m = best[static_cast<std::size_t>(r * groups + c / g_len)];
      float& v = w[static_cast<std::size_t>(r * k + c)];
      v = std::clamp(v, -m, m);
    }
}

// Every `step`-th row of x [R, k], at most `count` rows.
std::vector<float> sample_rows(const std::vector<float>& x, std::int64_t k, std::int64_t count) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / k;
  const std::int64_t step = std::max<std::int64_t>(1, rows / std::max<std::int64_t>(count, 1));
  std::vector<float> out;
  for (std::int64_t r = 0; r < rows && static_cast<std::int64_t>(out.size()) / k < count; r += step)
    out.insert(out.end(), x.begin() + r * k, x.begin() + (r + 1) * k);
  return out;
}

std::vector<float> read_vector(const TensorStore& store, const std::string& name) {
  const TensorView& t = store.get(name);
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  tensor_to_f32(t, v.data());
  return v;
}

}  // namespace

std::vector<double> awq_weight_mean(const std::vector<std::pair<const float*, std::int64_t>>& w, std::int64_t k,
                                    std::int64_t group_size) {
  const std::int64_t g_len = group_size <= 0 ? k : std::min(group_size, k);
  std::vector<double> mean(static_cast<std::size_t>(k), 0.0);
  std::int64_t total = 0;
  for (const auto& [data, rows] : w) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = data + r * k;
      for (std::int64_t c0 = 0; c0 < k; c0 += g_len) {
        const std::int64_t c1 = std::min(k, c0 + g_len);
        double amax = 0;
        for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, static_cast<double>(std::abs(row[c])));
        for (std::int64_t c = c0; c < c1; ++c) mean[static_cast<std::size_t>(c)] += std::abs(row[c]) / (amax + 1e-6);
      }
    }
    total += rows;
  }
  for (double& m : mean) m /= static_cast<double>(std::max<std::int64_t>(total, 1));
  return mean;
}

AwqScale awq_search_scale(const std::vector<double>& x_mean, const std::vector<double>& w_mean, int grid,
                          const std::function<double(const std::vector<float>&)>& loss) {
  if (grid < 1) fail("AWQ's scale grid needs at least 1 point, got {}", grid);
  AwqScale best;
  best.loss = std::numeric_limits<double>::infinity();
  std::vector<double> s(x_mean.size());
  for (int i = 0; i < grid; ++i) {
    const double ratio = static_cast<double>(i) / grid;
    for (std::size_t c = 0; c < s.size(); ++c)
      s[c] = std::max(std::pow(x_mean[c], ratio) / (std::pow(w_mean[c], 1 - ratio) + 1e-4), 1e-4);
    const double norm = std::sqrt(*std::max_element(s.begin(), s.end()) * *std::min_element(s.begin(), s.end()));
    std::vector<float> scales(s.size());
    for (std::size_t c = 0; c < s.size(); ++c) {
      const double v = s[c] / norm;
      scales[c] = std::isfinite(v) && v > 0 ? static_cast<float>(v) : 1.0f;
    }
    const double l = loss(scales);
    if (l < best.loss) {
      best.loss = l;
      best.ratio = ratio;
      best.scales = std::move(scales);
    }
  }
  if (best.scales.empty()) fail("AWQ's scale search found no finite loss (non-finite activations?)");
  return best;
}

namespace {

// AWQ of one decoder block (the steps of awq.h), on the calibration hidden states `states` (advanced to the
// next block's inputs by run()).
class AwqBlock {
 public:
  using Weights = std::array<const std::vector<float>*, kBlockLinears.size()>;

  AwqBlock(LlamaModel& model, const TensorStore& store, const AwqOptions& options, ThreadPool& pool,
           std::int64_t layer, std::int64_t length, std::vector<std::vector<float>>& states)
      : model_(model), store_(store), options_(options), pool_(pool), c_(model.config()), layer_(layer),
        length_(length), states_(states) {
    report_.layer = layer;
  }

  QuantizedBlock run() {
    auto t0 = Clock::now();
    for (const LinearSpec& s : kBlockLinears) read_float_linear(store_, c_, layer_, s.role, w_[idx(s.role)]);
    attn_norm_ = read_vector(store_, layer_tensor(layer_, kAttnNorm.hf));
    mlp_norm_ = read_vector(store_, layer_tensor(layer_, kMlpNorm.hf));
    record();
    report_.forward = seconds_since(t0);
    t0 = Clock::now();
    search_scales();
    report_.search = seconds_since(t0);
    t0 = Clock::now();
    if (options_.clip) clip();
    report_.clip = seconds_since(t0);
    t0 = Clock::now();
    QuantizedBlock out = quantize();
    if (options_.propagate_quantized) propagate(out.linears);
    out.replaced[layer_tensor(layer_, kAttnNorm.hf)] = std::move(attn_norm_);
    out.replaced[layer_tensor(layer_, kMlpNorm.hf)] = std::move(mlp_norm_);
    report_.quantize = seconds_since(t0);
    return out;
  }

  const AwqLayerReport& report() const { return report_; }

 private:
  std::pair<std::int64_t, std::int64_t> dims(LinearRole role) const { return block_linear_shape(c_, role); }

  // A LinearCompute with `weights` (null: not needed, zeros), appending o's and down's outputs when asked.
  LlamaModel::LinearCompute compute_with(const Weights& weights, std::vector<float>* o_out,
                                         std::vector<float>* down_out) {
    return [this, weights, o_out, down_out](LinearRole role, const float* in, std::int64_t rows, float* y) {
      const auto [n, k] = dims(role);
      if (weights[idx(role)] == nullptr) {
        std::fill(y, y + rows * n, 0.0f);
        return;
      }
      parallel_sgemm_nt(pool_, rows, n, k, in, weights[idx(role)]->data(), y);
      if (role == LinearRole::kO && o_out != nullptr) o_out->insert(o_out->end(), y, y + rows * n);
      if (role == LinearRole::kDown && down_out != nullptr) down_out->insert(down_out->end(), y, y + rows * n);
    };
  }

  // Step 1: the float block on every sequence, recording the linears' inputs (by input owner: q, o, gate, down)
  // and the outputs of o and down; the states move on to the next block's inputs.
  void record() {
    inputs_ = states_;
    const LlamaModel::LinearObserver observe = [this](LinearRole role, const float* in, std::int64_t rows) {
      if (role == LinearRole::kQ || role == LinearRole::kO || role == LinearRole::kGate || role == LinearRole::kDown)
        x_[idx(role)].insert(x_[idx(role)].end(), in, in + rows * dims(role).second);
    };
    Weights originals{};
    for (const LinearSpec& s : kBlockLinears) originals[idx(s.role)] = &w_[idx(s.role)];
    const LlamaModel::LinearCompute compute = compute_with(originals, &y_o_, &y_down_);
    for (auto& state : states_) model_.forward_block(layer_, state.data(), length_, observe, compute);
  }

  // The format linear `role` is written in.
  const QuantSpec& spec_of(LinearRole role) const {
    return options_.plan ? options_.plan->linear(layer_, role) : options_.spec;
  }

  // Q(W·s)/s of linear `role` (W itself for a layer kept float).
  std::vector<float> candidate(LinearRole role, const std::vector<float>& s) {
    if (!is_quantized(spec_of(role).type)) return w_[idx(role)];
    return scaled_fake_quantize(w_[idx(role)], dims(role).first, dims(role).second, s, spec_of(role), pool_);
  }

  // Searches one group's scales and multiplies its columns by them; returns them.
  std::vector<float> search(const char* group, const std::vector<LinearRole>& roles,
                            const std::function<double(const std::vector<float>&)>& loss) {
    const std::int64_t k = dims(roles.front()).second;
    std::vector<std::pair<const float*, std::int64_t>> ws;
    for (const LinearRole r : roles) ws.emplace_back(w_[idx(r)].data(), dims(r).first);
    AwqScale chosen = awq_search_scale(channel_abs_mean(x_[idx(roles.front())], k),
                                       awq_weight_mean(ws, k, options_.spec.group_size), options_.grid, loss);
    chosen.group = group;
    chosen.loss_unscaled = loss(std::vector<float>(static_cast<std::size_t>(k), 1.0f));
    if (chosen.loss_unscaled <= chosen.loss) {  // no grid point beats leaving the group unscaled
      chosen.ratio = -1;
      chosen.loss = chosen.loss_unscaled;
      chosen.scales.assign(static_cast<std::size_t>(k), 1.0f);
    }
    for (const LinearRole r : roles) {
      scale_columns(w_[idx(r)], k, chosen.scales, false);
      in_scale_[idx(r)] = chosen.scales;
    }
    scale_columns(x_[idx(roles.front())], k, chosen.scales, true);
    report_.scales.push_back(chosen);
    return report_.scales.back().scales;
  }

  // Divides the rows of `role` (its outputs) by s.
  void divide_rows(LinearRole role, const std::vector<float>& s) {
    const std::size_t k = static_cast<std::size_t>(dims(role).second);
    for (std::size_t i = 0; i < w_[idx(role)].size(); ++i) w_[idx(role)][i] /= s[i / k];
    out_scale_[idx(role)] = s;
  }

  // Step 2: each group's scales, folded before the next group is searched.
  void search_scales() {
    const std::int64_t hidden = c_.hidden_size, inter = c_.intermediate_size;
    // q/k/v: the attention's output (after o_proj), rerun with Q(W·s)/s for q, k and v.
    const std::vector<float> s_qkv = search("q/k/v", {LinearRole::kQ, LinearRole::kK, LinearRole::kV},
                                            [&](const std::vector<float>& s) {
      const std::vector<float> q = candidate(LinearRole::kQ, s), k = candidate(LinearRole::kK, s),
                               v = candidate(LinearRole::kV, s);
      Weights ws{};
      ws[idx(LinearRole::kQ)] = &q;
      ws[idx(LinearRole::kK)] = &k;
      ws[idx(LinearRole::kV)] = &v;
      ws[idx(LinearRole::kO)] = &w_[idx(LinearRole::kO)];
      std::vector<float> out;
      const LlamaModel::LinearCompute compute = compute_with(ws, &out, nullptr);
      for (const auto& input : inputs_) {
        std::vector<float> h = input;
        model_.forward_block(layer_, h.data(), length_, nullptr, compute);
      }
      return mean_squared_error(out, y_o_);
    });
    for (std::size_t i = 0; i < attn_norm_.size(); ++i) attn_norm_[i] /= s_qkv[i];
    // o after v: only where v's output is o's input, feature for feature.
    const bool v_bias = store_.find(linear_tensor(layer_, LinearRole::kV, "bias")) != nullptr;
    if (dims(LinearRole::kV).first == dims(LinearRole::kO).second && !v_bias) {
      const std::int64_t k = dims(LinearRole::kO).second;
      divide_rows(LinearRole::kV, search("o", {LinearRole::kO}, [&](const std::vector<float>& s) {
                    return mean_squared_error(matmul(pool_, x_[idx(LinearRole::kO)], candidate(LinearRole::kO, s),
                                                     hidden, k), y_o_);
                  }));
    } else {
      report_.skipped.push_back(v_bias ? "o: v has a bias" : "o: v's output is not o's input (grouped-query attention)");
    }
    // gate/up: the MLP's output with Q(W·s)/s for gate and up.
    const std::vector<float> s_mlp = search("gate/up", {LinearRole::kGate, LinearRole::kUp},
                                            [&](const std::vector<float>& s) {
      return mean_squared_error(mlp(pool_, x_[idx(LinearRole::kGate)], candidate(LinearRole::kGate, s),
                                    candidate(LinearRole::kUp, s), w_[idx(LinearRole::kDown)], hidden, inter), y_down_);
    });
    for (std::size_t i = 0; i < mlp_norm_.size(); ++i) mlp_norm_[i] /= s_mlp[i];
    // down after up.
    divide_rows(LinearRole::kUp, search("down", {LinearRole::kDown}, [&](const std::vector<float>& s) {
                  return mean_squared_error(matmul(pool_, x_[idx(LinearRole::kDown)], candidate(LinearRole::kDown, s),
                                                   hidden, inter), y_down_);
                }));
  }

  // The recorded (scaled) inputs of `role`.
  const std::vector<float>& input_of(LinearRole role) const {
    const LinearInput in = linear_spec(role).input;
    return x_[idx(in == LinearInput::kAttnNorm    ? LinearRole::kQ
                  : in == LinearInput::kAttention ? LinearRole::kO
                  : in == LinearInput::kMlpNorm   ? LinearRole::kGate
                                                  : LinearRole::kDown)];
  }

  // Step 3: clipping (not q/k: their product through the attention scores is not one linear's output).
  void clip() {
    for (const LinearRole role : {LinearRole::kV, LinearRole::kO, LinearRole::kGate, LinearRole::kUp, LinearRole::kDown}) {
      const auto [n, k] = dims(role);
      if (!is_quantized(spec_of(role).type)) continue;  // kept float: nothing to clip for
      clip_weights(w_[idx(role)], n, k, sample_rows(input_of(role), k, options_.clip_tokens), spec_of(role),
                   options_.clip_grid, pool_);
    }
  }

  // Step 4: the scaled, clipped weights quantized: round to nearest, or GPTQ with the scaled inputs' Hessians.
  QuantizedBlock quantize() {
    QuantizedBlock out;
    for (const LinearSpec& s : kBlockLinears) {
      const auto [n, k] = dims(s.role);
      try {
        if (!is_quantized(spec_of(s.role).type)) {  // kept float (--format awq): the scaled, unquantized weights
          out.linears.push_back(quantize_matrix(w_[idx(s.role)].data(), n, k, spec_of(s.role), &pool_));
        } else if (options_.gptq) {
          GptqOptions g = *options_.gptq;
          g.spec = options_.spec;
          Hessian h(k);
          const std::vector<float>& in = input_of(s.role);
          h.add(in.data(), static_cast<std::int64_t>(in.size()) / k, &pool_);
          const GptqHessian prepared = prepare_gptq(h.matrix(), k, g, pool_.size());
          out.linears.push_back(gptq_quantize(w_[idx(s.role)].data(), n, k, prepared, g, pool_));
        } else {
          out.linears.push_back(quantize_matrix(w_[idx(s.role)].data(), n, k, spec_of(s.role), &pool_));
        }
      } catch (const Error& e) {
        fail("{}: {}", linear_tensor(layer_, s.role), e.what());
      }
    }
    return out;
  }

  // The next block's inputs through this block as it will run: each quantized linear with its folds undone
  // (columns divided by the scale its input was divided by, rows times the scale its output was divided by),
  // so that the model's own norms apply.
  void propagate(const std::vector<QuantMatrix>& linears) {
    std::array<std::vector<float>, kBlockLinears.size()> runs;
    Weights ptrs{};
    for (const LinearSpec& s : kBlockLinears) {
      const auto [n, k] = dims(s.role);
      std::vector<float>& e = runs[idx(s.role)];
      e.resize(static_cast<std::size_t>(n * k));
      const QuantMatrix& q = linears[idx(s.role)];
      pool_.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) dequantize_row(q, r, e.data() + r * k);
      });
      if (!in_scale_[idx(s.role)].empty()) scale_columns(e, k, in_scale_[idx(s.role)], true);
      if (!out_scale_[idx(s.role)].empty())
        for (std::size_t i = 0; i < e.size(); ++i) e[i] *= out_scale_[idx(s.role)][i / static_cast<std::size_t>(k)];
      ptrs[idx(s.role)] = &e;
    }
    const LlamaModel::LinearCompute compute = compute_with(ptrs, nullptr, nullptr);
    states_ = std::move(inputs_);
    for (auto& state : states_) model_.forward_block(layer_, state.data(), length_, nullptr, compute);
  }

  LlamaModel& model_;
  const TensorStore& store_;
  const AwqOptions& options_;
  ThreadPool& pool_;
  const ModelConfig& c_;
  const std::int64_t layer_, length_;
  std::vector<std::vector<float>>& states_;
  AwqLayerReport report_;
  std::array<std::vector<float>, kBlockLinears.size()> w_;  ///< fp32 weights, scaled and clipped as AWQ goes
  std::vector<float> attn_norm_, mlp_norm_;                  ///< the RMSNorm weights, scales folded in
  std::vector<std::vector<float>> inputs_;                   ///< the block's inputs, per sequence
  std::array<std::vector<float>, kBlockLinears.size()> x_;   ///< inputs by owner (q, o, gate, down), scaled as folded
  std::vector<float> y_o_, y_down_;                          ///< the float block's o and down outputs
  /// What each linear's columns were multiplied by / rows divided by (empty: nothing).
  std::array<std::vector<float>, kBlockLinears.size()> in_scale_, out_scale_;
};

}  // namespace

BlockQuantizer awq_block_quantizer(LlamaModel& model, const TensorStore& store, Calibration calibration,
                                   const AwqOptions& options, ThreadPool& pool,
                                   const std::function<void(const AwqLayerReport&)>& on_layer, ResumeDir* resume) {
  if (calibration.empty()) fail("AWQ needs calibration data");
  if (resume != nullptr) fail("--resume is not available for --method awq yet (its blocks are quick to run again)");
  const std::int64_t length = static_cast<std::int64_t>(calibration.front().size());
  auto states = std::make_shared<std::vector<std::vector<float>>>();
  for (const auto& seq : calibration) {
    if (static_cast<std::int64_t>(seq.size()) != length) fail("calibration sequences must have equal lengths");
    states->emplace_back(static_cast<std::size_t>(length * model.config().hidden_size));
    model.embed(seq, states->back().data());
  }
  return [&model, &store, states, options, &pool, length, on_layer](std::int64_t layer) {
    AwqBlock block(model, store, options, pool, layer, length, *states);
    QuantizedBlock out = block.run();
    if (on_layer) on_layer(block.report());
    return out;
  };
}

}  // namespace woq
