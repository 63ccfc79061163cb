#include "quantize/awq.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "formats/format_traits.h"
#include "kernels/blas.h"
#include "kernels/matmul.h"

namespace woq {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::size_t idx(LinearRole role) { return static_cast<std::size_t>(role); }

// Mean |x| per channel of rows [R, k] (AutoAWQ's x_mean), summed in f64 row after row; the channels split over
// the pool (each channel's sum in the same order at any split).
std::vector<double> channel_abs_mean(const std::vector<float>& x, std::int64_t k, ThreadPool& pool) {
  std::vector<double> mean(static_cast<std::size_t>(k), 0.0);
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / k;
  pool.parallel_for(k, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = c0; c < c1; ++c)
        mean[static_cast<std::size_t>(c)] += std::abs(x[static_cast<std::size_t>(r * k + c)]);
    for (std::int64_t c = c0; c < c1; ++c) mean[static_cast<std::size_t>(c)] /= static_cast<double>(std::max<std::int64_t>(rows, 1));
  }, 16);
  return mean;
}

// Columns of [rows, k] row-major `m` multiplied (divide = false) or divided by s; the rows split over the pool.
void scale_columns(float* m, std::int64_t rows, std::int64_t k, const std::vector<float>& s, bool divide,
                   ThreadPool& pool) {
  pool.parallel_for(rows, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      float* row = m + r * k;
      if (divide) {
        for (std::int64_t c = 0; c < k; ++c) row[c] /= s[static_cast<std::size_t>(c)];
      } else {
        for (std::int64_t c = 0; c < k; ++c) row[c] *= s[static_cast<std::size_t>(c)];
      }
    }
  });
}

void scale_columns(std::vector<float>& m, std::int64_t k, const std::vector<float>& s, bool divide, ThreadPool& pool) {
  scale_columns(m.data(), static_cast<std::int64_t>(m.size()) / k, k, s, divide, pool);
}

double sum_of_squares(const float* a, std::int64_t n) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * static_cast<double>(a[i]);
  return sum;
}

double mean_squared_error(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    sum += d * d;
  }
  return sum / static_cast<double>(std::max<std::size_t>(a.size(), 1));
}

// A linear as AWQ runs it: y [rows, n] = (x / in) · Wᵀ for x [rows, k], each output times `out` (in, out empty:
// 1); W in fp32 (sgemm) or quantized, on woq's kernels with int16 activations (each input rounded to about
// amax/65024 of its block: the product is the exact one's to about 1e-5, at prefill's speed) or the
// activations given (the pass-throughs' int8).
class AwqLinear {
 public:
  AwqLinear() = default;
  // fp32 W [n, k] (borrowed).
  AwqLinear(const std::vector<float>& w, std::int64_t n, std::int64_t k) : w_(&w), n_(n), k_(k) {}
  // A quantized W, taking x / in and giving y · out, on `activations` (unset: activations_of its type).
  AwqLinear(QuantMatrix q, std::vector<float> in, std::vector<float> out, ThreadPool& pool,
            std::optional<Activations> activations = std::nullopt)
      : q_(std::move(q)), in_(std::move(in)), out_(std::move(out)), n_(q_->rows), k_(q_->cols) {
    q_->activations = activations.value_or(activations_of(q_->type));
    prepare_for_kernels(*q_, &pool);
  }
  // Q(W·s) of fp32 W [n, k] in `spec`, taking x / s (fp32 W itself for a format that is not quantized).
  static AwqLinear scaled(const std::vector<float>& w, std::int64_t n, std::int64_t k, const std::vector<float>& s,
                          const QuantSpec& spec, ThreadPool& pool) {
    if (!is_quantized(spec.type)) return AwqLinear(w, n, k);
    const RowReader scaled_row = [&](std::int64_t r, float* row) {
      const float* in = w.data() + r * k;
      for (std::int64_t c = 0; c < k; ++c) row[c] = in[c] * s[static_cast<std::size_t>(c)];
    };
    return AwqLinear(quantize_for_kernels(scaled_row, n, k, spec, activations_of(spec.type), pool), s, {}, pool);
  }

  std::int64_t rows() const { return n_; }

  // int16 activations (K-quants: f32, their integer kernels take 8-bit Q8_K activations).
  static Activations activations_of(LowBit type) {
    return format_traits(type).activation_blocks == ActivationBlocks::kQ8_K ? Activations::kF32
                                                                            : Activations::kInt16;
  }

  void apply(ThreadPool& pool, Workspace& ws, const float* x, std::int64_t rows, float* y) const {
    if (!q_) {
      parallel_sgemm_nt(pool, rows, n_, k_, x, w_->data(), y);
      return;
    }
    if (in_.empty()) {
      matmul(*q_, x, rows, y, pool, ws);
    } else {
      std::vector<float> xs(x, x + rows * k_);
      scale_columns(xs, k_, in_, true, pool);
      matmul(*q_, xs.data(), rows, y, pool, ws);
    }
    if (!out_.empty()) scale_columns(y, rows, n_, out_, false, pool);
  }

  std::vector<float> apply(ThreadPool& pool, Workspace& ws, const std::vector<float>& x) const {
    const std::int64_t rows = static_cast<std::int64_t>(x.size()) / k_;
    std::vector<float> y(static_cast<std::size_t>(rows * n_));
    apply(pool, ws, x.data(), rows, y.data());
    return y;
  }

 private:
  const std::vector<float>* w_ = nullptr;
  std::optional<QuantMatrix> q_;
  std::vector<float> in_, out_;
  std::int64_t n_ = 0, k_ = 0;
};

}  // namespace

// The error Σ_t (x_tg · Δ_rg)² with Δ = Q(clip(W)) − W is taken as Δ_rg H_g Δ_rgᵀ with each group's Gram matrix
// H_g = Σ_t x_tgᵀ x_tg: the same sum without the T products of each candidate.
std::vector<float> awq_clip(std::vector<float>& w, std::int64_t n, std::int64_t k, const std::vector<float>& x,
                            const QuantSpec& spec, int grid, ThreadPool& pool) {
  const std::int64_t g_len = spec.group_size <= 0 ? k : std::min(spec.group_size, k);
  const std::int64_t groups = (k + g_len - 1) / g_len;
  const std::int64_t t = static_cast<std::int64_t>(x.size()) / k;
  const auto len_of = [&](std::int64_t g) { return std::min(g_len, k - g * g_len); };
  std::vector<std::vector<float>> gram(static_cast<std::size_t>(groups));
  pool.parallel_for(groups, [&](std::int64_t g0, std::int64_t g1) {
    for (std::int64_t g = g0; g < g1; ++g) {
      const std::int64_t len = len_of(g);
      std::vector<float>& h = gram[static_cast<std::size_t>(g)];
      h.assign(static_cast<std::size_t>(len * len), 0.0f);
      for (std::int64_t s = 0; s < t; ++s) {
        const float* xr = x.data() + s * k + g * g_len;
        for (std::int64_t a = 0; a < len; ++a) {
          float* hr = h.data() + a * len;
          for (std::int64_t b = 0; b < len; ++b) hr[b] += xr[a] * xr[b];
        }
      }
    }
  });
  std::vector<float> amax(static_cast<std::size_t>(n * groups), 0.0f);
  pool.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = 0; c < k; ++c) {
        float& m = amax[static_cast<std::size_t>(r * groups + c / g_len)];
        m = std::max(m, std::abs(w[static_cast<std::size_t>(r * k + c)]));
      }
  });
  // Panels of kPanel rows, each through every threshold in turn: its rows clamped, quantized and dequantized,
  // less W, then each group's quadratic forms. The panels depend on n only: the same bits at any pool size.
  constexpr std::int64_t kPanel = 64;
  std::vector<float> best = amax;
  const ScopedBlasThreads one_blas_thread(1);
  const bool by_rule = has_group_rule(spec);  // else (K-quants, ggml rounding) through quantize_matrix
  pool.parallel_for((n + kPanel - 1) / kPanel, [&](std::int64_t p0, std::int64_t p1) {
    std::vector<float> delta(static_cast<std::size_t>(kPanel * k)), scratch;
    std::vector<double> err(static_cast<std::size_t>(kPanel)), best_err(static_cast<std::size_t>(kPanel * groups));
    std::vector<std::int32_t> ints(static_cast<std::size_t>(by_rule ? k : 0));
    std::vector<GroupRule> rules(static_cast<std::size_t>(groups));
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t r0 = p * kPanel, rows = std::min(n, r0 + kPanel) - r0;
      std::fill(best_err.begin(), best_err.end(), std::numeric_limits<double>::infinity());
      for (int i = 0; i < grid / 2; ++i) {
        const float shrink = 1.0f - static_cast<float>(i) / static_cast<float>(grid);
        const RowReader clamped = [&](std::int64_t r, float* out) {
          for (std::int64_t g = 0; g < groups; ++g) {
            const float m = amax[static_cast<std::size_t>((r0 + r) * groups + g)] * shrink;
            const float* in = w.data() + (r0 + r) * k + g * g_len;
            for (std::int64_t c = 0; c < len_of(g); ++c) out[g * g_len + c] = std::clamp(in[c], -m, m);
          }
        };
        // delta = Q(clip(W)) − W, row by row: the group rule's integers times its step (dequantize_row's value).
        const std::optional<QuantMatrix> q =
            by_rule ? std::nullopt : std::optional<QuantMatrix>(quantize_matrix(clamped, rows, k, spec));
        for (std::int64_t r = 0; r < rows; ++r) {
          float* d = delta.data() + r * k;
          if (q) {
            dequantize_row(*q, r, d);
          } else {
            clamped(r, d);
            bool finite = false;
            try {
              finite = quantize_row_groups(spec.type, spec.int4_range, d, k, g_len, ints.data(), rules.data());
            } catch (const Error& e) {
              fail("row {}: {}", r0 + r, e.what());
            }
            if (!finite) require_finite_row(d, k, r0 + r);
            for (std::int64_t g = 0; g < groups; ++g) {
              const float step = rules[static_cast<std::size_t>(g)].step();
              const int zero = rules[static_cast<std::size_t>(g)].zero;
              for (std::int64_t c = g * g_len; c < g * g_len + len_of(g); ++c)
                d[c] = static_cast<float>(ints[static_cast<std::size_t>(c)] - zero) * step;  // GroupRule::value
            }
          }
          const float* wr = w.data() + (r0 + r) * k;
          for (std::int64_t c = 0; c < k; ++c) d[c] -= wr[c];
        }
        for (std::int64_t g = 0; g < groups; ++g) {
          quadratic_forms(rows, len_of(g), delta.data() + g * g_len, k, gram[static_cast<std::size_t>(g)].data(),
                          err.data(), scratch);
          for (std::int64_t r = 0; r < rows; ++r) {
            double& b = best_err[static_cast<std::size_t>(r * groups + g)];
            if (err[static_cast<std::size_t>(r)] < b) {
              b = err[static_cast<std::size_t>(r)];
              const std::size_t j = static_cast<std::size_t>((r0 + r) * groups + g);
              best[j] = amax[j] * shrink;
            }
          }
        }
      }
    }
  });
  pool.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t g = 0; g < groups; ++g) {
        const float m = best[static_cast<std::size_t>(r * groups + g)];
        float* row = w.data() + r * k + g * g_len;
        for (std::int64_t c = 0; c < len_of(g); ++c) row[c] = std::clamp(row[c], -m, m);
      }
  });
  return best;
}

namespace {

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
                                    std::int64_t group_size, ThreadPool* pool) {
  const std::int64_t g_len = group_size <= 0 ? k : std::min(group_size, k);
  const std::int64_t groups = (k + g_len - 1) / g_len;
  std::vector<double> mean(static_cast<std::size_t>(k), 0.0);
  std::int64_t total = 0;
  for (const auto& [data, rows] : w) total += rows;
  // Groups g0..g1 of every row in turn: each column's sum in row order, whatever the split.
  const auto over = [&](std::int64_t g0, std::int64_t g1) {
    for (const auto& [data, rows] : w)
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = data + r * k;
        for (std::int64_t c0 = g0 * g_len; c0 < std::min(k, g1 * g_len); c0 += g_len) {
          const std::int64_t c1 = std::min(k, c0 + g_len);
          double amax = 0;
          for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, static_cast<double>(std::abs(row[c])));
          for (std::int64_t c = c0; c < c1; ++c) mean[static_cast<std::size_t>(c)] += std::abs(row[c]) / (amax + 1e-6);
        }
      }
    for (std::int64_t c = g0 * g_len; c < std::min(k, g1 * g_len); ++c)
      mean[static_cast<std::size_t>(c)] /= static_cast<double>(std::max<std::int64_t>(total, 1));
  };
  if (pool != nullptr) {
    pool->parallel_for(groups, over);
  } else {
    over(0, groups);
  }
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
  using Weights = std::array<const AwqLinear*, kBlockLinears.size()>;

  AwqBlock(LlamaModel& model, const TensorStore& store, const AwqOptions& options, ThreadPool& pool,
           std::int64_t layer, std::int64_t length, std::vector<std::vector<float>>& states, ResumeDir* resume)
      : model_(model), store_(store), options_(options), pool_(pool), c_(model.config()), layer_(layer),
        length_(length), states_(states), resume_(resume) {
    report_.layer = layer;
  }

  // Whether this block was finished before an interruption (--resume).
  bool finished() const { return resume_ != nullptr && layer_ < resume_->completed(); }

  QuantizedBlock run() {
    if (finished()) return resumed();
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
    if (options_.propagate_quantized) {
      states_ = std::move(inputs_);
      advance(out.linears);
    }
    if (resume_ != nullptr) resume_->save_block(layer_, saved(out.linears));
    out.replaced[layer_tensor(layer_, kAttnNorm.hf)] = std::move(attn_norm_);
    out.replaced[layer_tensor(layer_, kMlpNorm.hf)] = std::move(mlp_norm_);
    report_.quantize = seconds_since(t0);
    return out;
  }

  const AwqLayerReport& report() const { return report_; }

 private:
  std::pair<std::int64_t, std::int64_t> dims(LinearRole role) const { return block_linear_shape(c_, role); }

  // A LinearCompute with `weights` (null: not needed, zeros), appending o's outputs to `o_out` when given.
  LlamaModel::LinearCompute compute_with(const Weights& weights, std::vector<float>* o_out) {
    return [this, weights, o_out](LinearRole role, const float* in, std::int64_t rows, float* y) {
      const std::int64_t n = dims(role).first;
      if (weights[idx(role)] == nullptr) {
        std::fill(y, y + rows * n, 0.0f);
        return;
      }
      weights[idx(role)]->apply(pool_, ws_, in, rows, y);
      if (role == LinearRole::kO && o_out != nullptr) o_out->insert(o_out->end(), y, y + rows * n);
    };
  }

  // Step 1: the float block on every sequence, recording the linears' inputs (by input owner: q, o, gate, down)
  // and the outputs of o and down; the states move on to the next block's inputs. When the quantized block's
  // outputs go on instead (propagate_quantized), down runs on the search's sampled rows only (the float
  // block's output is needed nowhere else) and the states' other rows are left wrong: run() replaces them.
  // OpenBLAS may round a row of that smaller batch differently (its small-matrix path, its Haswell kernels):
  // the down search's targets are then the whole batch's to rounding, not to the bit.
  void record() {
    inputs_ = states_;
    const std::size_t all_rows = states_.size() * static_cast<std::size_t>(length_);  // filled once, not regrown
    for (const LinearRole r : {LinearRole::kQ, LinearRole::kO, LinearRole::kGate, LinearRole::kDown})
      x_[idx(r)].reserve(all_rows * static_cast<std::size_t>(dims(r).second));
    y_o_.reserve(all_rows * static_cast<std::size_t>(dims(LinearRole::kO).first));
    const LlamaModel::LinearObserver observe = [this](LinearRole role, const float* in, std::int64_t rows) {
      if (role == LinearRole::kQ || role == LinearRole::kO || role == LinearRole::kGate || role == LinearRole::kDown)
        x_[idx(role)].insert(x_[idx(role)].end(), in, in + rows * dims(role).second);
    };
    const Weights originals = float_block();
    const bool every_down_row = !options_.propagate_quantized;  // the float block's outputs go on
    const LlamaModel::LinearCompute compute = compute_with(originals, &y_o_);
    const auto [step, count] = search_sampling();
    const auto [n_down, k_down] = dims(LinearRole::kDown);
    std::int64_t row = 0;  // of all sequences, one after another
    std::vector<float> in_rows, out_rows;
    std::vector<std::int64_t> picked;  // the call's local rows r with row + r = j · step, j < count
    const LlamaModel::LinearCompute sampled_down = [&](LinearRole role, const float* in, std::int64_t rows,
                                                       float* y) {
      if (role != LinearRole::kDown) return compute(role, in, rows, y);
      picked.clear();
      for (std::int64_t r = (step - row % step) % step; r < rows && (row + r) / step < count; r += step)
        picked.push_back(r);
      row += rows;
      if (every_down_row) {
        compute(role, in, rows, y);
        for (const std::int64_t r : picked) y_down_rows_.insert(y_down_rows_.end(), y + r * n_down, y + (r + 1) * n_down);
        return;
      }
      std::fill(y, y + rows * n_down, 0.0f);
      if (picked.empty()) return;
      in_rows.clear();
      for (const std::int64_t r : picked) in_rows.insert(in_rows.end(), in + r * k_down, in + (r + 1) * k_down);
      out_rows.resize(picked.size() * static_cast<std::size_t>(n_down));
      compute(role, in_rows.data(), static_cast<std::int64_t>(picked.size()), out_rows.data());
      y_down_rows_.insert(y_down_rows_.end(), out_rows.begin(), out_rows.end());
    };
    for (auto& state : states_) model_.forward_block(layer_, state.data(), length_, observe, sampled_down);
    sample();
  }

  // The rows the losses of o, gate/up and down take: every `step`-th of all sequences' rows, `count` of them
  // (sample_rows' choice of AwqOptions::search_tokens rows).
  std::pair<std::int64_t, std::int64_t> search_sampling() const {
    const std::int64_t total = static_cast<std::int64_t>(states_.size()) * length_;
    const std::int64_t count = options_.search_tokens <= 0 ? total : std::min(options_.search_tokens, total);
    return {std::max<std::int64_t>(1, total / std::max<std::int64_t>(count, 1)), count};
  }

  // The calibration rows the scale searches measure their losses on (AwqOptions::search_tokens): whole
  // sequences for q/k/v (the attention needs them), evenly spaced rows for the others.
  void sample() {
    const std::int64_t sequences = static_cast<std::int64_t>(inputs_.size());
    const std::int64_t budget = options_.search_tokens <= 0 ? sequences * length_
                                                            : std::min(options_.search_tokens, sequences * length_);
    const std::int64_t chosen = std::clamp<std::int64_t>((budget + length_ - 1) / length_, 1, sequences);
    const std::int64_t hidden = c_.hidden_size;
    for (std::int64_t i = 0; i < chosen; ++i) {
      const std::int64_t seq = i * sequences / chosen;
      search_inputs_.push_back(inputs_[static_cast<std::size_t>(seq)]);
      const std::vector<float>& attn = x_[idx(LinearRole::kO)];
      const std::int64_t k_o = dims(LinearRole::kO).second;
      x_o_search_.insert(x_o_search_.end(), attn.begin() + seq * length_ * k_o, attn.begin() + (seq + 1) * length_ * k_o);
    }
    const std::int64_t count = search_sampling().second;
    y_o_rows_ = sample_rows(y_o_, hidden, count);
    x_down_rows_ = sample_rows(x_[idx(LinearRole::kDown)], dims(LinearRole::kDown).second, count);
  }

  // The float linear `role` a group's loss passes through (o after the attention, down after the MLP), for
  // the loss ||(x_c − x)·Wᵀ||² / (rows · n): the mean squared error of W's outputs on the candidate's inputs x_c
  // against the float block's x, with W as sym_int8 (group 32) on the int8 kernels (the difference's blocks of
  // 32 rounded to 8 bits). Taking the difference first keeps the error of that product to the roundings of W
  // and of the difference, each zero-mean and independent of the product: together about 3e-5 of the loss
  // (E||(d + e)·Wᵀ||² = ||d·Wᵀ||² + ||e·Wᵀ||²), at the integer kernels' speed rather than sgemm's.
  AwqLinear pass_through(LinearRole role) {
    const auto [n, k] = dims(role);
    return AwqLinear(quantize_matrix(w_[idx(role)].data(), n, k, QuantSpec{LowBit::kSymInt8, 32}, &pool_), {}, {},
                     pool_, Activations::kInt8);
  }

  // The block's seven linears as fp32 W, as they are now (held in float_linears_).
  Weights float_block() {
    Weights out{};
    for (const LinearSpec& s : kBlockLinears) {
      float_linears_[idx(s.role)] = AwqLinear(w_[idx(s.role)], dims(s.role).first, dims(s.role).second);
      out[idx(s.role)] = &float_linears_[idx(s.role)];
    }
    return out;
  }

  // The format linear `role` is written in.
  const QuantSpec& spec_of(LinearRole role) const {
    return options_.plan ? options_.plan->linear(layer_, role) : options_.spec;
  }

  // Q(W·s) of linear `role`, taking x / s (W itself for a layer kept float). Throws naming the tensor.
  AwqLinear candidate(LinearRole role, const std::vector<float>& s) {
    try {
      return AwqLinear::scaled(w_[idx(role)], dims(role).first, dims(role).second, s, spec_of(role), pool_);
    } catch (const Error& e) {
      fail("{} times an AWQ scale candidate: {}", linear_tensor(layer_, role), e.what());
    }
  }

  // The search's rows of the recorded (scaled) inputs of `role`'s group.
  std::vector<float> search_rows(LinearRole role) const {
    return sample_rows(x_[idx(role)], dims(role).second, static_cast<std::int64_t>(y_o_rows_.size()) / c_.hidden_size);
  }

  // Searches one group's scales and multiplies its columns by them; returns them (s = 1, said as skipped, when
  // none of the group's linears is quantized: the layers --format awq keeps float).
  std::vector<float> search(const char* group, const std::vector<LinearRole>& roles,
                            const std::function<double(const std::vector<float>&)>& loss) {
    const auto t0 = Clock::now();
    const std::int64_t k = dims(roles.front()).second;
    if (std::none_of(roles.begin(), roles.end(), [&](LinearRole r) { return is_quantized(spec_of(r).type); })) {
      report_.skipped.push_back(fmt::format("{}: kept float (nothing to scale for)", group));
      return std::vector<float>(static_cast<std::size_t>(k), 1.0f);
    }
    std::vector<std::pair<const float*, std::int64_t>> ws;
    for (const LinearRole r : roles) ws.emplace_back(w_[idx(r)].data(), dims(r).first);
    AwqScale chosen = awq_search_scale(channel_abs_mean(x_[idx(roles.front())], k, pool_),
                                       awq_weight_mean(ws, k, options_.spec.group_size, &pool_), options_.grid, loss);
    chosen.group = group;
    chosen.loss_unscaled = loss(std::vector<float>(static_cast<std::size_t>(k), 1.0f));
    if (chosen.loss_unscaled <= chosen.loss) {  // no grid point beats leaving the group unscaled
      chosen.ratio = -1;
      chosen.loss = chosen.loss_unscaled;
      chosen.scales.assign(static_cast<std::size_t>(k), 1.0f);
    }
    for (const LinearRole r : roles) {
      scale_columns(w_[idx(r)], k, chosen.scales, false, pool_);
      in_scale_[idx(r)] = chosen.scales;
    }
    scale_columns(x_[idx(roles.front())], k, chosen.scales, true, pool_);
    chosen.seconds = seconds_since(t0);
    report_.scales.push_back(chosen);
    return report_.scales.back().scales;
  }

  // Divides the rows of `role` (its outputs) by s.
  void divide_rows(LinearRole role, const std::vector<float>& s) {
    const std::size_t k = static_cast<std::size_t>(dims(role).second);
    for (std::size_t i = 0; i < w_[idx(role)].size(); ++i) w_[idx(role)][i] /= s[i / k];
    out_scale_[idx(role)] = s;
  }

  // Step 2: each group's scales, folded before the next group is searched; the losses on the sampled rows.
  void search_scales() {
    // q/k/v: the attention's output (after o_proj), rerun with Q(W·s) for q, k and v.
    const AwqLinear o_check = pass_through(LinearRole::kO);
    const std::vector<float> s_qkv = search("q/k/v", {LinearRole::kQ, LinearRole::kK, LinearRole::kV},
                                            [&](const std::vector<float>& s) {
      const AwqLinear q = candidate(LinearRole::kQ, s), k = candidate(LinearRole::kK, s),
                      v = candidate(LinearRole::kV, s);
      Weights ws{};
      ws[idx(LinearRole::kQ)] = &q;
      ws[idx(LinearRole::kK)] = &k;
      ws[idx(LinearRole::kV)] = &v;
      const LlamaModel::LinearCompute qkv = compute_with(ws, nullptr);
      const std::int64_t k_o = dims(LinearRole::kO).second;
      std::int64_t row = 0;
      double sum = 0;
      const LlamaModel::LinearCompute compute = [&](LinearRole role, const float* in, std::int64_t rows, float* y) {
        if (role != LinearRole::kO) return qkv(role, in, rows, y);
        std::vector<float> diff(in, in + rows * k_o);
        const float* ref = x_o_search_.data() + row * k_o;
        for (std::size_t i = 0; i < diff.size(); ++i) diff[i] -= ref[i];
        o_check.apply(pool_, ws_, diff.data(), rows, y);
        sum += sum_of_squares(y, rows * o_check.rows());
        row += rows;
      };
      for (const auto& input : search_inputs_) {
        std::vector<float> h = input;
        model_.forward_block(layer_, h.data(), length_, nullptr, compute);
      }
      return sum / static_cast<double>(std::max<std::int64_t>(row * o_check.rows(), 1));
    });
    for (std::size_t i = 0; i < attn_norm_.size(); ++i) attn_norm_[i] /= s_qkv[i];
    // o after v: only where v's output is o's input, feature for feature.
    const bool v_bias = store_.find(linear_tensor(layer_, LinearRole::kV, "bias")) != nullptr;
    if (dims(LinearRole::kV).first == dims(LinearRole::kO).second && !v_bias) {
      const std::vector<float> x = search_rows(LinearRole::kO);
      divide_rows(LinearRole::kV, search("o", {LinearRole::kO}, [&](const std::vector<float>& s) {
                    return mean_squared_error(candidate(LinearRole::kO, s).apply(pool_, ws_, x), y_o_rows_);
                  }));
    } else {
      report_.skipped.push_back(v_bias ? "o: v has a bias" : "o: v's output is not o's input (grouped-query attention)");
    }
    // gate/up: the MLP's output down(silu(gate x) · up x) with Q(W·s) for gate and up.
    const std::vector<float> x_mlp = search_rows(LinearRole::kGate);
    const AwqLinear down_check = pass_through(LinearRole::kDown);
    const std::vector<float> s_mlp = search("gate/up", {LinearRole::kGate, LinearRole::kUp},
                                            [&](const std::vector<float>& s) {
      std::vector<float> g = candidate(LinearRole::kGate, s).apply(pool_, ws_, x_mlp);
      const std::vector<float> u = candidate(LinearRole::kUp, s).apply(pool_, ws_, x_mlp);
      pool_.parallel_for(static_cast<std::int64_t>(g.size()), [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i] - x_down_rows_[i];
      }, 64);
      const std::vector<float> y = down_check.apply(pool_, ws_, g);
      return sum_of_squares(y.data(), static_cast<std::int64_t>(y.size())) /
             static_cast<double>(std::max<std::size_t>(y.size(), 1));
    });
    for (std::size_t i = 0; i < mlp_norm_.size(); ++i) mlp_norm_[i] /= s_mlp[i];
    // down after up.
    const std::vector<float> x_down = search_rows(LinearRole::kDown);
    divide_rows(LinearRole::kUp, search("down", {LinearRole::kDown}, [&](const std::vector<float>& s) {
                  return mean_squared_error(candidate(LinearRole::kDown, s).apply(pool_, ws_, x_down), y_down_rows_);
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
      try {
        awq_clip(w_[idx(role)], n, k, sample_rows(input_of(role), k, options_.clip_tokens), spec_of(role),
                 options_.clip_grid, pool_);
      } catch (const Error& e) {
        fail("{}, AWQ's clipping search: {}", linear_tensor(layer_, role), e.what());
      }
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

  // The folded norms and the scales a finished block is resumed from: what --resume stores after the linears.
  std::array<std::vector<float>, 6> folds() const {
    const auto or_ones = [&](const std::vector<float>& s, LinearRole role) {
      return s.empty() ? std::vector<float>(static_cast<std::size_t>(dims(role).second), 1.0f) : s;
    };
    return {attn_norm_, mlp_norm_, or_ones(in_scale_[idx(LinearRole::kQ)], LinearRole::kQ),
            or_ones(in_scale_[idx(LinearRole::kO)], LinearRole::kO),
            or_ones(in_scale_[idx(LinearRole::kGate)], LinearRole::kGate),
            or_ones(in_scale_[idx(LinearRole::kDown)], LinearRole::kDown)};
  }

  // The block as --resume stores it: the linears, then folds() as fp32 rows (kAwqResumeMatrices in all).
  std::vector<QuantMatrix> saved(const std::vector<QuantMatrix>& linears) const {
    std::vector<QuantMatrix> out = linears;
    for (const std::vector<float>& v : folds())
      out.push_back(quantize_matrix(v.data(), 1, static_cast<std::int64_t>(v.size()), QuantSpec{LowBit::kFp32}));
    return out;
  }

  // A block finished before an interruption: its linears, folded norms and scales as stored; the states move on
  // as run() moved them (through the quantized block, scales applied as they were; a scale of 1 where none was
  // searched gives the same bits as none).
  QuantizedBlock resumed() {
    std::vector<QuantMatrix> block = resume_->load_block(layer_);
    std::array<std::vector<float>, 6> v;
    const std::array<std::int64_t, 6> sizes = {c_.hidden_size, c_.hidden_size, dims(LinearRole::kQ).second,
                                               dims(LinearRole::kO).second, dims(LinearRole::kGate).second,
                                               dims(LinearRole::kDown).second};
    for (std::size_t i = 0; i < v.size(); ++i) {
      const QuantMatrix& m = block[kBlockLinears.size() + i];
      if (m.type != LowBit::kFp32 || m.rows != 1 || m.cols != sizes[i])
        fail("--resume: block {}'s stored AWQ scales do not fit this model; start over with --force", layer_);
      v[i].resize(static_cast<std::size_t>(m.cols));
      dequantize_row(m, 0, v[i].data());
    }
    block.resize(kBlockLinears.size());
    for (const LinearRole r : {LinearRole::kQ, LinearRole::kK, LinearRole::kV}) in_scale_[idx(r)] = v[2];
    in_scale_[idx(LinearRole::kO)] = out_scale_[idx(LinearRole::kV)] = v[3];
    for (const LinearRole r : {LinearRole::kGate, LinearRole::kUp}) in_scale_[idx(r)] = v[4];
    in_scale_[idx(LinearRole::kDown)] = out_scale_[idx(LinearRole::kUp)] = v[5];
    if (options_.propagate_quantized) {
      advance(block);
    } else {  // the float block, as record() runs it
      for (const LinearSpec& s : kBlockLinears) read_float_linear(store_, c_, layer_, s.role, w_[idx(s.role)]);
      const LlamaModel::LinearCompute compute = compute_with(float_block(), nullptr);
      for (auto& state : states_) model_.forward_block(layer_, state.data(), length_, nullptr, compute);
    }
    QuantizedBlock out{std::move(block), {}};
    out.replaced[layer_tensor(layer_, kAttnNorm.hf)] = std::move(v[0]);
    out.replaced[layer_tensor(layer_, kMlpNorm.hf)] = std::move(v[1]);
    return out;
  }

  // The states through this block as it will run: each quantized linear with its folds undone (columns divided
  // by the scale its input was divided by, rows times the scale its output was divided by), so that the model's
  // own norms apply.
  void advance(const std::vector<QuantMatrix>& linears) {
    std::array<std::vector<float>, kBlockLinears.size()> floats;
    std::array<AwqLinear, kBlockLinears.size()> runs;
    Weights ptrs{};
    for (const LinearSpec& s : kBlockLinears) {
      const auto [n, k] = dims(s.role);
      const QuantMatrix& q = linears[idx(s.role)];
      if (is_quantized(q.type)) {
        runs[idx(s.role)] = AwqLinear(q, in_scale_[idx(s.role)], out_scale_[idx(s.role)], pool_);
      } else {
        std::vector<float>& e = floats[idx(s.role)];
        e.resize(static_cast<std::size_t>(n * k));
        pool_.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
          for (std::int64_t r = r0; r < r1; ++r) dequantize_row(q, r, e.data() + r * k);
        });
        if (!in_scale_[idx(s.role)].empty()) scale_columns(e, k, in_scale_[idx(s.role)], true, pool_);
        if (!out_scale_[idx(s.role)].empty())
          for (std::size_t i = 0; i < e.size(); ++i) e[i] *= out_scale_[idx(s.role)][i / static_cast<std::size_t>(k)];
        runs[idx(s.role)] = AwqLinear(e, n, k);
      }
      ptrs[idx(s.role)] = &runs[idx(s.role)];
    }
    const LlamaModel::LinearCompute compute = compute_with(ptrs, nullptr);
    for (auto& state : states_) model_.forward_block(layer_, state.data(), length_, nullptr, compute);
  }

  LlamaModel& model_;
  const TensorStore& store_;
  const AwqOptions& options_;
  ThreadPool& pool_;
  const ModelConfig& c_;
  const std::int64_t layer_, length_;
  std::vector<std::vector<float>>& states_;
  ResumeDir* resume_;
  AwqLayerReport report_;
  std::array<std::vector<float>, kBlockLinears.size()> w_;  ///< fp32 weights, scaled and clipped as AWQ goes
  std::vector<float> attn_norm_, mlp_norm_;                  ///< the RMSNorm weights, scales folded in
  std::vector<std::vector<float>> inputs_;                   ///< the block's inputs, per sequence
  std::array<std::vector<float>, kBlockLinears.size()> x_;   ///< inputs by owner (q, o, gate, down), scaled as folded
  std::vector<float> y_o_;                                   ///< the float block's o outputs
  std::vector<std::vector<float>> search_inputs_;            ///< the sequences the q/k/v search reruns
  std::vector<float> x_o_search_;                            ///< their o inputs (the float attention's outputs)
  std::vector<float> y_o_rows_, y_down_rows_;                ///< o's and down's outputs on the sampled rows
                                                             ///< (down's taken by record())
  std::vector<float> x_down_rows_;                           ///< down's inputs on the sampled rows
  Workspace ws_;                                             ///< the kernels' buffers
  std::array<AwqLinear, kBlockLinears.size()> float_linears_;  ///< float_block()'s
  /// What each linear's columns were multiplied by / rows divided by (empty: nothing).
  std::array<std::vector<float>, kBlockLinears.size()> in_scale_, out_scale_;
};

}  // namespace

BlockQuantizer awq_block_quantizer(LlamaModel& model, const TensorStore& store, Calibration calibration,
                                   const AwqOptions& options, ThreadPool& pool,
                                   const std::function<void(const AwqLayerReport&)>& on_layer, ResumeDir* resume) {
  if (calibration.empty()) fail("AWQ needs calibration data");
  const std::int64_t length = static_cast<std::int64_t>(calibration.front().size());
  auto states = std::make_shared<std::vector<std::vector<float>>>();
  for (const auto& seq : calibration) {
    if (static_cast<std::int64_t>(seq.size()) != length) fail("calibration sequences must have equal lengths");
    states->emplace_back(static_cast<std::size_t>(length * model.config().hidden_size));
    model.embed(seq, states->back().data());
  }
  return [&model, &store, states, options, &pool, length, on_layer, resume](std::int64_t layer) {
    AwqBlock block(model, store, options, pool, layer, length, *states, resume);
    const bool finished = block.finished();
    QuantizedBlock out = block.run();
    if (on_layer && !finished) on_layer(block.report());
    return out;
  };
}

}  // namespace woq
