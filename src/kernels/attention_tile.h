// The tile kernel of causal_attention (attention.h), written once over a
// vector type V and compiled in one file per ISA (attention.cc: scalar,
// attention_avx2.cc, attention_avx512.cc, each with its own flags).
//
// Lanes run over the keys of a tile for the scores and over head_dim for the
// weighted sum of values, so that every output is a chain of fused
// multiply-adds in a fixed order; horizontal reductions are either exact (max)
// or done in scalar code in a fixed tree (the softmax sum, kept per lane
// across tiles). With the same polynomial exp, every ISA gives the bits of the
// scalar reference. All files that include this are compiled with
// -ffp-contract=off: a mul and an add stay two roundings.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/attention.h"

namespace woq::detail {

/// Query tokens per job: each transposed key tile serves tokens x heads of the group.
inline constexpr std::int64_t kAttentionQueryTile = 32;

/// One job of causal_attention: query tokens [t0, t0 + tokens) of the call,
/// heads [h0, h0 + h_count), all of kv head `kvh`.
struct AttentionJob {
  const float* q;  ///< [t_count, q_stride]
  float* out;      ///< [t_count, q_stride]
  std::int64_t q_stride, head_dim;
  std::int64_t t0, tokens, pos0;  ///< row t of q is at position pos0 + t
  std::int64_t h0, h_count, kvh;
  std::int64_t window;
  const KvTiles* kv;
  float* work;  ///< attention_work_floats(head_dim, tokens · h_count) floats
};

/// Floats of AttentionJob::work for a job of `rows` query rows.
inline std::int64_t attention_work_floats(std::int64_t head_dim, std::int64_t rows) {
  return 2 * head_dim * kAttentionKeyTile + rows * (kAttentionKeyTile + 1) + 8 * kAttentionKeyTile;
}

void attention_job_scalar(const AttentionJob& job);
void attention_job_avx2(const AttentionJob& job);
void attention_job_avx512(const AttentionJob& job);

namespace {  // internal linkage: each ISA file has its own copy, compiled with its flags

constexpr std::int64_t kT = kAttentionKeyTile;

/// One float as a vector of one lane: the scalar kernel, and every ISA's tails.
struct Lane1 {
  using R = float;
  static constexpr std::int64_t kLanes = 1;
  static constexpr int kRegs = 16;
  static R load(const float* p) { return *p; }
  static void store(float* p, R v) { *p = v; }
  static R set1(float x) { return x; }
  static R fma(R a, R b, R c) { return std::fma(a, b, c); }
  static R mul(R a, R b) { return a * b; }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R max(R a, R b) { return a > b ? a : b; }  // as maxps: b when equal or unordered
  static float reduce_max(R v) { return v; }
  static R round(R x) { return std::nearbyint(x); }
  /// p · 2^n for an integral n, p in [0.5, 2) and the result normal.
  static R scale_pow2(R p, R n) {
    return std::bit_cast<float>(std::bit_cast<std::int32_t>(p) + static_cast<std::int32_t>(n) * (1 << 23));
  }
};

/// 2^x for x <= 0 (x below -125 gives 2^-125): Cephes' exp2f, x = n + f with
/// |f| <= 1/2, 2^f = 1 + f·P(f) (relative error < 2e-7), 2^n into the exponent.
/// exp2(0) is exactly 1.
template <class V>
typename V::R exp2_nonpositive(typename V::R x) {
  x = V::max(x, V::set1(-125.0f));
  const typename V::R n = V::round(x);
  const typename V::R f = V::sub(x, n);
  typename V::R p = V::set1(1.535336188319500e-4f);
  p = V::fma(p, f, V::set1(1.339887440266574e-3f));
  p = V::fma(p, f, V::set1(9.618437357674640e-3f));
  p = V::fma(p, f, V::set1(5.550332471162809e-2f));
  p = V::fma(p, f, V::set1(2.402264791363012e-1f));
  p = V::fma(p, f, V::set1(6.931472028550421e-1f));
  p = V::fma(p, f, V::set1(1.0f));
  return V::scale_pow2(p, n);
}

/// s[r][j] = (q_r · Kt[:, j]) · scale for Q query rows and the kT keys of a
/// tile; kt: [d][kT] (the tile transposed). One fma chain per (row, key), k in order.
template <class V, int Q>
void tile_scores(const float* const* q, const float* kt, std::int64_t d, float scale, float* s) {
  constexpr std::int64_t kVecs = kT / V::kLanes;
  typename V::R acc[Q][kVecs];
  for (int r = 0; r < Q; ++r)
    for (std::int64_t c = 0; c < kVecs; ++c) acc[r][c] = V::set1(0.0f);
  for (std::int64_t k = 0; k < d; ++k) {
    typename V::R kv[kVecs];
    for (std::int64_t c = 0; c < kVecs; ++c) kv[c] = V::load(kt + k * kT + c * V::kLanes);
    for (int r = 0; r < Q; ++r) {
      const typename V::R qk = V::set1(q[r][k]);
      for (std::int64_t c = 0; c < kVecs; ++c) acc[r][c] = V::fma(qk, kv[c], acc[r][c]);
    }
  }
  const typename V::R vs = V::set1(scale);
  for (int r = 0; r < Q; ++r)
    for (std::int64_t c = 0; c < kVecs; ++c) V::store(s + r * kT + c * V::kLanes, V::mul(acc[r][c], vs));
}

/// Rows per tile_scores call: enough independent fma chains to hide the latency.
template <class V>
constexpr int kScoreRows = static_cast<int>(std::max<std::int64_t>(1, 8 / (kT / V::kLanes)));

template <class V>
void tile_scores_n(int n, const float* const* q, const float* kt, std::int64_t d, float scale, float* s) {
  if constexpr (kScoreRows<V> >= 4) {
    if (n >= 4) return tile_scores<V, 4>(q, kt, d, scale, s);
    if (n == 3) return tile_scores<V, 3>(q, kt, d, scale, s);
  }
  if constexpr (kScoreRows<V> >= 2)
    if (n >= 2) return tile_scores<V, 2>(q, kt, d, scale, s);
  tile_scores<V, 1>(q, kt, d, scale, s);
}

/// o[i] = o[i] · a over n floats.
template <class V>
void scale_in_place(float* o, std::int64_t n, float a) {
  std::int64_t i = 0;
  const typename V::R va = V::set1(a);
  for (; i + V::kLanes <= n; i += V::kLanes) V::store(o + i, V::mul(V::load(o + i), va));
  for (; i < n; ++i) o[i] = o[i] * a;
}

/// o[i] += Σ_j p[j] · v_j[i] for j in [j0, j1), i < N · V::kLanes, one fma chain per i in j order.
template <class V, int N>
void weighted_sum_block(const float* p, std::int64_t j0, std::int64_t j1, const float* v, std::int64_t stride,
                        float* o) {
  typename V::R acc[N];
  for (int c = 0; c < N; ++c) acc[c] = V::load(o + c * V::kLanes);
  for (std::int64_t j = j0; j < j1; ++j) {
    const typename V::R pj = V::set1(p[j]);
    const float* row = v + j * stride;
    for (int c = 0; c < N; ++c) acc[c] = V::fma(pj, V::load(row + c * V::kLanes), acc[c]);
  }
  for (int c = 0; c < N; ++c) V::store(o + c * V::kLanes, acc[c]);
}

/// o[i] += Σ_j p[j] · v_j[i] for j in [j0, j1), i < d: blocks of 8, 4, 2, 1 vectors, then single lanes.
template <class V>
void weighted_sum(const float* p, std::int64_t j0, std::int64_t j1, const float* v, std::int64_t stride, float* o,
                  std::int64_t d) {
  std::int64_t i = 0;
  for (; i + 8 * V::kLanes <= d; i += 8 * V::kLanes) weighted_sum_block<V, 8>(p, j0, j1, v + i, stride, o + i);
  if (i + 4 * V::kLanes <= d) weighted_sum_block<V, 4>(p, j0, j1, v + i, stride, o + i), i += 4 * V::kLanes;
  if (i + 2 * V::kLanes <= d) weighted_sum_block<V, 2>(p, j0, j1, v + i, stride, o + i), i += 2 * V::kLanes;
  if (i + V::kLanes <= d) weighted_sum_block<V, 1>(p, j0, j1, v + i, stride, o + i), i += V::kLanes;
  if constexpr (V::kLanes > 1) weighted_sum<Lane1>(p, j0, j1, v + i, stride, o + i, d - i);
}

/// weighted_sum for two rows with the same keys [j0, j1): each value vector loaded once for both
/// (the same fma chains as weighted_sum of each row).
template <class V, int N>
void weighted_sum2_block(const float* p0, const float* p1, std::int64_t j0, std::int64_t j1, const float* v,
                         std::int64_t stride, float* o0, float* o1) {
  typename V::R acc0[N], acc1[N];
  for (int c = 0; c < N; ++c) acc0[c] = V::load(o0 + c * V::kLanes), acc1[c] = V::load(o1 + c * V::kLanes);
  for (std::int64_t j = j0; j < j1; ++j) {
    const typename V::R pj0 = V::set1(p0[j]), pj1 = V::set1(p1[j]);
    const float* row = v + j * stride;
    for (int c = 0; c < N; ++c) {
      const typename V::R x = V::load(row + c * V::kLanes);
      acc0[c] = V::fma(pj0, x, acc0[c]);
      acc1[c] = V::fma(pj1, x, acc1[c]);
    }
  }
  for (int c = 0; c < N; ++c) V::store(o0 + c * V::kLanes, acc0[c]), V::store(o1 + c * V::kLanes, acc1[c]);
}

template <class V>
void weighted_sum2(const float* p0, const float* p1, std::int64_t j0, std::int64_t j1, const float* v,
                   std::int64_t stride, float* o0, float* o1, std::int64_t d) {
  constexpr int kN = V::kRegs >= 32 ? 8 : 4;  // accumulators of both rows, the loaded vector and the weights in registers
  constexpr std::int64_t kW = kN * V::kLanes;
  std::int64_t i = 0;
  for (; i + kW <= d; i += kW) weighted_sum2_block<V, kN>(p0, p1, j0, j1, v + i, stride, o0 + i, o1 + i);
  if (i < d) {
    weighted_sum<V>(p0, j0, j1, v + i, stride, o0 + i, d - i);
    weighted_sum<V>(p1, j0, j1, v + i, stride, o1 + i, d - i);
  }
}

/// The softmax of one key tile for one query row: s[kT] its scores, [j0, j1)
/// the keys it attends to. The row's state across tiles: m the running
/// maximum of its scores (log2 units), l[kT] the running sum of 2^(s - m) per
/// lane, o[d] the output accumulator (its row of out). Rescales o and l when
/// the maximum grows and leaves in s the weights p = 2^(s - m) of the keys (0
/// outside [j0, j1)), added to l.
template <class V>
void online_softmax_step(float* s, std::int64_t j0, std::int64_t j1, float& m, float* l, float* o, std::int64_t d) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const bool partial = j0 > 0 || j1 < kT;
  if (partial) {
    for (std::int64_t j = 0; j < j0; ++j) s[j] = kNegInf;
    for (std::int64_t j = j1; j < kT; ++j) s[j] = kNegInf;
  }
  typename V::R vmax = V::load(s);
  for (std::int64_t c = V::kLanes; c < kT; c += V::kLanes) vmax = V::max(vmax, V::load(s + c));
  const float tile_max = V::reduce_max(vmax);
  if (tile_max > m) {
    if (m != kNegInf) {  // the first tile finds o and l zero
      const float alpha = exp2_nonpositive<Lane1>(m - tile_max);
      scale_in_place<V>(o, d, alpha);
      scale_in_place<V>(l, kT, alpha);
    }
    m = tile_max;
  }
  const typename V::R vm = V::set1(m);
  for (std::int64_t c = 0; c < kT; c += V::kLanes) {
    const typename V::R p = exp2_nonpositive<V>(V::sub(V::load(s + c), vm));
    V::store(s + c, p);
  }
  if (partial) {
    for (std::int64_t j = 0; j < j0; ++j) s[j] = 0.0f;
    for (std::int64_t j = j1; j < kT; ++j) s[j] = 0.0f;
  }
  for (std::int64_t c = 0; c < kT; c += V::kLanes) V::store(l + c, V::add(V::load(l + c), V::load(s + c)));
}

/// o /= Σ l, the sum of the kT lanes by halving (the same tree on every ISA).
inline void finish_row(float* l, float* o, std::int64_t d) {
  for (std::int64_t w = kT / 2; w >= 1; w /= 2)
    for (std::int64_t i = 0; i < w; ++i) l[i] = l[i] + l[i + w];
  const float inv = 1.0f / l[0];
  for (std::int64_t i = 0; i < d; ++i) o[i] = o[i] * inv;
}

/// kt[k][j] = key j of the tile, dims [0, d), for j < n; 0 for j in [n, kT).
/// Each ISA file specializes it.
template <class V>
void transpose_keys(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt);

/// One job (AttentionJob) with the kernels of V.
template <class V>
void run_attention_job(const AttentionJob& job) {
  const std::int64_t d = job.head_dim;
  const std::int64_t rows = job.tokens * job.h_count;  // row r: token r / h_count, head h0 + r % h_count
  float* kt = job.work;                                // [d][kT] the key tile transposed
  float* vt = kt + d * kT;                             // [kT][d] the value tile, contiguous
  float* m = vt + d * kT;                              // [rows]
  float* l = m + rows;                                 // [rows][kT]
  float* s = l + rows * kT;                            // [8][kT]
  constexpr float kLog2e = 1.44269504088896340736f;
  const float scale = kLog2e / std::sqrt(static_cast<float>(d));
  std::int64_t first[kAttentionQueryTile], last[kAttentionQueryTile];  // each token's positions [first, last)
  std::int64_t lo = job.pos0 + job.t0, hi = 0;
  for (std::int64_t i = 0; i < job.tokens; ++i) {
    last[i] = job.pos0 + job.t0 + i + 1;
    first[i] = job.window > 0 ? std::max<std::int64_t>(0, last[i] - job.window) : 0;
    lo = std::min(lo, first[i]);
    hi = std::max(hi, last[i]);
  }
  auto offset = [&](std::int64_t r) { return (job.t0 + r / job.h_count) * job.q_stride + (job.h0 + r % job.h_count) * d; };
  auto q_row = [&](std::int64_t r) { return job.q + offset(r); };
  auto o_row = [&](std::int64_t r) { return job.out + offset(r); };
  for (std::int64_t r = 0; r < rows; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    std::fill(l + r * kT, l + (r + 1) * kT, 0.0f);
    std::fill(o_row(r), o_row(r) + d, 0.0f);
  }
  const std::int64_t kv_off = job.kvh * d;
  for (std::int64_t b = lo / kT; b * kT < hi; ++b) {
    const std::int64_t base = b * kT;
    transpose_keys<V>(job.kv->keys[static_cast<std::size_t>(b)] + kv_off, job.kv->row_stride,
                      std::min(kT, hi - base), d, kt);
    // Rows of a tile are kv_dim floats apart (often a multiple of 4 KiB, all
    // in the same L1 sets): the values are copied together once for all rows.
    const float* v = job.kv->values[static_cast<std::size_t>(b)] + kv_off;
    for (std::int64_t j = 0; j < std::min(kT, hi - base); ++j) std::copy_n(v + j * job.kv->row_stride, d, vt + j * d);
    // Tokens whose positions meet this tile are consecutive: [i0, i1).
    std::int64_t i0 = 0, i1 = job.tokens;
    while (i0 < i1 && last[i0] <= base) ++i0;
    while (i1 > i0 && first[i1 - 1] >= base + kT) --i1;
    for (std::int64_t r0 = i0 * job.h_count; r0 < i1 * job.h_count; r0 += kScoreRows<V>) {
      const int n = static_cast<int>(std::min<std::int64_t>(kScoreRows<V>, i1 * job.h_count - r0));
      const float* qs[8];
      for (int r = 0; r < n; ++r) qs[r] = q_row(r0 + r);
      tile_scores_n<V>(n, qs, kt, d, scale, s);
      std::int64_t j0[8], j1[8];
      for (int r = 0; r < n; ++r) {
        const std::int64_t i = (r0 + r) / job.h_count;
        j0[r] = std::max(first[i], base) - base;
        j1[r] = std::min(last[i], base + kT) - base;
        online_softmax_step<V>(s + r * kT, j0[r], j1[r], m[r0 + r], l + (r0 + r) * kT, o_row(r0 + r), d);
      }
      for (int r = 0; r < n; ++r) {
        if (r + 1 < n && j0[r] == j0[r + 1] && j1[r] == j1[r + 1]) {
          weighted_sum2<V>(s + r * kT, s + (r + 1) * kT, j0[r], j1[r], vt, d, o_row(r0 + r), o_row(r0 + r + 1), d);
          ++r;
        } else {
          weighted_sum<V>(s + r * kT, j0[r], j1[r], vt, d, o_row(r0 + r), d);
        }
      }
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) finish_row(l + r * kT, o_row(r), d);
}

}  // namespace
}  // namespace woq::detail
