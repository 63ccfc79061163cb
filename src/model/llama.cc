#include "model/llama.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/ggml_numerics.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace woq {

namespace {

// RoPE inverse frequencies theta^(-2i/d), divided by rope_scaling's factors
// (rope_freq_factors: transformers' modeling_rope_utils rules, or a GGUF's rope_freqs).
std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const std::vector<float> factors = rope_freq_factors(c);
  std::vector<float> inv(factors.size());
  for (std::size_t i = 0; i < inv.size(); ++i) {
    const double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    inv[i] = static_cast<float>(f / factors[i]);
  }
  return inv;
}

// ggml_rope_ext's parameters for c (llama.cpp's llama_context: freq_base and 1 / the linear factor in float, the
// GGUF's rope_freqs or llama3's factors as divisors).
GgmlRope ggml_rope_of(const ModelConfig& c) {
  GgmlRope r;
  r.theta_scale = std::pow(static_cast<float>(c.rope_theta), -2.0f / static_cast<float>(c.head_dim));
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    r.freq_scale = 1.0f / static_cast<float>(c.rope_scaling.factor);
  } else if (c.rope_scaling.type != RopeScaling::Type::kNone) {
    r.freq_factors = rope_freq_factors(c);
  }
  const ArchitectureSpec* spec = find_architecture(c.architecture);
  r.interleave = spec != nullptr && spec->gguf_permute_qk;
  return r;
}

void add_bias(float* x, const std::vector<float>& bias, std::int64_t rows) {
  if (bias.empty()) return;
  const auto n = static_cast<std::int64_t>(bias.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < n; ++i) x[r * n + i] += bias[static_cast<std::size_t>(i)];
}

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, ThreadPool& pool)
    : config_(std::move(config)),
      pool_(&pool),
      inv_freq_(rope_inv_freq(config_)),
      ggml_rope_(ggml_rope_of(config_)),
      scratch_(std::make_unique<Scratch>()),
      workspace_(std::make_unique<Workspace>()),
      last_block_(config_.num_hidden_layers) {}

std::int64_t LlamaModel::context_limit() const { return config_.context_limit(); }

void LlamaModel::set_pipeline(Ranks& ranks) {
  // Each rank's blocks, gathered: they must run 0..L in rank order, each rank at least one.
  const std::int64_t mine[2] = {first_block_, last_block_};
  const std::vector<std::string> all =
      ranks.all_gather(std::string_view(reinterpret_cast<const char*>(mine), sizeof mine));
  std::int64_t next = 0;
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::int64_t range[2] = {};
    if (all[r].size() != sizeof range) fail("pipeline: rank {} sent {} bytes for its blocks", r, all[r].size());
    std::memcpy(range, all[r].data(), sizeof range);
    if (range[0] != next || range[1] <= range[0])
      fail("pipeline: rank {} holds blocks [{}, {}), not the ones after rank {}'s (from {})", r, range[0], range[1],
           r == 0 ? 0 : r - 1, next);
    next = range[1];
  }
  if (next != config_.num_hidden_layers)
    fail("pipeline: the ranks hold blocks up to {} of {}", next, config_.num_hidden_layers);
  pipeline_ = &ranks;
}

std::uint64_t LlamaModel::weight_bytes_per_token() const {
  std::uint64_t bytes = output_matrix().bytes() +
                        static_cast<std::uint64_t>(embed_.row_bytes) + final_norm_.size() * sizeof(float);
  for (const LayerWeights& w : layers_) {
    for (const QuantMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.gate, &w.up, &w.down}) bytes += m->bytes();
    for (const std::vector<float>* v : {&w.attn_norm, &w.mlp_norm, &w.bq, &w.bk, &w.bv, &w.bo, &w.q_norm, &w.k_norm})
      bytes += v->size() * sizeof(float);
  }
  return bytes;
}

KVCache LlamaModel::make_cache(std::int64_t capacity) const {
  if (capacity < 1 || capacity > context_limit())
    fail("a context of {} tokens is outside [1, {}] (max_position_embeddings)", capacity, context_limit());
  return KVCache(last_block_ - first_block_, capacity, config_.kv_dim(), first_block_);  // a pipeline stage's blocks
}

// Causal scaled dot-product attention of t_count new query rows (positions
// pos0 + t) over cached positions [0, pos0 + t], or the last `window` of them
// (sliding window: keys j with i - j < window). GQA: query head h reads KV
// head h / (heads / kv_heads). q, out: [t_count, q_dim]. The tiled kernel
// (kernels/attention.h) gives each query the same bits in any batch, so
// prefill equals token-by-token decode.
void LlamaModel::attention(const float* q, std::int64_t t_count, std::int64_t pos0, std::int64_t layer,
                           std::int64_t window, KVCache& cache, float* out, std::int64_t pass_rows) {
  static_assert(KVCache::kPageTokens % kAttentionKeyTile == 0, "a key tile lies in one page of the cache");
  const std::int64_t tiles = (pos0 + t_count + kAttentionKeyTile - 1) / kAttentionKeyTile;
  std::vector<const float*> keys(static_cast<std::size_t>(tiles)), values(keys.size());
  for (std::int64_t b = 0; b < tiles; ++b) {
    keys[static_cast<std::size_t>(b)] = cache.key(layer, b * kAttentionKeyTile);
    values[static_cast<std::size_t>(b)] = cache.value(layer, b * kAttentionKeyTile);
  }
  const AttentionShape shape{.heads = config_.num_attention_heads,
                             .kv_heads = config_.num_key_value_heads,
                             .head_dim = config_.head_dim,
                             .window = window};
  if (config_.numerics == Numerics::kGgml) {
    ggml_causal_attention(q, t_count, pos0, shape, KvTiles{keys, values, cache.kv_dim}, out, *pool_, active_isa(),
                          pass_rows == 1 && !batch_invariant_);
  } else {
    causal_attention(q, t_count, pos0, shape, KvTiles{keys, values, cache.kv_dim}, out, *pool_, *workspace_);
  }
}

void LlamaModel::norm(const float* x, const float* weight, std::int64_t n, float* out) const {
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  if (config_.numerics == Numerics::kGgml) {
    ggml_rms_norm(x, weight, n, eps, out);
  } else {
    rms_norm(x, weight, n, eps, out);
  }
}

void LlamaModel::rotate(float* x, std::int64_t heads, std::int64_t pos, std::vector<float>& cos_sin) const {
  if (config_.numerics == Numerics::kGgml) {
    cos_sin.resize(static_cast<std::size_t>(config_.head_dim));
    ggml_rope_angles(ggml_rope_, config_.head_dim, pos, cos_sin.data());
    ggml_rope(x, heads, config_.head_dim, cos_sin.data(), ggml_rope_.interleave, ggml_lanes(active_isa()));
  } else {
    rope(x, heads, config_.head_dim, pos, inv_freq_.data());
  }
}

// The fewest tokens of a pipeline's prefill micro-batch (LlamaModel::forward): smaller ones cost the kernels more
// than the ranks' overlap gains.
constexpr std::int64_t kMinMicroBatch = 32;

// Activations of a forward pass, [T, dim] row-major each, kept for the next
// pass (fresh pages cost a prefill ~10 %): room for the most tokens a pass
// has had, up to kKeptPassTokens (LlamaModel::run frees longer ones' buffers).
constexpr std::int64_t kKeptPassTokens = 1024;

struct LlamaModel::Scratch {
  /// Makes room for passes of t tokens.
  void fit(const ModelConfig& c, std::int64_t t) {
    if (t <= rows) return;
    *this = Scratch();  // the old buffers go before the larger ones come
    rows = t;
    const auto n = [t](std::int64_t dim) { return std::vector<float>(static_cast<std::size_t>(t * dim)); };
    residual = n(c.hidden_size);
    xn = n(c.hidden_size);
    q = n(c.q_dim());
    k = n(c.kv_dim());
    v = n(c.kv_dim());
    att = n(c.q_dim());
    gate = n(c.intermediate_size);
    up = n(c.intermediate_size);
    proj = n(c.hidden_size);
  }
  std::int64_t rows = 0;
  std::vector<float> residual, xn, q, k, v, att, gate, up, proj;
  std::vector<float> cos_sin;  ///< (head_dim) one position's RoPE angles (Numerics::kGgml)
  std::vector<std::int64_t> kept;  ///< block's rows that go on past attention
};

struct LlamaModel::BlockPass {
  BlockPass(const ModelConfig& c, std::span<const std::int64_t> t) : lengths(t.begin(), t.end()) {
    caches.reserve(t.size());
    for (const std::int64_t n : t) {
      caches.emplace_back(1, n, c.kv_dim());
      caches.back().grow(n);
    }
  }
  std::vector<std::int64_t> lengths;
  std::vector<KVCache> caches;  // one layer each
};

LlamaModel::~LlamaModel() = default;

void LlamaModel::block(std::int64_t l, float* x, std::span<const Segment> segments, std::int64_t cache_layer,
                       Scratch& s, const LinearObserver* observe, const LinearCompute* compute) {
  const ModelConfig& c = config_;
  const std::int64_t hidden = c.hidden_size;
  const std::int64_t q_dim = c.q_dim();
  const std::int64_t kv_dim = c.kv_dim();
  // All rows give keys and values; the kept ones (past each segment's skip, in order) go on through
  // the query, attention and MLP: s.kept[u] is kept row u's row of x.
  std::int64_t t_count = 0;
  s.kept.clear();
  for (const Segment& seg : segments) {
    for (std::int64_t i = seg.skip; i < seg.rows; ++i) s.kept.push_back(t_count + i);
    t_count += seg.rows;
  }
  const auto u_count = static_cast<std::int64_t>(s.kept.size());
  const bool all_kept = u_count == t_count;
  const LayerWeights& w = layers_[static_cast<std::size_t>(l)];
  // RMSNorm of rows of x into xn: all of them, or the kept ones (compact).
  auto norm_rows = [&](const std::vector<float>& weight, bool kept_only) {
    const std::int64_t n = kept_only ? u_count : t_count;
    for (std::int64_t t = 0; t < n; ++t)
      norm(x + (kept_only ? s.kept[static_cast<std::size_t>(t)] : t) * hidden, weight.data(), hidden,
           s.xn.data() + t * hidden);
  };
  // Linears that read the same input [rows, K] run as one pass (one activation quantization, one pool wake-up).
  auto linears = [&](std::initializer_list<std::pair<LinearRole, float*>> roles, const float* in, std::int64_t rows) {
    if (observe != nullptr)
      for (const auto& [role, y] : roles) (*observe)(role, in, rows);
    if (compute != nullptr) {
      for (const auto& [role, y] : roles) (*compute)(role, in, rows, y);
    } else {
      std::array<MatmulOutput, 3> outs;
      std::size_t n = 0;
      for (const auto& [role, y] : roles) outs[n++] = {&w.linear(role), y};
      matmul_shared_input(std::span(outs.data(), n), in, rows, *pool_, *workspace_);
    }
  };
  // x's kept rows += s.proj [u_count, hidden].
  auto add_to_kept = [&] {
    for (std::int64_t u = 0; u < u_count; ++u) {
      float* row = x + s.kept[static_cast<std::size_t>(u)] * hidden;
      const float* p = s.proj.data() + u * hidden;
      for (std::int64_t i = 0; i < hidden; ++i) row[i] += p[i];
    }
  };
  norm_rows(w.attn_norm, false);
  if (all_kept) {
    linears({{LinearRole::kQ, s.q.data()}, {LinearRole::kK, s.k.data()}, {LinearRole::kV, s.v.data()}}, s.xn.data(),
            t_count);
  } else {
    linears({{LinearRole::kK, s.k.data()}, {LinearRole::kV, s.v.data()}}, s.xn.data(), t_count);
    for (std::int64_t u = 0; u < u_count; ++u)  // compact: row u moves down from s.kept[u] >= u
      std::copy_n(s.xn.data() + s.kept[static_cast<std::size_t>(u)] * hidden, hidden, s.xn.data() + u * hidden);
    linears({{LinearRole::kQ, s.q.data()}}, s.xn.data(), u_count);
  }
  add_bias(s.q.data(), w.bq, u_count);
  add_bias(s.k.data(), w.bk, t_count);
  add_bias(s.v.data(), w.bv, t_count);
  if (c.qk_norm) {
    for (std::int64_t h = 0; h < u_count * c.num_attention_heads; ++h)
      norm(s.q.data() + h * c.head_dim, w.q_norm.data(), c.head_dim, s.q.data() + h * c.head_dim);
    for (std::int64_t h = 0; h < t_count * c.num_key_value_heads; ++h)
      norm(s.k.data() + h * c.head_dim, w.k_norm.data(), c.head_dim, s.k.data() + h * c.head_dim);
  }
  std::int64_t row0 = 0, u0 = 0;
  for (const Segment& seg : segments) {
    for (std::int64_t i = 0; i < seg.rows; ++i) {
      const std::int64_t t = row0 + i;
      rotate(s.k.data() + t * kv_dim, c.num_key_value_heads, seg.pos0 + i, s.cos_sin);
      std::copy_n(s.k.data() + t * kv_dim, kv_dim, seg.cache->key(cache_layer, seg.pos0 + i));
      std::copy_n(s.v.data() + t * kv_dim, kv_dim, seg.cache->value(cache_layer, seg.pos0 + i));
    }
    const std::int64_t queries = seg.rows - seg.skip;
    for (std::int64_t i = 0; i < queries; ++i)
      rotate(s.q.data() + (u0 + i) * q_dim, c.num_attention_heads, seg.pos0 + seg.skip + i, s.cos_sin);
    if (queries > 0)
      attention(s.q.data() + u0 * q_dim, queries, seg.pos0 + seg.skip, cache_layer, c.window(l), *seg.cache,
                s.att.data() + u0 * q_dim, t_count);
    row0 += seg.rows;
    u0 += queries;
  }
  if (u_count == 0) return;
  linears({{LinearRole::kO, s.proj.data()}}, s.att.data(), u_count);
  add_bias(s.proj.data(), w.bo, u_count);
  add_to_kept();

  norm_rows(w.mlp_norm, !all_kept);
  linears({{LinearRole::kGate, s.gate.data()}, {LinearRole::kUp, s.up.data()}}, s.xn.data(), u_count);
  if (c.numerics == Numerics::kGgml) {
    ggml_silu_mul(s.gate.data(), s.up.data(), u_count, c.intermediate_size);
  } else {
    const std::int64_t ff = c.intermediate_size;  // rows over the pool: elementwise, the same bits at any split
    pool_->parallel_for(u_count, [&](std::int64_t r0, std::int64_t r1) {
      swiglu(s.gate.data() + r0 * ff, s.up.data() + r0 * ff, (r1 - r0) * ff);
    });
  }
  linears({{LinearRole::kDown, s.proj.data()}}, s.gate.data(), u_count);
  add_to_kept();
}

void LlamaModel::embed(std::span<const std::int32_t> tokens, float* x) const {
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const std::int32_t id = tokens[t];
    if (id < 0 || id >= config_.vocab_size)
      fail("token id {} is outside the vocabulary [0, {})", id, config_.vocab_size);
    dequantize_row(embed_, id, x + static_cast<std::int64_t>(t) * config_.hidden_size);
  }
}

void LlamaModel::forward_block(std::int64_t layer, float* x, std::int64_t t_count, const LinearObserver& observe,
                               const LinearCompute& compute) {
  forward_block(layer, x, std::span(&t_count, 1), observe, compute);
}

void LlamaModel::forward_block(std::int64_t layer, float* x, std::span<const std::int64_t> lengths,
                               const LinearObserver& observe, const LinearCompute& compute,
                               std::span<const std::int64_t> skip) {
  if (layer < 0 || layer >= config_.num_hidden_layers)
    fail("forward_block: layer {} is outside [0, {})", layer, config_.num_hidden_layers);
  if (lengths.empty()) fail("forward_block: no sequences");
  if (!skip.empty() && skip.size() != lengths.size())
    fail("forward_block: {} skip counts for {} sequences", skip.size(), lengths.size());
  for (std::size_t i = 0; i < skip.size(); ++i)
    if (skip[i] < 0 || skip[i] > lengths[i])
      fail("forward_block: skip {} of sequence {} is outside [0, {}]", skip[i], i, lengths[i]);
  std::int64_t total = 0;
  for (const std::int64_t t : lengths) {
    if (t < 1 || t > context_limit()) fail("forward_block: {} tokens is outside [1, {}]", t, context_limit());
    total += t;
  }
  if (!block_pass_ || !std::ranges::equal(block_pass_->lengths, lengths)) {
    block_pass_.reset();
    block_pass_ = std::make_unique<BlockPass>(config_, lengths);
  }
  std::vector<Segment> segments;
  segments.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i)
    segments.push_back({&block_pass_->caches[i], 0, lengths[i], skip.empty() ? 0 : skip[i]});
  scratch_->fit(config_, total);
  block(layer, x, segments, 0, *scratch_, observe ? &observe : nullptr, compute ? &compute : nullptr);
}

QuantMatrix& LayerWeights::linear(LinearRole role) {
  switch (role) {
    case LinearRole::kQ: return wq;
    case LinearRole::kK: return wk;
    case LinearRole::kV: return wv;
    case LinearRole::kO: return wo;
    case LinearRole::kGate: return gate;
    case LinearRole::kUp: return up;
    case LinearRole::kDown: return down;
  }
  fail("no block linear of role {}", static_cast<int>(role));
}

std::vector<float>& LayerWeights::bias(LinearRole role) {
  switch (role) {
    case LinearRole::kQ: return bq;
    case LinearRole::kK: return bk;
    case LinearRole::kV: return bv;
    case LinearRole::kO: return bo;
    default: fail("block linear {} has no bias", linear_spec(role).module);
  }
}

const QuantMatrix& LayerWeights::linear(LinearRole role) const {
  return const_cast<LayerWeights&>(*this).linear(role);
}

QuantMatrix& LlamaModel::block_linear(std::int64_t layer, LinearRole role) {
  if (layer < 0 || layer >= config_.num_hidden_layers)
    fail("block_linear: no layer {} (the model has {})", layer, config_.num_hidden_layers);
  return layers_[static_cast<std::size_t>(layer)].linear(role);
}

void LlamaModel::forward(std::span<const std::int32_t> tokens, KVCache& cache, bool all_logits,
                         std::vector<float>& logits) {
  const auto t_count = static_cast<std::int64_t>(tokens.size());
  if (t_count == 0) fail("forward: no tokens");
  const std::int64_t pos0 = cache.size();
  if (pos0 + t_count > cache.capacity)
    fail("context full: {} cached + {} new tokens exceed the cache of {}", pos0, t_count, cache.capacity);
  cache.grow(pos0 + t_count);
  const Segment whole{&cache, pos0, t_count};
  run(micro_batches(tokens, std::span(&whole, 1), all_logits), logits);
}

void LlamaModel::forward_batch(std::span<const std::int32_t> tokens, std::span<const std::int64_t> rows,
                               std::span<KVCache* const> caches, std::vector<float>& logits) {
  if (caches.empty() || rows.size() != caches.size())
    fail("forward_batch: {} row counts for {} caches (one each, at least one)", rows.size(), caches.size());
  std::vector<Segment> segments;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < caches.size(); ++i) {
    KVCache* cache = caches[i];
    if (rows[i] < 1) fail("forward_batch: sequence {} has {} tokens (at least one)", i, rows[i]);
    if (cache->size() + rows[i] > cache->capacity)
      fail("context full: {} cached + {} new tokens exceed the cache of {}", cache->size(), rows[i], cache->capacity);
    for (const Segment& seg : segments)
      if (seg.cache == cache) fail("forward_batch: a cache appears twice");
    segments.push_back({cache, cache->size(), rows[i]});
    total += rows[i];
  }
  if (total != static_cast<std::int64_t>(tokens.size()))
    fail("forward_batch: {} tokens for {} rows", tokens.size(), total);
  for (const Segment& seg : segments) seg.cache->grow(seg.pos0 + seg.rows);
  run(micro_batches(tokens, segments, false), logits);
}

std::vector<LlamaModel::Part> LlamaModel::micro_batches(std::span<const std::int32_t> tokens,
                                                        std::span<const Segment> segments, bool all_logits) const {
  const auto total = static_cast<std::int64_t>(tokens.size());
  // A pipeline's pass runs in micro-batches whose states move on as each is done: a rank works on one while
  // the next rank works on the one before. The same bits as one pass (the kernels' outputs do not depend on
  // the batch).
  const int stages = pipeline_ != nullptr ? pipeline_->size() : 1;
  const std::int64_t step = all_logits || stages == 1 || total < 2 * kMinMicroBatch
                                ? total
                                : std::max<std::int64_t>(kMinMicroBatch, (total + 4 * stages - 1) / (4 * stages));
  std::vector<Part> parts;
  std::int64_t begin = 0, rows = 0;  // the current part's first row of the pass and its rows so far
  const auto close = [&] {
    parts.back().tokens = tokens.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(rows));
    begin += rows;
    rows = 0;
  };
  parts.emplace_back();
  for (const Segment& seg : segments) {
    for (std::int64_t done = 0; done < seg.rows;) {
      if (rows == step) {
        close();
        parts.emplace_back();
      }
      const std::int64_t take = std::min(seg.rows - done, step - rows);
      parts.back().segments.push_back({seg.cache, seg.pos0 + done, take});
      if (all_logits)
        for (std::int64_t r = rows; r < rows + take; ++r) parts.back().logit_rows.push_back(r);
      done += take;
      rows += take;
      if (done == seg.rows && !all_logits) parts.back().logit_rows.push_back(rows - 1);  // the sequence's last row
    }
  }
  close();
  return parts;
}

void LlamaModel::final_logits(const float* x, std::span<const std::int64_t> logit_rows, std::vector<float>& logits) {
  const ModelConfig& c = config_;
  const auto rows = static_cast<std::int64_t>(logit_rows.size());
  const std::int64_t hidden = c.hidden_size;
  // x may be the scratch's residual (run()): fit() must not reallocate it, so no more rows than it holds.
  if (x == scratch_->residual.data() && rows > scratch_->rows)
    fail("final_logits: {} rows of logits for a pass of {} tokens", rows, scratch_->rows);
  scratch_->fit(c, rows);
  float* xn = scratch_->xn.data();
  for (std::int64_t i = 0; i < rows; ++i)
    norm(x + logit_rows[static_cast<std::size_t>(i)] * hidden, final_norm_.data(), hidden, xn + i * hidden);
  logits.resize(static_cast<std::size_t>(rows * c.vocab_size));
  matmul(output_matrix(), xn, rows, logits.data(), *pool_, *workspace_);
}

void LlamaModel::head(const float* x, std::int64_t rows, std::vector<float>& logits) {
  if (rows < 1) fail("head: {} rows (at least one)", rows);
  std::vector<std::int64_t> all(static_cast<std::size_t>(rows));
  std::iota(all.begin(), all.end(), 0);
  final_logits(x, all, logits);
}

void LlamaModel::run(std::span<const Part> parts, std::vector<float>& logits) {
  const ModelConfig& c = config_;
  const std::int64_t hidden = c.hidden_size;
  // Every stage refuses a bad id before any part runs (and before it waits for states that stage 0 would
  // never send).
  for (const Part& part : parts)
    for (const std::int32_t id : part.tokens)
      if (id < 0 || id >= c.vocab_size) fail("token id {} is outside the vocabulary [0, {})", id, c.vocab_size);
  const int stage = pipeline_ != nullptr ? pipeline_->rank() : 0, stages = pipeline_ != nullptr ? pipeline_->size() : 1;
  const bool last_stage = stage + 1 == stages;
  std::vector<float> held;  // the last stage's states of the logit rows of several parts, for one lm_head pass
  std::int64_t logit_rows = 0;
  for (const Part& part : parts) {
    const auto t_count = static_cast<std::int64_t>(part.tokens.size());
    Scratch& s = *scratch_;
    s.fit(c, t_count);
    float* x = s.residual.data();  // (T, hidden)
    const std::span<float> states(x, static_cast<std::size_t>(t_count * hidden));
    if (stage == 0)
      embed(part.tokens, x);
    else
      pipeline_->receive(stage - 1, std::as_writable_bytes(states));
    for (std::int64_t l = first_block_; l < last_block_; ++l) block(l, x, part.segments, l, s, nullptr);
    for (const Segment& seg : part.segments) seg.cache->length = seg.pos0 + seg.rows;
    if (!last_stage) {
      pipeline_->send(stage + 1, std::as_bytes(states));
    } else if (parts.size() == 1) {
      if (!part.logit_rows.empty()) final_logits(x, part.logit_rows, logits);
    } else {
      for (const std::int64_t r : part.logit_rows) held.insert(held.end(), x + r * hidden, x + (r + 1) * hidden);
    }
    logit_rows += static_cast<std::int64_t>(part.logit_rows.size());
    if (t_count > kKeptPassTokens) {  // a long prompt's buffers (~0.2 MB per token at 7B) are not kept for the decodes after it
      *scratch_ = Scratch();
      *workspace_ = Workspace();
    }
  }
  if (last_stage && parts.size() > 1 && logit_rows > 0) {
    std::vector<std::int64_t> rows(static_cast<std::size_t>(logit_rows));
    std::iota(rows.begin(), rows.end(), 0);
    final_logits(held.data(), rows, logits);
  }
  logits.resize(static_cast<std::size_t>(logit_rows * c.vocab_size));
  // Only once the last part is through: the ranks overlap on the parts before.
  if (stages > 1 && logit_rows > 0) pipeline_->broadcast(stages - 1, std::as_writable_bytes(std::span(logits)));
}

}  // namespace woq
