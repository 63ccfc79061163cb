// The tiled attention kernel against an f64 reference at long context (GQA,
// sliding windows, odd head sizes), on every ISA this CPU runs and 1 and 2
// threads; and its exactness: the same bits in any batch, with any thread
// count and on every ISA.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/workspace.h"

namespace woq {
namespace {

// Keys and values of `positions` positions, [tiles · kAttentionKeyTile, kv_dim]; the rows past the last
// position are NaN (the kernel must never use them).
struct Cache {
  Cache(const AttentionShape& s, std::int64_t positions, std::uint32_t seed) : shape(s), kv_dim(s.kv_heads * s.head_dim) {
    const std::int64_t tiles = (positions + kAttentionKeyTile - 1) / kAttentionKeyTile;
    k.assign(static_cast<std::size_t>(tiles * kAttentionKeyTile * kv_dim), std::numeric_limits<float>::quiet_NaN());
    v = k;
    std::mt19937 rng(seed);
    // Scores q·k/√d of standard deviation ~2: a peaked softmax whose running maximum grows over the tiles.
    std::normal_distribution<float> normal(0.0f, 1.5f);
    for (std::int64_t i = 0; i < positions * kv_dim; ++i) {
      k[static_cast<std::size_t>(i)] = normal(rng);
      v[static_cast<std::size_t>(i)] = normal(rng);
    }
    for (std::int64_t b = 0; b < tiles; ++b) {
      keys.push_back(k.data() + b * kAttentionKeyTile * kv_dim);
      values.push_back(v.data() + b * kAttentionKeyTile * kv_dim);
    }
  }
  KvTiles tiles() const { return {keys, values, kv_dim}; }
  const float* key(std::int64_t pos, std::int64_t kvh) const { return k.data() + pos * kv_dim + kvh * shape.head_dim; }
  const float* value(std::int64_t pos, std::int64_t kvh) const { return v.data() + pos * kv_dim + kvh * shape.head_dim; }

  AttentionShape shape;
  std::int64_t kv_dim;
  std::vector<float> k, v;
  std::vector<const float*> keys, values;
};

std::vector<float> random_queries(const AttentionShape& s, std::int64_t t_count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> q(static_cast<std::size_t>(t_count * s.heads * s.head_dim));
  for (float& x : q) x = normal(rng);
  return q;
}

// Attention in float64: scores, softmax over the causal (windowed) positions, weighted sum.
std::vector<double> reference(const std::vector<float>& q, std::int64_t t_count, std::int64_t pos0, const Cache& c) {
  const AttentionShape& s = c.shape;
  const std::int64_t d = s.head_dim, q_dim = s.heads * d, group = s.heads / s.kv_heads;
  std::vector<double> out(static_cast<std::size_t>(t_count * q_dim));
  for (std::int64_t t = 0; t < t_count; ++t) {
    const std::int64_t last = pos0 + t + 1, first = s.window > 0 ? std::max<std::int64_t>(0, last - s.window) : 0;
    for (std::int64_t h = 0; h < s.heads; ++h) {
      const float* qh = q.data() + t * q_dim + h * d;
      std::vector<double> w(static_cast<std::size_t>(last - first));
      double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (std::int64_t j = first; j < last; ++j) {
        double dot = 0.0;
        for (std::int64_t i = 0; i < d; ++i) dot += double(qh[i]) * double(c.key(j, h / group)[i]);
        w[static_cast<std::size_t>(j - first)] = dot / std::sqrt(double(d));
        max = std::max(max, w[static_cast<std::size_t>(j - first)]);
      }
      for (double& x : w) sum += (x = std::exp(x - max));
      double* o = out.data() + t * q_dim + h * d;
      for (std::int64_t j = first; j < last; ++j)
        for (std::int64_t i = 0; i < d; ++i) o[i] += w[static_cast<std::size_t>(j - first)] / sum * c.value(j, h / group)[i];
    }
  }
  return out;
}

// With `ws`, the call reuses its buffers (else a fresh Workspace).
std::vector<float> run(const std::vector<float>& q, std::int64_t t_count, std::int64_t pos0, const Cache& c, int threads,
                       Isa isa, Workspace* ws = nullptr) {
  ThreadPool pool(threads);
  std::vector<float> out(static_cast<std::size_t>(t_count * c.shape.heads * c.shape.head_dim));
  if (ws != nullptr) causal_attention(q.data(), t_count, pos0, c.shape, c.tiles(), out.data(), pool, *ws, isa);
  else causal_attention(q.data(), t_count, pos0, c.shape, c.tiles(), out.data(), pool, isa);
  return out;
}

void print_unavailable_isas() {
  for (Isa isa : all_isas())
    if (!cpu_supports(isa)) std::printf("not run on this CPU: %s (%s)\n", isa_name(isa).data(), isa_requirements(isa).data());
}

struct Case {
  AttentionShape shape;
  std::int64_t pos0, t_count;
};

TEST(Attention, MatchesF64ReferenceAtLongContext) {
  print_unavailable_isas();
  const AttentionShape gqa{.heads = 8, .kv_heads = 2, .head_dim = 128};
  const AttentionShape window{.heads = 6, .kv_heads = 3, .head_dim = 40, .window = 300};
  const AttentionShape tiny{.heads = 4, .kv_heads = 4, .head_dim = 8};  // stories260K's heads: no whole vector
  const std::vector<Case> cases = {{gqa, 0, 64 + 3},  {gqa, 600, 17},     {gqa, 1999, 1},    {gqa, 1000, 7},
                                   {window, 0, 600},  {window, 1500, 17}, {window, 1800, 1}, {window, 333, 64 + 3},
                                   {tiny, 5, 64 + 3}, {tiny, 700, 1}};
  for (const Case& c : cases) {
    const Cache cache(c.shape, c.pos0 + c.t_count, static_cast<std::uint32_t>(c.pos0 + 7));
    const std::vector<float> q = random_queries(c.shape, c.t_count, static_cast<std::uint32_t>(c.t_count));
    const std::vector<double> want = reference(q, c.t_count, c.pos0, cache);
    for (Isa isa : available_isas()) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(fmt::format("{} threads={} d={} heads={}/{} window={} pos0={} t_count={}", isa_name(isa), threads,
                                 c.shape.head_dim, c.shape.heads, c.shape.kv_heads, c.shape.window, c.pos0, c.t_count));
        const std::vector<float> got = run(q, c.t_count, c.pos0, cache, threads, isa);
        double worst = 0.0;
        for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
        // A score's f32 rounding is ~eps·|q||k|/√d ≈ 1.5e-6 at d = 128 here, and outputs are averages of N(0, 1.5²)
        // values: errors of a few 1e-6 (measured: 4.5e-6 at most); a missing rescale gives errors of order 1.
        EXPECT_LT(worst, 1e-5) << "largest |error|";
      }
    }
  }
}

// Prefill equals token-by-token decode and any other split of the tokens, bit for bit, whatever the thread count;
// the split runs carry one Workspace through shapes and chunk sizes (its buffers hold what the last call left).
TEST(Attention, SameBitsInAnyBatchAndThreadCount) {
  const std::int64_t positions = 333;
  Workspace ws;
  for (const AttentionShape& shape : {AttentionShape{.heads = 8, .kv_heads = 2, .head_dim = 72, .window = 100},
                                      AttentionShape{.heads = 4, .kv_heads = 4, .head_dim = 64}}) {
    const Cache cache(shape, positions, 11);
    const std::vector<float> q = random_queries(shape, positions, 12);
    const std::int64_t q_dim = shape.heads * shape.head_dim;
    for (Isa isa : available_isas()) {
      SCOPED_TRACE(fmt::format("{} window={}", isa_name(isa), shape.window));
      const std::vector<float> whole = run(q, positions, 0, cache, 2, isa);
      for (std::int64_t chunk : {1, 7, 17, 64 + 3}) {
        for (int threads : {1, 2}) {
          std::vector<float> split(whole.size());
          for (std::int64_t t0 = 0; t0 < positions; t0 += chunk) {
            const std::int64_t n = std::min(chunk, positions - t0);
            const std::vector<float> part(q.begin() + t0 * q_dim, q.begin() + (t0 + n) * q_dim);
            const std::vector<float> got = run(part, n, t0, cache, threads, isa, &ws);
            std::copy(got.begin(), got.end(), split.begin() + t0 * q_dim);
          }
          EXPECT_EQ(std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)), 0)
              << "chunks of " << chunk << " tokens on " << threads << " threads";
        }
      }
    }
  }
}

// The ISAs' kernels give the scalar kernel's bits (the same operations in the same order, the same exp).
TEST(Attention, EveryIsaGivesTheScalarBits) {
  print_unavailable_isas();
  for (const AttentionShape& shape : {AttentionShape{.heads = 8, .kv_heads = 2, .head_dim = 128, .window = 200},
                                      AttentionShape{.heads = 3, .kv_heads = 1, .head_dim = 8 + 16 + 3}}) {
    const std::int64_t pos0 = 250, t_count = 64 + 3;
    const Cache cache(shape, pos0 + t_count, 21);
    const std::vector<float> q = random_queries(shape, t_count, 22);
    const std::vector<float> scalar = run(q, t_count, pos0, cache, 1, Isa::kScalar);
    for (Isa isa : available_isas()) {
      const std::vector<float> got = run(q, t_count, pos0, cache, 2, isa);
      EXPECT_EQ(std::memcmp(got.data(), scalar.data(), got.size() * sizeof(float)), 0)
          << isa_name(isa) << " head_dim " << shape.head_dim;
    }
  }
}

TEST(Attention, RefusesBadShapes) {
  const AttentionShape shape{.heads = 6, .kv_heads = 4, .head_dim = 8};
  const Cache cache(AttentionShape{.heads = 4, .kv_heads = 4, .head_dim = 8}, 40, 1);
  const std::vector<float> q(6 * 8);
  std::vector<float> out(q.size());
  ThreadPool pool(1);
  EXPECT_THROW(causal_attention(q.data(), 1, 0, shape, cache.tiles(), out.data(), pool), Error);
  const AttentionShape ok{.heads = 4, .kv_heads = 4, .head_dim = 8};
  EXPECT_THROW(causal_attention(q.data(), 1, 64, ok, cache.tiles(), out.data(), pool), Error);  // positions past the tiles
}

}  // namespace
}  // namespace woq
