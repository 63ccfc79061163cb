// ggml's reference K-quant quantizers (quantize_row_q2_K_ref ... q6_K_ref of
// ggml/src/ggml-quants.c, https://github.com/ggml-org/llama.cpp), which
// llama-quantize runs when it has no importance matrix: per sub-block of 16
// or 32 weights a scale (and a min) fitted by ggml's search, the sub-block
// scales quantized to 4, 6 or 8 bits under fp16 super-block scales, then every
// weight rounded against its decoded sub-block scale.
//
// The float operations are ggml's, one for one and in its order, and this
// file is compiled with -ffp-contract=off (ggml-base is plain x86-64: no
// multiply-add is fused): the searches compare sums that differ in the last
// bit, so any other order picks other scales and writes other bytes.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "formats/kquant.h"
#include "formats/scale.h"

namespace woq::kquant {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: a sub-block below it is all zero

// Four lanes of floats / ints (GCC vector extensions: each operation is the
// scalar IEEE one lane by lane, and SSE2, x86-64's baseline, has them all).
// The searches below run four sub-blocks side by side, each lane performing
// ggml's scalar operations one for one and in its order: the bytes of ggml's
// scalar loops, a few times faster.
typedef float F4 __attribute__((vector_size(16)));
typedef std::int32_t I4 __attribute__((vector_size(16)));
constexpr int kLanes = 4;

// nearest_int lane by lane, clamped to [lo, hi].
I4 nearest_ints(F4 v, int lo, int hi) {
  const I4 l = (reinterpret_cast<I4>(v + kNearestIntShift) & 0x007fffff) - 0x00400000;
  return l < lo ? I4{} + lo : l > hi ? I4{} + hi : l;
}

// Element i of four sub-blocks of N at x, one per lane.
template <int N>
F4 lanes_at(const float* x, int i) {
  return F4{x[i], x[N + i], x[2 * N + i], x[3 * N + i]};
}

// Whether any lane of a comparison's mask is set.
bool any_lane(I4 mask) { return (mask[0] | mask[1] | mask[2] | mask[3]) != 0; }

void store_half(std::uint8_t* p, float v) {
  const std::uint16_t h = codec::encode_scale(v);
  p[0] = static_cast<std::uint8_t>(h & 0xff);
  p[1] = static_cast<std::uint8_t>(h >> 8);
}
float half_at(const std::uint8_t* p) { return fp16_to_fp32(static_cast<std::uint16_t>(p[0] | (p[1] << 8))); }

// The value of largest magnitude (the first of equals), and that magnitude.
void signed_max(int n, const float* x, float& max, float& amax) {
  max = 0.0f;
  amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
}

// The start of make_q3_quants: false, with L zeroed, for a sub-block below GROUP_MAX_EPS; else max = its value of largest magnitude.
bool start_fit(int n, const float* x, std::int8_t* L, float& max) {
  float amax = 0.0f;
  signed_max(n, x, max, amax);
  if (amax >= kGroupMaxEps) return true;
  std::fill(L, L + n, 0);
  return false;
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights (Q6_K) on
// four sub-blocks of 16 at x (sub-block j at [16 j, 16 j + 16)), one per lane:
// L[i] = q + nmax in [0, 2 nmax), the scale minimizing sum x^2 (x - s q)^2
// over 19 trial inverse scales -(nmax + 0.1 is) / max (max: the value of
// largest magnitude, the first of equals; a sub-block below GROUP_MAX_EPS is
// all zero, scale 0). Writes the four scales.
void make_qx_quants(int nmax, const float* x, std::int8_t* L, float* scale_out) {
  constexpr int N = 16;
  F4 xs[N];
  for (int i = 0; i < N; ++i) xs[i] = lanes_at<N>(x, i);
  const F4 zero = F4{} + 0.0f;
  F4 max = zero, amax = zero;
  for (int i = 0; i < N; ++i) {
    const F4 ax = reinterpret_cast<F4>(reinterpret_cast<I4>(xs[i]) & 0x7fffffff);
    const I4 larger = ax > amax;
    amax = larger ? ax : amax;
    max = larger ? xs[i] : max;
  }
  const I4 empty = amax < kGroupMaxEps;
  I4 best_l[N];
  F4 iscale = static_cast<float>(-nmax) / max;
  F4 sumlx = zero, suml2 = zero;
  for (int i = 0; i < N; ++i) {
    best_l[i] = nearest_ints(iscale * xs[i], -nmax, nmax - 1);
    const F4 w = xs[i] * xs[i];
    const F4 fl = __builtin_convertvector(best_l[i], F4);
    sumlx += w * xs[i] * fl;
    suml2 += w * fl * fl;
  }
  F4 scale = suml2 != zero ? sumlx / suml2 : zero;
  F4 best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    I4 l[N];
    sumlx = suml2 = zero;
    for (int i = 0; i < N; ++i) {
      l[i] = nearest_ints(iscale * xs[i], -nmax, nmax - 1);
      const F4 fl = __builtin_convertvector(l[i], F4);
      const F4 w = xs[i] * xs[i];
      sumlx += w * xs[i] * fl;
      suml2 += w * fl * fl;
    }
    const I4 better = (suml2 > zero) & (sumlx * sumlx > best * suml2);
    if (!any_lane(better)) continue;
    for (int i = 0; i < N; ++i) best_l[i] = better ? l[i] : best_l[i];
    scale = better ? sumlx / suml2 : scale;
    best = better ? scale * sumlx : best;
  }
  for (int j = 0; j < kLanes; ++j) {
    scale_out[j] = empty[j] ? 0.0f : scale[j];
    for (int i = 0; i < N; ++i) L[N * j + i] = static_cast<std::int8_t>(empty[j] ? 0 : best_l[i][j] + nmax);
  }
}

// ggml's make_q3_quants with do_rmse (Q3_K): round with -nmax / max, then up
// to 5 passes that move one quant at a time while sum x^2 (x - s q)^2 drops.
// L[i] = q + nmax in [0, 2 nmax).
float make_q3_quants(int n, int nmax, const float* x, std::int8_t* L) {
  float max = 0.0f;
  if (!start_fit(n, x, L, max)) return 0.0f;
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<std::int8_t>(l);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0.0f) {
        float sl2 = suml2 - w * li * li;
        const int new_l = std::max(-nmax, std::min(nmax - 1, nearest_int(x[i] * sl2 / slx)));
        if (new_l != L[i]) {
          const float fl = static_cast<float>(new_l);
          slx += w * x[i] * fl;
          sl2 += w * fl * fl;
          if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<std::int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<std::int8_t>(L[i] + nmax);
  return sumlx / suml2;
}

// ggml's make_qkx2_quants on `Lanes` sub-blocks of N weights at once, each
// lane one sub-block's scalar search: weights x ~ scale * L + min with L in
// [0, nmax], min <= 0; tries nstep + 1 inverse scales (rmin + rdelta is +
// nmax) / (max - min), each followed by a weighted least-squares fit of scale
// and min, and keeps the fit of least weighted error (|diff| when use_mad,
// else diff^2). Every lane performs ggml's float operations one for one and
// in its order (GCC vector extensions: IEEE operations lane by lane, none
// fused), so each gives the bytes ggml's scalar loop gives; only the lanes run
// side by side. x, weights and L hold sub-block j at [N j, N j + N); writes
// each lane's scale and the_min (= -min).

template <int N>
void make_qkx2_quants(int nmax, const float* x, const float* weights, std::uint8_t* L, float* scale_out,
                      float* the_min, float rmin, float rdelta, int nstep, bool use_mad) {
  using F = F4;
  using I = I4;
  constexpr int Lanes = kLanes;
  F xs[N], ws[N];  // element i of every lane
  for (int i = 0; i < N; ++i) {
    xs[i] = lanes_at<N>(x, i);
    ws[i] = lanes_at<N>(weights, i);
  }
  F min = xs[0], max = xs[0];
  F sum_w = ws[0];
  F sum_x = sum_w * xs[0];
  for (int i = 1; i < N; ++i) {
    min = xs[i] < min ? xs[i] : min;
    max = xs[i] > max ? xs[i] : max;
    sum_w += ws[i];
    sum_x += ws[i] * xs[i];
  }
  const F zero = F{} + 0.0f;
  min = min > zero ? zero : min;
  const I flat = max == min;  // ggml returns early for these lanes: L 0, scale 0, the_min -min
  const F flat_min = min;
  const auto quantize = [&](const F& iscale, I* q) {
    for (int i = 0; i < N; ++i) q[i] = nearest_ints(iscale * (xs[i] - min), 0, nmax);
  };
  const auto error = [&](const F& s, const F& m, const I* q, F& e) {
    e = zero;
    for (int i = 0; i < N; ++i) {
      F diff = s * __builtin_convertvector(q[i], F) + m - xs[i];
      diff = use_mad ? reinterpret_cast<F>(reinterpret_cast<I>(diff) & 0x7fffffff) : diff * diff;
      e += ws[i] * diff;
    }
  };
  F iscale = static_cast<float>(nmax) / (max - min);
  F scale = 1.0f / iscale;
  I best[N], aux[N];
  quantize(iscale, best);
  F best_mad, mad;
  error(scale, min, best, best_mad);
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);  // min as refitted
    F sum_l = zero, sum_l2 = zero, sum_xl = zero;
    quantize(iscale, aux);
    for (int i = 0; i < N; ++i) {
      const F fl = __builtin_convertvector(aux[i], F);
      sum_l += ws[i] * fl;
      sum_l2 += ws[i] * fl * fl;
      sum_xl += ws[i] * fl * xs[i];
    }
    const F D = sum_w * sum_l2 - sum_l * sum_l;
    const I fits = D > zero;
    if (!any_lane(fits)) continue;
    F this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    F this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    const I positive = this_min > zero;
    this_min = positive ? zero : this_min;
    this_scale = positive ? sum_xl / sum_l2 : this_scale;
    error(this_scale, this_min, aux, mad);
    const I better = fits & (mad < best_mad);
    for (int i = 0; i < N; ++i) best[i] = better ? aux[i] : best[i];
    best_mad = better ? mad : best_mad;
    scale = better ? this_scale : scale;
    min = better ? this_min : min;
  }
  for (int j = 0; j < Lanes; ++j) {
    scale_out[j] = flat[j] ? 0.0f : scale[j];
    the_min[j] = flat[j] ? -flat_min[j] : -min[j];
    for (int i = 0; i < N; ++i) L[N * j + i] = flat[j] ? 0 : static_cast<std::uint8_t>(best[i][j]);
  }
}

// Four 2-bit quants per byte: element j + l + 32 s of each 128 in bits 2s, 2s+1 of qs[j / 4 + l].
void pack_2bit(const std::uint8_t* L, std::uint8_t* qs) {
  for (int j = 0; j < kSuperBlock; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                                (L[j + l + 96] << 6));
}

// block_q2_K: scales[16] (scale low nibble, min high nibble), qs[64], fp16 d, fp16 dmin.
void quantize_q2_K_block(const float* x, std::uint8_t* y) {
  std::uint8_t L[kSuperBlock];
  float weights[kSuperBlock], mins[16], scales[16];
  constexpr float q4scale = 15.0f;
  for (int i = 0; i < kSuperBlock; ++i) weights[i] = std::fabs(x[i]);
  for (int j = 0; j < 16; j += kLanes)
    make_qkx2_quants<16>(3, x + 16 * j, weights + 16 * j, L + 16 * j, scales + j, mins + j, -0.5f, 0.1f, 15,
                                 true);
  float max_scale = 0.0f, max_min = 0.0f;  // the min is subtracted, so scales are positive
  for (int j = 0; j < 16; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  std::uint8_t* sc = y;
  std::fill(sc, sc + 16, 0);
  store_half(y + 80, 0.0f);
  store_half(y + 82, 0.0f);
  if (max_scale > 0.0f) {
    const float iscale = q4scale / max_scale;
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<std::uint8_t>(nearest_int(iscale * scales[j]));
    store_half(y + 80, max_scale / q4scale);
  }
  if (max_min > 0.0f) {
    const float iscale = q4scale / max_min;
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<std::uint8_t>(sc[j] | (nearest_int(iscale * mins[j]) << 4));
    store_half(y + 82, max_min / q4scale);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = half_at(y + 80) * static_cast<float>(sc[j] & 0x0f);
    if (d == 0.0f) continue;
    const float dm = half_at(y + 82) * static_cast<float>(sc[j] >> 4);
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = static_cast<std::uint8_t>(std::max(0, std::min(3, nearest_int((x[16 * j + ii] + dm) / d))));
  }
  pack_2bit(L, y + 16);
}

// Of the 16 sub-block scales of q3_K / q6_K, the one of largest magnitude (the first of equals) and that magnitude.
float largest_scale(const float* scales, float& max_abs) {
  float max_scale = 0.0f;
  max_abs = 0.0f;
  for (int j = 0; j < 16; ++j)
    if (std::fabs(scales[j]) > max_abs) {
      max_abs = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  return max_scale;
}

// block_q3_K: hmask[32], qs[64], 12 bytes of 6-bit scales, fp16 d.
void quantize_q3_K_block(const float* x, std::uint8_t* y) {
  std::int8_t L[kSuperBlock];
  float scales[16], amax = 0.0f;
  for (int j = 0; j < 16; ++j) scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
  const float max_scale = largest_scale(scales, amax);
  std::uint8_t* hmask = y;
  std::uint8_t* packed = y + 96;
  std::fill(packed, packed + 12, 0);
  if (max_scale != 0.0f) {
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      // ggml keeps nearest_int's result in an int8_t, then clamps it.
      int l = static_cast<std::int8_t>(nearest_int(iscale * scales[j]));
      l = std::max(-32, std::min(31, l)) + 32;
      if (j < 8) {
        packed[j] = static_cast<std::uint8_t>(l & 0x0f);
      } else {
        packed[j - 8] = static_cast<std::uint8_t>(packed[j - 8] | ((l & 0x0f) << 4));
      }
      packed[8 + j % 4] = static_cast<std::uint8_t>(packed[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
    }
    store_half(y + 108, 1.0f / iscale);
  } else {
    store_half(y + 108, 0.0f);
  }
  for (int j = 0; j < 16; ++j) {
    int sc = j < 8 ? packed[j] & 0x0f : packed[j - 8] >> 4;
    sc = (sc | (((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
    const float d = half_at(y + 108) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = static_cast<std::int8_t>(std::max(-4, std::min(3, nearest_int(x[16 * j + ii] / d))) + 4);
  }
  // The high bit of quant j goes to bit j / 32 of hmask[j % 32].
  std::fill(hmask, hmask + 32, 0);
  std::uint8_t low[kSuperBlock];
  for (int j = 0; j < kSuperBlock; ++j) {
    int l = L[j];
    if (l > 3) {
      hmask[j % 32] = static_cast<std::uint8_t>(hmask[j % 32] | (1 << (j / 32)));
      l -= 4;
    }
    low[j] = static_cast<std::uint8_t>(l);
  }
  pack_2bit(low, y + 32);
}

// q4_K / q5_K's scales: per 32 weights, make_qkx2_quants with weights
// av_x + |x| (av_x: the sub-block's RMS); the 8 scales and mins quantized to
// 6 bits (ggml's get_scale_min_k4 layout) under fp16 d and dmin; then the
// quants against the decoded scales, in [0, nmax]. Writes d, dmin, scales[12]
// at y and the quants to L.
void quantize_q45_K_scales(const float* x, int nmax, float rmin, int nstep, std::uint8_t* y, std::uint8_t* L) {
  float weights[kSuperBlock], mins[8], scales[8];
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[32 * j + l] = av_x + std::fabs(x[32 * j + l]);
  }
  for (int j = 0; j < 8; j += kLanes)
    make_qkx2_quants<32>(nmax, x + 32 * j, weights + 32 * j, L + 32 * j, scales + j, mins + j, rmin, 0.1f,
                                 nstep, false);
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  std::uint8_t* packed = y + 4;
  for (int j = 0; j < 8; ++j) {
    // ggml keeps nearest_int's result in a uint8_t, then takes min(63, .).
    const int ls = std::min(63, static_cast<int>(static_cast<std::uint8_t>(nearest_int(inv_scale * scales[j]))));
    const int lm = std::min(63, static_cast<int>(static_cast<std::uint8_t>(nearest_int(inv_min * mins[j]))));
    if (j < 4) {
      packed[j] = static_cast<std::uint8_t>(ls);
      packed[j + 4] = static_cast<std::uint8_t>(lm);
    } else {
      packed[j + 4] = static_cast<std::uint8_t>((ls & 0x0f) | ((lm & 0x0f) << 4));
      packed[j - 4] = static_cast<std::uint8_t>(packed[j - 4] | ((ls >> 4) << 6));
      packed[j] = static_cast<std::uint8_t>(packed[j] | ((lm >> 4) << 6));
    }
  }
  store_half(y, max_scale / 63.0f);
  store_half(y + 2, max_min / 63.0f);
  for (int j = 0; j < 8; ++j) {
    int sc = 0, m = 0;
    ggml::scale_min_k4(j, packed, sc, m);
    const float d = half_at(y) * static_cast<float>(sc);
    if (d == 0.0f) continue;
    const float dm = half_at(y + 2) * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii)
      L[32 * j + ii] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, nearest_int((x[32 * j + ii] + dm) / d))));
  }
}

// block_q4_K: fp16 d, fp16 dmin, scales[12], qs[128] (element 64 i + l low nibble of qs[32 i + l], + 32 high).
void quantize_q4_K_block(const float* x, std::uint8_t* y) {
  std::uint8_t L[kSuperBlock];
  quantize_q45_K_scales(x, 15, -1.0f, 20, y, L);
  std::uint8_t* q = y + 16;
  for (int j = 0; j < kSuperBlock; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = static_cast<std::uint8_t>(L[j + l] | (L[j + l + 32] << 4));
}

// block_q5_K: as q4_K with qh[32] before qs: the 5th bit of element 64 i + l is bit 2 i of qh[l], of 64 i + 32 + l bit 2 i + 1.
void quantize_q5_K_block(const float* x, std::uint8_t* y) {
  std::uint8_t L[kSuperBlock];
  quantize_q45_K_scales(x, 31, -0.5f, 15, y, L);
  std::uint8_t* qh = y + 16;
  std::uint8_t* ql = y + 48;
  std::fill(qh, qh + 32, 0);
  for (int n = 0, i = 0; n < kSuperBlock; n += 64, ++i, ql += 32) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j], l2 = L[n + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        qh[j] = static_cast<std::uint8_t>(qh[j] | (1 << (2 * i)));
      }
      if (l2 > 15) {
        l2 -= 16;
        qh[j] = static_cast<std::uint8_t>(qh[j] | (2 << (2 * i)));
      }
      ql[j] = static_cast<std::uint8_t>(l1 | (l2 << 4));
    }
  }
}

// block_q6_K: ql[128], qh[64], int8 scales[16], fp16 d.
void quantize_q6_K_block(const float* x, std::uint8_t* y) {
  std::int8_t L[kSuperBlock];
  float scales[16], max_abs_scale = 0.0f;
  for (int j = 0; j < 16; j += kLanes) make_qx_quants(32, x + 16 * j, L + 16 * j, scales + j);
  const float max_scale = largest_scale(scales, max_abs_scale);
  if (max_abs_scale < kGroupMaxEps) {
    std::fill(y, y + 210, 0);
    return;
  }
  const float iscale = -128.0f / max_scale;
  store_half(y + 208, 1.0f / iscale);
  std::int8_t* sc = reinterpret_cast<std::int8_t*>(y + 192);
  for (int ib = 0; ib < 16; ++ib) sc[ib] = static_cast<std::int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  for (int j = 0; j < 16; ++j) {
    const float d = half_at(y + 208) * static_cast<float>(sc[j]);
    if (d == 0.0f) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = static_cast<std::int8_t>(std::max(-32, std::min(31, nearest_int(x[16 * j + ii] / d))) + 32);
  }
  std::uint8_t* ql = y;
  std::uint8_t* qh = y + 128;
  for (int j = 0; j < kSuperBlock; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
      ql[l] = static_cast<std::uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
      ql[l + 32] = static_cast<std::uint8_t>((q2 & 0x0f) | ((q4 & 0x0f) << 4));
      qh[l] = static_cast<std::uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
  }
}

using BlockQuantizer = void (*)(const float* x, std::uint8_t* y);

void quantize_rows(BlockQuantizer block, std::int64_t block_bytes, std::string_view name, const float* x,
                   std::int64_t k, std::uint8_t* out) {
  if (k < 0 || k % kSuperBlock != 0) fail("{}: {} elements is not a multiple of the super-block size 256", name, k);
  for (std::int64_t i = 0; i < k; ++i)
    if (!std::isfinite(x[i])) fail("{}: element {} is {}, which cannot be quantized", name, i, x[i]);
  for (std::int64_t b = 0; b < k / kSuperBlock; ++b) block(x + b * kSuperBlock, out + b * block_bytes);
}

}  // namespace

void quantize_q2_K(const float* x, std::int64_t k, std::uint8_t* out) {
  quantize_rows(quantize_q2_K_block, 84, "quantize_q2_K", x, k, out);
}
void quantize_q3_K(const float* x, std::int64_t k, std::uint8_t* out) {
  quantize_rows(quantize_q3_K_block, 110, "quantize_q3_K", x, k, out);
}
void quantize_q4_K(const float* x, std::int64_t k, std::uint8_t* out) {
  quantize_rows(quantize_q4_K_block, 144, "quantize_q4_K", x, k, out);
}
void quantize_q5_K(const float* x, std::int64_t k, std::uint8_t* out) {
  quantize_rows(quantize_q5_K_block, 176, "quantize_q5_K", x, k, out);
}
void quantize_q6_K(const float* x, std::int64_t k, std::uint8_t* out) {
  quantize_rows(quantize_q6_K_block, 210, "quantize_q6_K", x, k, out);
}

}  // namespace woq::kquant
