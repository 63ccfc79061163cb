// kernels/ggml_numerics.h: llama.cpp's rounding outside the matrix products.
// - Against ggml's own outputs (tests/data/ggml_numerics: SiLU, RMSNorm and
//   both RoPE modes from ggml c392e5094's AVX-512 and AVX2 builds, README
//   there), bit for bit, for each lane width.
// - Each ISA's kernels against the scalar code of their width, bit for bit;
//   attention also against an f64 reference, prefill against token-by-token
//   decode, windows, GQA, odd head sizes, 1 and 2 threads.
// The whole model against llama.cpp's logits and text: tests/llama_parity_test.cc.
#include "kernels/ggml_numerics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace woq {
namespace {

// The fixtures' inputs: the generator's hash of (i, salt), in [-0.5, 0.5).
float input(int i, int salt) {
  std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ static_cast<std::uint32_t>(salt) * 40503u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f;
}

using Fixture = std::map<std::string, std::vector<float>>;

// "name n" then n hex floats (%a), per section.
Fixture read_fixture(const std::string& file) {
  std::ifstream in(std::string(WOQ_TEST_DATA "/ggml_numerics/") + file);
  EXPECT_TRUE(in) << file;
  Fixture f;
  std::string name;
  std::size_t n = 0;
  while (in >> name >> n) {
    std::vector<float>& v = f[name];
    std::string hex;
    for (std::size_t i = 0; i < n && in >> hex; ++i) v.push_back(std::strtof(hex.c_str(), nullptr));
    EXPECT_EQ(v.size(), n) << file << " " << name;
  }
  return f;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<Isa> isas_here() {
  std::vector<Isa> v;
  for (const Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (cpu_supports(isa)) {
      v.push_back(isa);
    } else {
      std::printf("not tested here: %s (needs %s)\n", isa_name(isa).data(), isa_requirements(isa).data());
    }
  }
  return v;
}

// The generator's SiLU inputs: a row of 640 spanning exp's range (and its overflow), and a row of 37 (tails).
std::vector<float> silu_input(int n) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    x[static_cast<std::size_t>(i)] = n == 37   ? input(i, 3) * 20.0f
                                     : i < 600 ? -120.0f + 0.4f * static_cast<float>(i) + input(i, 1) * 0.4f
                                               : input(i, 2) * 8.0f;
  return x;
}

TEST(GgmlNumerics, SiluIsGgmlsOfEachBuild) {
  for (const auto& [file, lanes] : {std::pair{"avx512.txt", 16}, std::pair{"avx2.txt", 8}}) {
    const Fixture f = read_fixture(file);
    for (const int n : {640, 37}) {
      const std::vector<float> ones(static_cast<std::size_t>(n), 1.0f);
      std::vector<float> y = silu_input(n);
      ggml_silu_mul_reference(y.data(), ones.data(), 1, n, lanes);
      EXPECT_TRUE(same_bits(y, f.at("silu" + std::to_string(n)))) << file << " n = " << n;
    }
  }
  // The two builds differ (their exp does), so each reference is the one of its width.
  EXPECT_FALSE(same_bits(read_fixture("avx512.txt").at("silu640"), read_fixture("avx2.txt").at("silu640")));
}

TEST(GgmlNumerics, RmsNormAndRopeAreGgmls) {
  for (const auto& [file, lanes] : {std::pair{"avx512.txt", 16}, std::pair{"avx2.txt", 8}}) {
    const Fixture f = read_fixture(file);
    std::vector<float> x(1000), w(1000), y(1000);
    for (int i = 0; i < 1000; ++i) {
      x[static_cast<std::size_t>(i)] = input(i, 4) * 3.0f;
      w[static_cast<std::size_t>(i)] = 1.0f + input(i, 5);
    }
    ggml_rms_norm(x.data(), w.data(), 1000, 1e-5f, y.data());
    EXPECT_TRUE(same_bits(y, f.at("rms_norm1000"))) << file;
    // ggml's input rows [d] x 2 heads x 2 positions; normal mode rotates pairs (2i, 2i+1) (the layout of a
    // GGUF's permuted q/k rows), neox pairs (i, i + d/2): both given here in HF's layout. d = 36 and 50 leave
    // pairs past GCC's vector loop (18 and 25 pairs), which ggml rotates without fused multiply-adds.
    const std::int64_t heads = 2;
    const std::int64_t pos[2] = {3, 1000};
    for (const std::int64_t d : {64, 36, 50}) {
      GgmlRope rope;
      rope.theta_scale = std::pow(10000.0f, -2.0f / static_cast<float>(d));
      for (const bool interleave : {true, false}) {
        std::vector<float> got(static_cast<std::size_t>(d * heads * 2)), cos_sin(static_cast<std::size_t>(d));
        for (std::int64_t v = 0; v < heads * 2; ++v)
          for (std::int64_t i = 0; i < d / 2; ++i) {
            const int a = static_cast<int>(v * d + (interleave ? 2 * i : i));
            const int b = static_cast<int>(v * d + (interleave ? 2 * i + 1 : i + d / 2));
            got[static_cast<std::size_t>(v * d + i)] = input(a, 6);
            got[static_cast<std::size_t>(v * d + i + d / 2)] = input(b, 6);
          }
        for (int t = 0; t < 2; ++t) {
          ggml_rope_angles(rope, d, pos[t], cos_sin.data());
          ggml_rope(got.data() + t * heads * d, heads, d, cos_sin.data(), interleave, lanes);
        }
        const std::string name = std::string(interleave ? "rope_normal" : "rope_neox") + (d == 64 ? "" : std::to_string(d));
        EXPECT_TRUE(same_bits(got, f.at(name))) << file << " " << name;
      }
    }
  }
}

// The generator's attention: d 64, 4 heads, 2 kv heads; q, keys and values 2 input(i, 7 / 8 / 9) in ggml's
// layouts (q [T][heads][d], cells [position][kv heads][d], V transposed).
TEST(GgmlNumerics, AttentionIsGgmlsForBatchesAndSingleTokens) {
  const std::int64_t heads = 4, kv_heads = 2, cells = 96;
  ThreadPool pool(2);
  for (const std::int64_t d : {64, 36}) {  // 36: ggml_vec_dot_f32's leftovers (rounded products, then fused)
    std::vector<float> k(static_cast<std::size_t>(cells * kv_heads * d)), v(k.size());
    std::vector<const float*> kt, vt;
    for (std::size_t i = 0; i < k.size(); ++i) {
      k[i] = 2 * input(static_cast<int>(i), 8);
      v[i] = 2 * input(static_cast<int>(i), 9);
    }
    for (std::int64_t b = 0; b < cells / kAttentionKeyTile; ++b) {
      kt.push_back(k.data() + b * kAttentionKeyTile * kv_heads * d);
      vt.push_back(v.data() + b * kAttentionKeyTile * kv_heads * d);
    }
    const KvTiles kv{kt, vt, kv_heads * d};
    const AttentionShape shape{heads, kv_heads, d, 0};
    for (const auto& [file, lanes] : {std::pair{"avx512.txt", 16}, std::pair{"avx2.txt", 8}}) {
      const Fixture f = read_fixture(file);
      for (const auto& [section, pos0, tokens] : {std::tuple{"attn_decode77", 77, 1}, std::tuple{"attn_decode40", 40, 1},
                                                  std::tuple{"attn_batch6", 0, 6}}) {
        const std::string name = std::string(section) + (d == 64 ? "" : "_d36");
        std::vector<float> q(static_cast<std::size_t>(tokens * heads * d)), out(q.size());
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = 2 * input(static_cast<int>(i), 7);
        const bool single = tokens == 1;
        ggml_causal_attention_reference(q.data(), tokens, pos0, shape, kv, out.data(), pool, lanes, single);
        EXPECT_TRUE(same_bits(out, f.at(name))) << file << " " << name;
        for (const Isa isa : isas_here()) {
          if (ggml_lanes(isa) != lanes) continue;
          ggml_causal_attention(q.data(), tokens, pos0, shape, kv, out.data(), pool, isa, single);
          EXPECT_TRUE(same_bits(out, f.at(name))) << file << " " << name << " " << isa_name(isa);
        }
      }
    }
  }
}

TEST(GgmlNumerics, ExpIsAnExpWithGgmlsEdges) {
  for (const int lanes : {8, 16}) {
    for (float x = -87.0f; x < 88.0f; x += 0.013f) {
      const double want = std::exp(static_cast<double>(x));
      EXPECT_NEAR(ggml_expf(x, lanes), want, 3e-7 * want) << x << " lanes " << lanes;
    }
    EXPECT_EQ(ggml_expf(0.0f, lanes), 1.0f);
    EXPECT_EQ(ggml_expf(-std::numeric_limits<float>::infinity(), lanes), 0.0f);
    EXPECT_EQ(ggml_expf(std::numeric_limits<float>::infinity(), lanes), std::numeric_limits<float>::infinity());
    EXPECT_EQ(ggml_expf(-200.0f, lanes), 0.0f);
    EXPECT_EQ(ggml_expf(200.0f, lanes), std::numeric_limits<float>::infinity());
  }
  EXPECT_TRUE(std::isnan(ggml_expf(std::numeric_limits<float>::quiet_NaN(), 16)));
  EXPECT_THROW(ggml_expf(1.0f, 4), Error);
}

TEST(GgmlNumerics, EachIsaSiluIsItsWidthsReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  for (const std::int64_t n : {1, 7, 16, 37, 2816}) {
    std::vector<float> gate(static_cast<std::size_t>(3 * n)), up(gate.size());
    for (auto& v : gate) v = nd(rng);
    for (auto& v : up) v = nd(rng) / 30.0f;
    for (const Isa isa : isas_here()) {
      std::vector<float> got = gate, want = gate;
      ggml_silu_mul(got.data(), up.data(), 3, n, isa);
      ggml_silu_mul_reference(want.data(), up.data(), 3, n, ggml_lanes(isa));
      EXPECT_TRUE(same_bits(got, want)) << isa_name(isa) << " n = " << n;
    }
  }
}

// Keys and values of `positions` positions in tiles of kAttentionKeyTile rows [kv_heads · d].
struct Cache {
  std::vector<float> k, v;
  std::vector<const float*> kt, vt;
  std::int64_t stride;
  Cache(std::int64_t positions, std::int64_t kv_heads, std::int64_t d, std::mt19937& rng) : stride(kv_heads * d) {
    const std::int64_t tiles = (positions + kAttentionKeyTile - 1) / kAttentionKeyTile;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    k.resize(static_cast<std::size_t>(tiles * kAttentionKeyTile * stride));
    v.resize(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (std::int64_t b = 0; b < tiles; ++b) {
      kt.push_back(k.data() + b * kAttentionKeyTile * stride);
      vt.push_back(v.data() + b * kAttentionKeyTile * stride);
    }
  }
  KvTiles tiles() const { return {kt, vt, stride}; }
};

// softmax(q·k / sqrt(d)) · v in double.
double f64_attention(const float* q, const Cache& c, std::int64_t p, std::int64_t window, std::int64_t kvh,
                     std::int64_t d, std::int64_t i) {
  const std::int64_t lo = window > 0 ? std::max<std::int64_t>(0, p - window + 1) : 0;
  std::vector<double> s;
  double max = -1e300;
  for (std::int64_t j = lo; j <= p; ++j) {
    double dot = 0;
    for (std::int64_t x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * c.k[static_cast<std::size_t>(j * c.stride + kvh * d + x)];
    s.push_back(dot / std::sqrt(static_cast<double>(d)));
    max = std::max(max, s.back());
  }
  double sum = 0, out = 0;
  for (std::int64_t j = lo; j <= p; ++j) {
    const double e = std::exp(s[static_cast<std::size_t>(j - lo)] - max);
    sum += e;
    out += e * c.v[static_cast<std::size_t>(j * c.stride + kvh * d + i)];
  }
  return out / sum;
}

TEST(GgmlNumerics, AttentionIsEachWidthsReferenceInAnyBatch) {
  std::mt19937 rng(5);
  struct Shape {
    std::int64_t heads, kv_heads, d, window, pos0, tokens;
  };
  for (const Shape& s : {Shape{4, 2, 64, 0, 0, 40}, Shape{6, 2, 24, 0, 5, 9}, Shape{2, 1, 128, 7, 30, 20},
                         Shape{8, 8, 32, 0, 61, 3}}) {
    const Cache cache(s.pos0 + s.tokens, s.kv_heads, s.d, rng);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> q(static_cast<std::size_t>(s.tokens * s.heads * s.d));
    for (auto& x : q) x = nd(rng);
    const AttentionShape shape{s.heads, s.kv_heads, s.d, s.window};
    for (const int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (const Isa isa : isas_here()) {
        std::vector<float> got(q.size()), want(q.size()), one(q.size());
        ggml_causal_attention(q.data(), s.tokens, s.pos0, shape, cache.tiles(), got.data(), pool, isa);
        ggml_causal_attention_reference(q.data(), s.tokens, s.pos0, shape, cache.tiles(), want.data(), pool,
                                        ggml_lanes(isa));
        EXPECT_TRUE(same_bits(got, want)) << isa_name(isa) << " d = " << s.d;
        const std::int64_t row = s.heads * s.d;
        for (std::int64_t t = 0; t < s.tokens; ++t)  // decode: one token at a time
          ggml_causal_attention(q.data() + t * row, 1, s.pos0 + t, shape, cache.tiles(), one.data() + t * row, pool, isa);
        EXPECT_TRUE(same_bits(one, got)) << isa_name(isa) << " d = " << s.d;
        // A pass of one row (llama.cpp's one-token batch) sums V in ggml_vec_dot_f32's order instead.
        std::vector<float> single(q.size()), single_want(q.size());
        for (std::int64_t t = 0; t < s.tokens; ++t) {
          ggml_causal_attention(q.data() + t * row, 1, s.pos0 + t, shape, cache.tiles(), single.data() + t * row, pool,
                                isa, true);
          ggml_causal_attention_reference(q.data() + t * row, 1, s.pos0 + t, shape, cache.tiles(),
                                          single_want.data() + t * row, pool, ggml_lanes(isa), true);
        }
        EXPECT_TRUE(same_bits(single, single_want)) << isa_name(isa) << " d = " << s.d;
        for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(single[i], got[i], 1e-5) << isa_name(isa) << " " << i;
        for (std::int64_t t = 0; t < s.tokens; ++t)
          for (std::int64_t h = 0; h < s.heads; ++h)
            for (std::int64_t i = 0; i < s.d; ++i) {
              const double want64 = f64_attention(q.data() + t * row + h * s.d, cache, s.pos0 + t, s.window,
                                                  h / (s.heads / s.kv_heads), s.d, i);
              ASSERT_NEAR(got[static_cast<std::size_t>(t * row + h * s.d + i)], want64, 2e-5)
                  << isa_name(isa) << " t " << t << " h " << h << " i " << i;
            }
      }
    }
  }
  ThreadPool pool(1);
  const Cache cache(8, 1, 8, rng);
  std::vector<float> q(16), out(16);
  EXPECT_THROW(ggml_causal_attention(q.data(), 1, 0, AttentionShape{3, 2, 8, 0}, cache.tiles(), out.data(), pool), Error);
  EXPECT_THROW(ggml_causal_attention(q.data(), 2, 40, AttentionShape{2, 1, 8, 0}, cache.tiles(), out.data(), pool), Error);
  EXPECT_THROW(ggml_causal_attention(q.data(), 2, 0, AttentionShape{1, 1, 8, 0}, cache.tiles(), out.data(), pool,
                                     active_isa(), true),
               Error);
}

}  // namespace
}  // namespace woq
