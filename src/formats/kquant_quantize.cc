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
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "formats/kquant.h"
#include "formats/scale.h"

namespace woq::kquant {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: a sub-block below it is all zero

// ggml's nearest_int: adding 1.5 * 2^23 rounds half to even and leaves the
// integer in the low mantissa bits. ggml asserts |v| <= 4194303 in debug
// builds only; beyond that this gives what its release build gives.
int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<std::uint32_t>(shifted) & 0x007fffff) - 0x00400000;
}


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

// The common start of make_qx_quants and make_q3_quants: false, with L
// zeroed, for a sub-block below GROUP_MAX_EPS; else max = its value of largest magnitude.
bool start_fit(int n, const float* x, std::int8_t* L, float& max) {
  float amax = 0.0f;
  signed_max(n, x, max, amax);
  if (amax >= kGroupMaxEps) return true;
  std::fill(L, L + n, 0);
  return false;
}

// ggml's make_qx_quants with rmse_type 1 and no importance weights (Q6_K):
// L[i] = q + nmax in [0, 2 nmax), the scale minimizing sum x^2 (x - s q)^2 over
// 19 trial inverse scales -(nmax + 0.1 is) / max.
float make_qx_quants(int n, int nmax, const float* x, std::int8_t* L) {
  float max = 0.0f;
  if (!start_fit(n, x, L, max)) return 0.0f;
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.0f, suml2 = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float fl = static_cast<float>(std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        L[i] = static_cast<std::int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
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

// ggml's make_qkx2_quants: weights x ~ scale * L + min with L in [0, nmax],
// min <= 0; tries nstep + 1 inverse scales (rmin + rdelta is + nmax) / (max -
// min), each followed by a weighted least-squares fit of scale and min, and
// keeps the fit of least weighted error (|diff| when use_mad, else diff^2).
// Returns the scale; the_min = -min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, std::uint8_t* L, float& the_min,
                       std::uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0.0f) min = 0.0f;
  if (max == min) {
    std::fill(L, L + n, 0);
    the_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1.0f / iscale;
  auto error = [&](float s, float m, const std::uint8_t* q) {
    float e = 0.0f;
    for (int i = 0; i < n; ++i) {
      float diff = s * static_cast<float>(q[i]) + m - x[i];
      diff = use_mad ? std::fabs(diff) : diff * diff;
      e += weights[i] * diff;
    }
    return e;
  };
  for (int i = 0; i < n; ++i)
    L[i] = static_cast<std::uint8_t>(std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min)))));
  float best_mad = error(scale, min, L);
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = static_cast<std::uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0.0f) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0.0f) {
        this_min = 0.0f;
        this_scale = sum_xl / sum_l2;
      }
      const float mad = error(this_scale, this_min, Laux);
      if (mad < best_mad) {
        std::copy(Laux, Laux + n, L);
        best_mad = mad;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  the_min = -min;
  return scale;
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
  std::uint8_t L[kSuperBlock], Laux[16];
  float weights[16], mins[16], scales[16];
  constexpr float q4scale = 15.0f;
  float max_scale = 0.0f, max_min = 0.0f;  // the min is subtracted, so scales are positive
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, mins[j], Laux, -0.5f, 0.1f, 15, true);
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

// The signed scales of the 16 sub-blocks of 16 (q3_K / q6_K) fitted by `make`
// with `nmax`, and the one of largest magnitude (the first of equals) and that magnitude.
float fit_sub_blocks(float (*make)(int, int, const float*, std::int8_t*), int nmax, const float* x, std::int8_t* L,
                     float* scales, float& max_abs) {
  float max_scale = 0.0f;
  max_abs = 0.0f;
  for (int j = 0; j < 16; ++j) {
    scales[j] = make(16, nmax, x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > max_abs) {
      max_abs = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  return max_scale;
}

// block_q3_K: hmask[32], qs[64], 12 bytes of 6-bit scales, fp16 d.
void quantize_q3_K_block(const float* x, std::uint8_t* y) {
  std::int8_t L[kSuperBlock];
  float scales[16], amax = 0.0f;
  const float max_scale = fit_sub_blocks(make_q3_quants, 4, x, L, scales, amax);
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
  std::uint8_t Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, mins[j], Laux, rmin, 0.1f, nstep, false);
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
  const float max_scale = fit_sub_blocks(make_qx_quants, 32, x, L, scales, max_abs_scale);
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
