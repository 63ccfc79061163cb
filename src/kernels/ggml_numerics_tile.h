// The kernels of ggml_numerics.h, written once over a policy P (its vectors
// of P::kLanes floats, its exp and its key-tile transpose) and compiled in one
// file per ISA (ggml_numerics.cc: the scalar reference of both widths;
// attention_avx2.cc, attention_avx512.cc beside woq's own attention, whose
// vector policies they extend), all with -ffp-contract=off:
// every fma here is a std::fma, every other product and sum two roundings, so
// that vectorizing the lane loops changes no bit.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention.h"

namespace woq::detail {

/// One call of ggml_causal_attention.
struct GgmlAttentionArgs {
  const float* q;
  float* out;
  std::int64_t t_count, pos0;
  AttentionShape shape;
  const KvTiles* kv;
  bool single_row_pass;  ///< V by ggml_vec_dot_f32 (llama.cpp's one-token batch), not tinyBLAS
};

/// Query rows per job of the batched form (ggml_attention_jobs).
inline constexpr std::int64_t kGgmlQueryTile = 32;

/// One ISA's entry points (one table per ISA file; the scalar ones in ggml_numerics.cc).
struct GgmlKernels {
  /// (head, query row) items [begin, end) of `a`, item i = h · t_count + t: one query at a time (decode).
  void (*items)(const GgmlAttentionArgs& a, std::int64_t begin, std::int64_t end);
  /// (kv head, tile of kGgmlQueryTile query rows) jobs [begin, end) of `a`, job i = u · kv_heads + kv head: the
  /// keys and values the tile reads transposed once into tiles of kAttentionKeyTile positions, then every query
  /// of the tile and of the group's heads against them (the same bits as `items`).
  void (*jobs)(const GgmlAttentionArgs& a, std::int64_t begin, std::int64_t end);
  /// Rows [begin, end) of ggml_silu_mul.
  void (*silu_rows)(float* gate, const float* up, std::int64_t begin, std::int64_t end, std::int64_t n);
};
extern const GgmlKernels kGgmlAvx2, kGgmlAvx512;

/// ggml_v_expf of the AVX-512F build for one lane: z = x·log2(e) + 1.5·2^23
/// rounds x·log2(e) to n, b = x - n·ln2 (ln2 in two parts), a degree-5
/// polynomial j ≈ e^b (with its 1), scaled by 2^n (VSCALEFPS); |n| > 192 gives
/// 0 or infinity.
inline float ggml_expf16(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : std::numeric_limits<float>::infinity();
  if (std::isnan(n)) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(j, static_cast<int>(n));  // VSCALEFPS: one rounding, as ldexp's
}

/// ggml_v_expf of the AVX2 + FMA build for one lane: the same reduction; the
/// polynomial without its 1 (j), the result k + k·j with k = 2^n built in the
/// exponent bits while |n| <= 126, two scaled factors beyond, 0 or infinity
/// (as s1·s1) beyond |n| > 192.
inline float ggml_expf8(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const std::uint32_t e = std::bit_cast<std::uint32_t>(z) << 23;
  const float k = std::bit_cast<float>(e + std::bit_cast<std::uint32_t>(1.0f));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, 0x1.ffffecp-1f * b);
  if (!(std::fabs(n) > 126.0f)) return std::fma(j, k, k);
  const std::uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = std::bit_cast<float>(g + 0x7f000000u);
  const float s2 = std::bit_cast<float>(e - g);
  if (std::fabs(n) > 192.0f) return s1 * s1;
  return std::fma(s2, j, s2) * s1;
}

namespace {  // internal linkage: each ISA file has its own copy, compiled with its flags

constexpr std::int64_t kTileKeys = kAttentionKeyTile;  // keys per transposed tile (attention_tile.h's kTileKeys)

/// The sum of L lanes as _mm512_reduce_add_ps (L = 16, GCC's tree) and
/// llamafile's hsum(__m256) / the softmax's AVX2 sum (L = 8) add them:
/// halves, then quarters, then (0 + 2) + (1 + 3).
template <int L>
float ggml_hsum(const float* a) {
  float s[8];
  if constexpr (L == 16) {
    for (int i = 0; i < 8; ++i) s[i] = a[i + 8] + a[i];
  } else {
    for (int i = 0; i < 8; ++i) s[i] = a[i];
  }
  float t[4];
  for (int i = 0; i < 4; ++i) t[i] = s[i + 4] + s[i];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

/// ggml_hsum of each column of rows [L, n] into out [n] (acc is overwritten).
template <int L>
void ggml_hsum_rows(float* acc, std::int64_t n, float* out) {
  const auto r = [&](int l) { return acc + l * n; };
  if constexpr (L == 16)
    for (int l = 0; l < 8; ++l)
      for (std::int64_t i = 0; i < n; ++i) r(l)[i] = r(l + 8)[i] + r(l)[i];
  for (int l = 0; l < 4; ++l)
    for (std::int64_t i = 0; i < n; ++i) r(l)[i] = r(l + 4)[i] + r(l)[i];
  for (std::int64_t i = 0; i < n; ++i) out[i] = (r(0)[i] + r(2)[i]) + (r(1)[i] + r(3)[i]);
}

/// The end of ggml_vec_dot_f32's leftovers [np, n) that GCC's code adds as rounded products: whole vectors of
/// L, then one of L/2 when that many are left (libggml-cpu's disassembly, both builds); the rest are fused.
template <int L>
std::int64_t ggml_leftovers_unfused(std::int64_t np, std::int64_t n) {
  std::int64_t i = np + (n - np) / L * L;
  if (n - i >= L / 2) i += L / 2;
  return i;
}

/// ggml_vec_dot_f32 of the L-lane build: four accumulators over steps of
/// 4·L, folded (0 + 2, 1 + 3, then 0 + 1) and reduced (L = 16:
/// _mm512_reduce_add_ps; L = 8: halves, then two hadds), then the leftovers
/// (ggml_leftovers_unfused).
template <int L>
float ggml_vec_dot(const float* x, const float* y, std::int64_t n) {
  const std::int64_t np = n & ~static_cast<std::int64_t>(4 * L - 1);
  float acc[4][L] = {};
  for (std::int64_t i = 0; i < np; i += 4 * L)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < L; ++l) acc[j][l] = std::fma(x[i + j * L + l], y[i + j * L + l], acc[j][l]);
  for (int l = 0; l < L; ++l) {
    acc[0][l] = acc[0][l] + acc[2][l];
    acc[1][l] = acc[1][l] + acc[3][l];
  }
  for (int l = 0; l < L; ++l) acc[0][l] = acc[0][l] + acc[1][l];
  float sum = 0.0f;
  if constexpr (L == 16) {
    sum = ggml_hsum<16>(acc[0]);
  } else {
    float t[4];
    for (int i = 0; i < 4; ++i) t[i] = acc[0][i] + acc[0][i + 4];
    sum = (t[0] + t[1]) + (t[2] + t[3]);
  }
  // The leftovers as GCC vectorized ggml's `sumf += x[i]*y[i]`: products rounded then added one by one for
  // whole vectors of L and one of L/2, then each of the last few fused.
  const std::int64_t unfused = ggml_leftovers_unfused<L>(np, n);
  for (std::int64_t i = np; i < unfused; ++i) sum = sum + x[i] * y[i];
  for (std::int64_t i = unfused; i < n; ++i) sum = std::fma(x[i], y[i], sum);
  return sum;
}

/// Scalar policy of L lanes: the reference of both widths. A policy gives vectors of L floats (R: load,
/// store, set1, add, mul, fma, each lane one IEEE operation: attention_tile.h's ISA policies), ggml_v_expf of
/// its build (exp) and the key-tile transpose (transpose).
template <int L>
struct GgmlScalar {
  static constexpr int kLanes = L;
  struct R {
    float v[L];
  };
  using V = R;
  static V load(const float* p) {
    V r;
    std::copy(p, p + L, r.v);
    return r;
  }
  static void store(float* p, const V& a) { std::copy(a.v, a.v + L, p); }
  static V set1(float x) {
    V r;
    std::fill(r.v, r.v + L, x);
    return r;
  }
  static V add(const V& a, const V& b) {
    V r;
    for (int l = 0; l < L; ++l) r.v[l] = a.v[l] + b.v[l];
    return r;
  }
  static V mul(const V& a, const V& b) {
    V r;
    for (int l = 0; l < L; ++l) r.v[l] = a.v[l] * b.v[l];
    return r;
  }
  static V fma(const V& a, const V& b, const V& c) {
    V r;
    for (int l = 0; l < L; ++l) r.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return r;
  }
  static void exp(const float* x, float* y) {
    for (int l = 0; l < L; ++l) y[l] = L == 16 ? ggml_expf16(x[l]) : ggml_expf8(x[l]);
  }
  /// kt[i · kTileKeys + j] = k[j · stride + i] for the n keys of a tile, 0 for the rest.
  static void transpose(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt) {
    for (std::int64_t i = 0; i < d; ++i)
      for (std::int64_t j = 0; j < kTileKeys; ++j) kt[i * kTileKeys + j] = j < n ? k[j * stride + i] : 0.0f;
  }
};

/// Rows [begin, end) of ggml_silu_mul: ggml_vec_silu_f32 then ggml_mul.
template <class P>
void ggml_silu_rows(float* gate, const float* up, std::int64_t begin, std::int64_t end, std::int64_t n) {
  constexpr int L = P::kLanes;
  float neg[L], e[L];
  for (std::int64_t r = begin; r < end; ++r) {
    float* g = gate + r * n;
    const float* u = up + r * n;
    std::int64_t i = 0;
    for (; i + L <= n; i += L) {
      for (int l = 0; l < L; ++l) neg[l] = 0.0f - g[i + l];
      P::exp(neg, e);
      for (int l = 0; l < L; ++l) g[i + l] = g[i + l] / (1.0f + e[l]) * u[i + l];
    }
    for (; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

/// Position j's row of `tiles` (kv head kvh).
inline const float* kv_row(std::span<const float* const> tiles, std::int64_t stride, std::int64_t d, std::int64_t j,
                           std::int64_t kvh) {
  return tiles[static_cast<std::size_t>(j / kAttentionKeyTile)] + (j % kAttentionKeyTile) * stride + kvh * d;
}

/// out = Σ_j v_j · (e_j · inv) over keys [lo, p] as ggml_vec_dot_f32 of the L-lane build sums each output over
/// llama.cpp's padded cache (n_kv = p + 1 rounded up to 32, its padding without flash attention): four
/// accumulators of L lanes over the first n_kv rounded down to 4·L positions, folded and reduced, then the
/// positions after them added one by one. acc: 4 · L · d floats.
template <int L>
void ggml_pv_vec_dot(const GgmlAttentionArgs& a, const float* e, float inv, std::int64_t lo, std::int64_t p,
                     std::int64_t kvh, std::vector<float>& acc, float* out) {
  const std::int64_t d = a.shape.head_dim, stride = a.kv->row_stride;
  const std::int64_t n_kv = (p + 1 + 31) / 32 * 32, np = n_kv & ~static_cast<std::int64_t>(4 * L - 1);
  acc.assign(static_cast<std::size_t>(4 * L * d), 0.0f);
  const std::int64_t vector_end = std::min(p + 1, np);
  for (std::int64_t j = lo; j < vector_end; ++j) {  // accumulator (j mod 4L) / L, lane j mod L
    const float pj = e[j] * inv;
    const float* v = kv_row(a.kv->values, stride, d, j, kvh);
    float* lane = acc.data() + (j % (4 * L)) * d;
    for (std::int64_t i = 0; i < d; ++i) lane[i] = std::fma(v[i], pj, lane[i]);
  }
  float* r[4];
  for (int c = 0; c < 4; ++c) r[c] = acc.data() + c * L * d;
  for (std::int64_t i = 0; i < L * d; ++i) {
    r[0][i] = r[0][i] + r[2][i];
    r[1][i] = r[1][i] + r[3][i];
  }
  for (std::int64_t i = 0; i < L * d; ++i) r[0][i] = r[0][i] + r[1][i];
  if constexpr (L == 16) {
    ggml_hsum_rows<16>(r[0], d, out);
  } else {  // GGML_F32x8_REDUCE: halves, then two hadds
    const auto row = [&](int l) { return r[0] + l * d; };
    for (std::int64_t i = 0; i < d; ++i)
      out[i] = (row(0)[i] + row(4)[i] + (row(1)[i] + row(5)[i])) + ((row(2)[i] + row(6)[i]) + (row(3)[i] + row(7)[i]));
  }
  for (std::int64_t j = std::max(lo, np); j <= p; ++j) {
    const float pj = e[j] * inv;
    const float* v = kv_row(a.kv->values, stride, d, j, kvh);
    for (std::int64_t i = 0; i < d; ++i) out[i] = out[i] + v[i] * pj;
  }
}

/// scores[kk] = ggml_vec_dot<L>(key kk, q) for the L keys of one chunk, from kt (key kk's element i at
/// kt[i · kTileKeys + kk], a transposed tile): each key's four accumulators, fold and sums as ggml_vec_dot, in P's
/// vectors of L keys.
template <class P>
void ggml_chunk_dots(const float* q, const float* kt, std::int64_t d, float* scores) {
  constexpr int L = P::kLanes;
  using V = typename P::R;
  const std::int64_t np = d & ~static_cast<std::int64_t>(4 * L - 1);
  V a[4 * L];  // slot = accumulator · L + lane, of every key; eight independent chains at a time
  for (int slot = 0; slot < 4 * L; slot += 8) {
    V acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = P::set1(0.0f);
    for (std::int64_t i = slot; i < np; i += 4 * L)
      for (int u = 0; u < 8; ++u) acc[u] = P::fma(P::set1(q[i + u]), P::load(kt + (i + u) * kTileKeys), acc[u]);
    for (int u = 0; u < 8; ++u) a[slot + u] = acc[u];
  }
  V x[L];  // lane l of every key after the fold (0 + 2, 1 + 3, then 0 + 1)
  for (int l = 0; l < L; ++l) x[l] = P::add(P::add(a[l], a[2 * L + l]), P::add(a[L + l], a[3 * L + l]));
  V sum;
  if constexpr (L == 16) {  // _mm512_reduce_add_ps
    V s8[8], t4[4];
    for (int i = 0; i < 8; ++i) s8[i] = P::add(x[i + 8], x[i]);
    for (int i = 0; i < 4; ++i) t4[i] = P::add(s8[i + 4], s8[i]);
    sum = P::add(P::add(t4[0], t4[2]), P::add(t4[1], t4[3]));
  } else {  // GGML_F32x8_REDUCE: halves, then two hadds
    V t4[4];
    for (int i = 0; i < 4; ++i) t4[i] = P::add(x[i], x[i + 4]);
    sum = P::add(P::add(t4[0], t4[1]), P::add(t4[2], t4[3]));
  }
  const std::int64_t unfused = ggml_leftovers_unfused<L>(np, d);  // as ggml_vec_dot
  for (std::int64_t i = np; i < unfused; ++i) sum = P::add(sum, P::mul(P::set1(q[i]), P::load(kt + i * kTileKeys)));
  for (std::int64_t i = unfused; i < d; ++i) sum = P::fma(P::set1(q[i]), P::load(kt + i * kTileKeys), sum);
  P::store(scores, sum);
}

/// Jobs [begin, end) of the batched form (see GgmlKernels::jobs).
template <class P>
void ggml_attention_jobs(const GgmlAttentionArgs& a, std::int64_t begin, std::int64_t end) {
  constexpr int L = P::kLanes;
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const AttentionShape& sh = a.shape;
  const std::int64_t d = sh.head_dim, group = sh.heads / sh.kv_heads, stride = a.kv->row_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  thread_local std::vector<float> kt, vt, e;
  for (std::int64_t job = begin; job < end; ++job) {
    // Causal work grows with the tile: jobs alternate between early and late tiles (0, last, 1, last - 1, ...)
    // so that contiguous ranges of jobs carry equal work.
    const std::int64_t tiles = (a.t_count + kGgmlQueryTile - 1) / kGgmlQueryTile, u = job / sh.kv_heads;
    const std::int64_t kvh = job % sh.kv_heads, t0 = (u % 2 == 0 ? u / 2 : tiles - 1 - u / 2) * kGgmlQueryTile;
    const std::int64_t tokens = std::min(kGgmlQueryTile, a.t_count - t0), last = a.pos0 + t0 + tokens - 1;
    const std::int64_t first = sh.window > 0 ? std::max<std::int64_t>(0, a.pos0 + t0 - sh.window + 1) : 0;
    // Key tiles [tb, te) hold every key the query tile sees, each transposed once: kt[(b · d + i) · kTileKeys + j]
    // is key b · kTileKeys + j's element i (0 past the last key), values alike.
    const std::int64_t tb = first / kTileKeys, te = last / kTileKeys + 1, cb = tb * kTileKeys / L;
    kt.resize(static_cast<std::size_t>((te - tb) * d * kTileKeys));
    vt.resize(kt.size());
    e.resize(static_cast<std::size_t>((te - tb) * kTileKeys));
    for (std::int64_t b = tb; b < te; ++b) {
      const std::int64_t n = std::min(kTileKeys, last + 1 - b * kTileKeys);
      P::transpose(kv_row(a.kv->keys, stride, d, b * kTileKeys, kvh), stride, n, d, kt.data() + (b - tb) * d * kTileKeys);
      P::transpose(kv_row(a.kv->values, stride, d, b * kTileKeys, kvh), stride, n, d, vt.data() + (b - tb) * d * kTileKeys);
    }
    // Chunk c (L keys) of the transposed tiles, at its element 0.
    const auto chunk = [&](const std::vector<float>& t, std::int64_t c) {
      return t.data() + (c * L / kTileKeys - tb) * d * kTileKeys + c * L % kTileKeys;
    };
    for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
      for (std::int64_t t = t0; t < t0 + tokens; ++t) {
        const std::int64_t p = a.pos0 + t;
        const std::int64_t lo = sh.window > 0 ? std::max<std::int64_t>(0, p - sh.window + 1) : 0;
        const std::int64_t c0 = lo / L, c1 = p / L + 1;
        const float* q = a.q + t * sh.heads * d + h * d;
        float* ec = e.data() + (c0 - cb) * L;  // chunk c0's lanes
        float max = kMasked;
        for (std::int64_t c = c0; c < c1; ++c) {
          float* sc = ec + (c - c0) * L;
          ggml_chunk_dots<P>(q, chunk(kt, c), d, sc);
          for (int kk = 0; kk < L; ++kk) {
            const std::int64_t j = c * L + kk;
            sc[kk] = j >= lo && j <= p ? sc[kk] * scale : kMasked;
            max = std::max(max, sc[kk]);
          }
        }
        double sum = 0.0;
        float x[L];
        for (std::int64_t c = c0; c < c1; ++c) {
          float* sc = ec + (c - c0) * L;
          for (int kk = 0; kk < L; ++kk) x[kk] = sc[kk] == kMasked ? kMasked : sc[kk] - max;
          P::exp(x, sc);
          sum += static_cast<double>(ggml_hsum<L>(sc));
        }
        const auto inv = static_cast<float>(1.0 / sum);
        for (std::int64_t i = 0; i < (c1 - c0) * L; ++i) ec[i] = ec[i] * inv;
        // tinyBLAS: lane kk of output i is a chain of fmas over the chunks; then the lanes summed.
        float* o = a.out + t * sh.heads * d + h * d;
        using V = typename P::R;
        constexpr std::int64_t kRows = 8;
        float lanes[L];
        for (std::int64_t i0 = 0; i0 < d; i0 += kRows) {
          const std::int64_t rows = std::min(kRows, d - i0);
          V acc[kRows];
          for (std::int64_t r = 0; r < kRows; ++r) acc[r] = P::set1(0.0f);
          for (std::int64_t c = c0; c < c1; ++c) {
            const V pc = P::load(ec + (c - c0) * L);
            const float* vc = chunk(vt, c) + i0 * kTileKeys;
            if (rows == kRows) {
              for (std::int64_t r = 0; r < kRows; ++r) acc[r] = P::fma(P::load(vc + r * kTileKeys), pc, acc[r]);
            } else {
              for (std::int64_t r = 0; r < rows; ++r) acc[r] = P::fma(P::load(vc + r * kTileKeys), pc, acc[r]);
            }
          }
          for (std::int64_t r = 0; r < rows; ++r) {
            P::store(lanes, acc[r]);
            o[i0 + r] = ggml_hsum<L>(lanes);
          }
        }
      }
  }
}

/// Items [begin, end) of ggml_causal_attention (see ggml_numerics.h).
template <class P>
void ggml_attention_items(const GgmlAttentionArgs& a, std::int64_t begin, std::int64_t end) {
  constexpr int L = P::kLanes;
  const AttentionShape& sh = a.shape;
  const std::int64_t d = sh.head_dim, group = sh.heads / sh.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t stride = a.kv->row_stride;
  const std::int64_t most = (a.pos0 + a.t_count + L - 1) / L * L;
  std::vector<float> e(static_cast<std::size_t>(most)), acc(static_cast<std::size_t>(4 * L * d));
  for (std::int64_t item = begin; item < end; ++item) {
    // Head-major: a thread's consecutive items are one head's queries, which read the same keys and values.
    const std::int64_t h = item / a.t_count, t = item % a.t_count, kvh = h / group;
    const std::int64_t p = a.pos0 + t;
    const std::int64_t lo = sh.window > 0 ? std::max<std::int64_t>(0, p - sh.window + 1) : 0;
    const std::int64_t c0 = lo / L * L, c1 = (p + L) / L * L;  // chunks [c0, c1) hold keys [lo, p]
    const float* q = a.q + t * sh.heads * d + h * d;
    float max = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = lo; j <= p; ++j) {
      e[static_cast<std::size_t>(j)] = ggml_vec_dot<L>(kv_row(a.kv->keys, stride, d, j, kvh), q, d) * scale;
      max = std::max(max, e[static_cast<std::size_t>(j)]);
    }
    double sum = 0.0;
    float x[L];
    for (std::int64_t c = c0; c < c1; c += L) {
      for (int l = 0; l < L; ++l) {
        const std::int64_t j = c + l;
        x[l] = j >= lo && j <= p ? e[static_cast<std::size_t>(j)] - max : -std::numeric_limits<float>::infinity();
      }
      P::exp(x, e.data() + c);
      sum += static_cast<double>(ggml_hsum<L>(e.data() + c));
    }
    const auto inv = static_cast<float>(1.0 / sum);
    float* o = a.out + t * sh.heads * d + h * d;
    if (a.single_row_pass) {
      ggml_pv_vec_dot<L>(a, e.data(), inv, lo, p, kvh, acc, o);
      continue;
    }
    // Lane j mod L of each output: a chain of fmas from 0 in position order (its first link written, not
    // added to a zeroed row); lanes no key reaches stay 0.
    for (std::int64_t j = lo; j <= p; ++j) {
      const float pj = e[static_cast<std::size_t>(j)] * inv;
      const float* v = kv_row(a.kv->values, stride, d, j, kvh);
      float* lane = acc.data() + (j % L) * d;
      if (j < lo + L) {
        for (std::int64_t i = 0; i < d; ++i) lane[i] = std::fma(v[i], pj, 0.0f);
      } else {
        for (std::int64_t i = 0; i < d; ++i) lane[i] = std::fma(v[i], pj, lane[i]);
      }
    }
    for (std::int64_t j = p + 1; j < lo + L; ++j) std::fill_n(acc.data() + (j % L) * d, d, 0.0f);
    ggml_hsum_rows<L>(acc.data(), d, o);
  }
}

}  // namespace
}  // namespace woq::detail
