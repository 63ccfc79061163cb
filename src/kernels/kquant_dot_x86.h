// The x86 kernels of the block formats kept as stored (kernels/kquant_dot.h:
// the K-quants, then q4_1 / q5_1 near the end), compiled once per ISA:
// kquant_dot_avx2.cc (AVX2 + FMA + F16C) and kquant_dot_avx512.cc (the same
// code with AVX-512 VL + VNNI: 32 vector registers and vpdpwssd; q3_K and q6_K
// take two runs of 32 per 512-bit register there, ~10 % faster, while q4_K /
// q5_K / q2_K measured no faster or slower that way). Per 32 weights: u8 × s8 pair products (vpmaddubsw), then scale × pair sum into
// eight int32 lanes, each covering 4 consecutive weights of every 32: the
// reference's lanes, so the float steps (fma per lane, then the float8 sum)
// see the same integers and give the same bits. Internal to the kernels.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats/kquant.h"
#include "kernels/kquant_dot.h"

namespace woq::detail::KQUANT_ISA {
namespace {  // internal to the one file that includes this header (so that every helper is inlined)


using kquant::kQ8KBytes;
using kquant::kSuperBlock;

float half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);  // F16C: fp16_to_fp32's value for every finite (and infinite) fp16
}

float q8_d(const std::uint8_t* a) {
  float d;
  std::memcpy(&d, a, 4);
  return d;
}

// Software prefetch of the weight stream kAhead bytes ahead, called once per block with its size:
// the hardware prefetcher alone kept one thread's decode at ~60 % of its bandwidth (8-layer
// llama-2-7b preset's Q4_K_M, Emerald Rapids: 6.5 -> 10.6 t/s with it; 1 KB ahead gave 8.8, 8 KB
// no more than 4 KB). Prefetching past the end of the weights is harmless (prefetches do not fault).
constexpr std::int64_t kAhead = 4096;

inline void prefetch_ahead(const std::uint8_t* w, std::int64_t bytes) {
  for (std::int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(w + kAhead + o), _MM_HINT_T0);
}

__m256i load(const std::uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

float hsum8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// Sixteen int8 scales (one per 16 weights) -> the int16 scales of 32-weight run r: lanes 0..7 (the
// run's first 16 weights) scale 2r, lanes 8..15 scale 2r + 1.
__m256i run_scales(__m128i scales, int r) {
  const char lo = static_cast<char>(2 * r), hi = static_cast<char>(2 * r + 1);
  return _mm256_cvtepi8_epi16(
      _mm_shuffle_epi8(scales, _mm_setr_epi8(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi)));
}

// sum + scale · p16 pairwise into eight int32 lanes: vpdpwssd where AVX512_VNNI is compiled in
// (exact: it adds without saturating), else vpmaddwd then vpaddd.
inline __m256i add_scaled16(__m256i sum, __m256i scale, __m256i p16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(sum, scale, p16);
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(scale, p16));
#endif
}

// Σ scale · (q · a) in eight int32 lanes, for u8 quants q and s8 activations a (32 each).
inline __m256i scaled(__m256i q, __m256i a, __m256i scale) {
  return _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q, a));
}

// sum + the products of run pair (2 i, 2 i + 1): `part` holds run 2 i's products (kept from the even
// run) and p16 run 2 i + 1's pair sums. Runs are added in pairs so that the dependency chain through
// sum is half as long (the integer sums are exact in any order).
inline __m256i add_run(__m256i& part, __m256i sum, int run, __m256i scale, __m256i p16) {
  if (run % 2 == 0) {
    part = _mm256_madd_epi16(scale, p16);
    return sum;
  }
  return _mm256_add_epi32(sum, add_scaled16(part, scale, p16));
}

// The 6-bit (scale, min) pairs of q4_K / q5_K (12 bytes; ggml's get_scale_min_k4) as 16 int16: the
// eight scales, then the eight mins. Bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of
// scales 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low nibbles of scales 4-7 (low) and
// mins 4-7 (high).
__m256i scales_k4(const std::uint8_t* packed) {
  std::uint32_t u[3];
  std::memcpy(u, packed, 12);
  const std::uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
  const std::uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
  const std::uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
  return _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(m_hi), static_cast<int>(m_lo), static_cast<int>(sc_hi),
                                            static_cast<int>(sc_lo)));
}

// Lane i of eight int16 (in both 128-bit halves) broadcast to all sixteen.
__m256i broadcast16(__m256i v, int i) {
  const char lo = static_cast<char>(2 * i), hi = static_cast<char>(2 * i + 1);
  return _mm256_shuffle_epi8(v, _mm256_setr_epi8(lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi,
                                                 lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi));
}

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
// 512-bit variants (q3_K, q6_K): two 32-weight runs per register, lower and upper half.
#define KQUANT_ZMM 1
constexpr __mmask32 kUpperWords = 0xffff0000u;  // the upper half's 16 int16 lanes

// Bytes: lo in the lower 32, hi in the upper 32.
__m512i halves8(int lo, int hi) {
  return _mm512_mask_blend_epi8(0xffffffff00000000ull, _mm512_set1_epi8(static_cast<char>(lo)),
                                _mm512_set1_epi8(static_cast<char>(hi)));
}

// int16 lanes: lo in the lower 16, hi in the upper 16.
__m512i halves16(int lo, int hi) {
  return _mm512_mask_blend_epi16(kUpperWords, _mm512_set1_epi16(static_cast<short>(lo)),
                                 _mm512_set1_epi16(static_cast<short>(hi)));
}

// For the formats with a scale per 16 weights: runs r and r + 1 (64 weights) take scales 2r .. 2r + 3
// of the sixteen int16 in `scales`, eight lanes each (the lower half as run_scales(r), the upper as
// run_scales(r + 1)).
__m512i pair_scales(__m512i scales, int r) {
  const __m512i quarter = _mm512_set_epi32(0x30003, 0x30003, 0x30003, 0x30003, 0x20002, 0x20002, 0x20002, 0x20002,
                                           0x10001, 0x10001, 0x10001, 0x10001, 0, 0, 0, 0);
  return _mm512_permutexvar_epi16(_mm512_add_epi16(quarter, _mm512_set1_epi16(static_cast<short>(2 * r))), scales);
}

// The bits of x >> lo in the lower half, x >> hi in the upper half (16-bit shifts, as the 256-bit code's).
__m512i shift_halves(__m512i x, int lo, int hi) { return _mm512_srlv_epi16(x, halves16(lo, hi)); }

// The two halves' int32 lanes added: lane l then covers weights 4l..4l+3 of both runs, as the
// 256-bit code's lanes do.
__m256i fold(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }
#else
#define KQUANT_ZMM 0
#endif

// Each kernel takes N tokens at once (activations a + j · stride): the weights are unpacked once per
// 32 and met by every token's activations, with each token's own accumulators (so its bits do not
// depend on N).

template <int N>
void dot_q2_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, std::int64_t blocks, float* out) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, w += 84, a += kQ8KBytes) {
    prefetch_ahead(w, 84);
    const float wd = half_at(w + 80), wdmin = half_at(w + 82);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0f)));
    const __m128i scales = _mm_and_si128(packed, _mm_set1_epi8(0x0f));
    __m256i sumi[N], part[N];
    for (int j = 0; j < N; ++j) {
      const std::uint8_t* aj = a + j * stride;
      const __m256i prod = _mm256_madd_epi16(mins, load(aj + 4 + kSuperBlock));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(-q8_d(aj) * wdmin), _mm256_cvtepi32_ps(prod), acc[j]);
      sumi[j] = _mm256_setzero_si256();
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load(w + 16 + 32 * h);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const int r = 4 * h + k;
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        const __m256i scale = run_scales(scales, r);
        for (int j = 0; j < N; ++j)
          sumi[j] = add_run(part[j], sumi[j], r, scale, _mm256_maddubs_epi16(q, load(a + j * stride + 4 + 32 * r)));
      }
    }
    for (int j = 0; j < N; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(q8_d(a + j * stride) * wd), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
  }
  for (int j = 0; j < N; ++j) out[j] = hsum8(acc[j]);
}

template <int N>
void dot_q3_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, std::int64_t blocks, float* out) {
  [[maybe_unused]] const __m256i m3 = _mm256_set1_epi8(3);
  [[maybe_unused]] const __m256i four = _mm256_set1_epi8(4);
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, w += 110, a += kQ8KBytes) {
    prefetch_ahead(w, 110);
    const float wd = half_at(w + 108);
    // The 16 six-bit scales minus 32: low nibbles from bytes 0-7 (scales 0-7 low, 8-15 high nibble),
    // top two bits from bytes 8-11 (scale s: bits 2 (s / 4) of byte 8 + s % 4).
    std::uint32_t u[3];
    std::memcpy(u, w + 96, 12);
    const __m128i scales = _mm_sub_epi8(
        _mm_setr_epi32(static_cast<int>((u[0] & 0x0f0f0f0fu) | ((u[2] & 0x03030303u) << 4)),
                       static_cast<int>((u[1] & 0x0f0f0f0fu) | (((u[2] >> 2) & 0x03030303u) << 4)),
                       static_cast<int>(((u[0] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 4) & 0x03030303u) << 4)),
                       static_cast<int>(((u[1] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 6) & 0x03030303u) << 4))),
        _mm_set1_epi8(32));
    __m256i sumi[N];
    [[maybe_unused]] __m256i part[N];
    for (int j = 0; j < N; ++j) sumi[j] = _mm256_setzero_si256();
#if KQUANT_ZMM
    const __m512i hmask = _mm512_broadcast_i64x4(load(w));
    const __m512i scales512 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scales));
    __m512i sum512[N];
    for (int j = 0; j < N; ++j) sum512[j] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i bits = _mm512_broadcast_i64x4(load(w + 32 + 32 * h));
#pragma GCC unroll 2
      for (int k = 0; k < 4; k += 2) {  // runs r and r + 1
        const int r = 4 * h + k;
        const __m512i minus = _mm512_maskz_mov_epi8(_mm512_testn_epi8_mask(hmask, halves8(1 << r, 1 << (r + 1))),
                                                    _mm512_set1_epi8(4));
        const __m512i low = _mm512_and_si512(shift_halves(bits, 2 * k, 2 * k + 2), _mm512_set1_epi8(3));
        const __m512i scale = pair_scales(scales512, r);
        for (int j = 0; j < N; ++j) {
          const __m512i a8 = _mm512_loadu_si512(a + j * stride + 4 + 32 * r);
          const __m512i p16 = _mm512_sub_epi16(_mm512_maddubs_epi16(low, a8), _mm512_maddubs_epi16(minus, a8));
          sum512[j] = _mm512_dpwssd_epi32(sum512[j], scale, p16);
        }
      }
    }
    for (int j = 0; j < N; ++j) sumi[j] = fold(sum512[j]);
#else
    const __m256i hmask = load(w);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load(w + 32 + 32 * h);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const int r = 4 * h + k;
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << r));
        // 4 where the high bit is clear: q = low - 4 · (bit clear).
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        const __m256i minus = _mm256_maskz_mov_epi8(_mm256_testn_epi8_mask(hmask, bit), four);
#else
        const __m256i minus = _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four);
#endif
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        const __m256i scale = run_scales(scales, r);
        for (int j = 0; j < N; ++j) {
          const __m256i a8 = load(a + j * stride + 4 + 32 * r);
          const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(low, a8), _mm256_maddubs_epi16(minus, a8));
          sumi[j] = add_run(part[j], sumi[j], r, scale, p16);
        }
      }
    }
#endif
    for (int j = 0; j < N; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(q8_d(a + j * stride) * wd), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
  }
  for (int j = 0; j < N; ++j) out[j] = hsum8(acc[j]);
}

template <bool kFive, int N>
void dot_q45_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, std::int64_t blocks, float* out) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i sixteen = _mm256_set1_epi8(16);
  const std::int64_t bytes = kFive ? 176 : 144;
  __m256 acc[N];
  __m128 acc_m[N];
  float summs[N];
  for (int j = 0; j < N; ++j) {
    acc[j] = _mm256_setzero_ps();
    acc_m[j] = _mm_setzero_ps();
    summs[j] = 0.0f;
  }
  for (std::int64_t b = 0; b < blocks; ++b, w += bytes, a += kQ8KBytes) {
    prefetch_ahead(w, bytes);
    const float wd = half_at(w), wdmin = half_at(w + 2);
    const __m256i scales_mins = scales_k4(w + 4);
    const __m128i mins = _mm256_extracti128_si256(scales_mins, 1);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(scales_mins));
    __m256i sumi[N];
    for (int j = 0; j < N; ++j) {
      const std::uint8_t* aj = a + j * stride;
      const float dmin = -q8_d(aj) * wdmin;
      const __m256i bsums = load(aj + 4 + kSuperBlock);
      const __m128i sums32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
      const __m128i prod = _mm_madd_epi16(mins, sums32);
      if constexpr (kFive) {
        const __m128i pairs = _mm_hadd_epi32(prod, prod);
        const int total = _mm_cvtsi128_si32(_mm_hadd_epi32(pairs, pairs));
        summs[j] = std::fma(dmin, static_cast<float>(total), summs[j]);
      } else {
        acc_m[j] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[j]);
      }
      sumi[j] = _mm256_setzero_si256();
    }
    const std::uint8_t* qs = w + (kFive ? 48 : 16);
    const __m256i qh = kFive ? load(w + 16) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i, qs += 32) {
      const __m256i bits = load(qs);
      __m256i lo = _mm256_and_si256(bits, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
      if constexpr (kFive) {
        const __m256i bit_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * i)));
        const __m256i bit_hi = _mm256_set1_epi8(static_cast<char>(1 << (2 * i + 1)));
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(qh, bit_lo), lo, sixteen);
        hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(qh, bit_hi), hi, sixteen);
#else
        lo = _mm256_add_epi8(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), sixteen));
        hi = _mm256_add_epi8(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), sixteen));
#endif
      }
      const __m256i scale_lo = broadcast16(scales, 2 * i);
      const __m256i scale_hi = broadcast16(scales, 2 * i + 1);
      for (int j = 0; j < N; ++j) {
        const std::uint8_t* q8 = a + j * stride + 4 + 64 * i;
        sumi[j] = _mm256_add_epi32(
            sumi[j], add_scaled16(scaled(lo, load(q8), scale_lo), scale_hi, _mm256_maddubs_epi16(hi, load(q8 + 32))));
      }
    }
    for (int j = 0; j < N; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(q8_d(a + j * stride) * wd), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
  }
  for (int j = 0; j < N; ++j) {
    if constexpr (kFive) {
      out[j] = hsum8(acc[j]) + summs[j];
    } else {
      __m128 m = _mm_add_ps(acc_m[j], _mm_movehl_ps(acc_m[j], acc_m[j]));
      m = _mm_add_ss(m, _mm_movehdup_ps(m));
      out[j] = hsum8(acc[j]) + _mm_cvtss_f32(m);
    }
  }
}

template <int N>
void dot_q6_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, std::int64_t blocks, float* out) {
  [[maybe_unused]] const __m256i m4 = _mm256_set1_epi8(0x0f);
  [[maybe_unused]] const __m256i m2 = _mm256_set1_epi8(3);
  [[maybe_unused]] const __m256i m32 = _mm256_set1_epi8(32);
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, w += 210, a += kQ8KBytes) {
    prefetch_ahead(w, 210);
    const float wd = half_at(w + 208);
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
    __m256i sumi[N];
    [[maybe_unused]] __m256i part[N];
    for (int j = 0; j < N; ++j) sumi[j] = _mm256_setzero_si256();
#if KQUANT_ZMM
    const __m512i scales512 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scales));
    __m512i sum512[N];
    for (int j = 0; j < N; ++j) sum512[j] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(w + 64 * h);  // runs 4h, 4h + 1's low nibbles; 4h + 2, 4h + 3's high
      const __m512i qh = _mm512_broadcast_i64x4(load(w + 128 + 32 * h));
#pragma GCC unroll 2
      for (int k = 0; k < 4; k += 2) {  // runs r and r + 1
        const int r = 4 * h + k;
        const __m512i low = _mm512_and_si512(k == 0 ? ql : _mm512_srli_epi16(ql, 4), _mm512_set1_epi8(0x0f));
        const __m512i high =
            _mm512_slli_epi16(_mm512_and_si512(shift_halves(qh, 2 * k, 2 * k + 2), _mm512_set1_epi8(3)), 4);
        const __m512i q = _mm512_or_si512(low, high);
        const __m512i scale = pair_scales(scales512, r);
        for (int j = 0; j < N; ++j) {
          const __m512i a8 = _mm512_loadu_si512(a + j * stride + 4 + 32 * r);
          const __m512i p16 =
              _mm512_sub_epi16(_mm512_maddubs_epi16(q, a8), _mm512_maddubs_epi16(_mm512_set1_epi8(32), a8));
          sum512[j] = _mm512_dpwssd_epi32(sum512[j], scale, p16);
        }
      }
    }
    for (int j = 0; j < N; ++j) sumi[j] = fold(sum512[j]);
#else
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i ql1 = load(w + 64 * h);
      const __m256i ql2 = load(w + 64 * h + 32);
      const __m256i qh = load(w + 128 + 32 * h);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(r % 2 == 0 ? ql1 : ql2, 4 * (r / 2)), m4);
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), m2), 4);
        const __m256i q = _mm256_or_si256(low, high);
        const __m256i scale = run_scales(scales, 4 * h + r);
        for (int j = 0; j < N; ++j) {
          const __m256i a8 = load(a + j * stride + 4 + 128 * h + 32 * r);
          const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a8), _mm256_maddubs_epi16(m32, a8));
          sumi[j] = add_run(part[j], sumi[j], r, scale, p16);
        }
      }
    }
#endif
    for (int j = 0; j < N; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(q8_d(a + j * stride) * wd), _mm256_cvtepi32_ps(sumi[j]), acc[j]);
  }
  for (int j = 0; j < N; ++j) out[j] = hsum8(acc[j]);
}

// q4_1 / q5_1 blocks of 32 against Q8_1 activations (36 bytes: fp16 d, fp16 s, int8 qs[32]): the
// quants as 32 bytes (element p < 16 the low nibble of qs[p], p >= 16 the high nibble of qs[p - 16],
// q5_1's bit p of qh on top as 16), u8 x s8 products summed in fours into eight int32 lanes
// (vpdpbusd where AVX512_VNNI is compiled in, else vpmaddubsw + vpmaddwd: exact either way, as the
// pairs stay below 2^15), one fma per lane with d_w · d_a; the min's m · s summed in lane 1 of a
// second accumulator. Both pairs, (d_w, m) and (d_a, s), are converted at once and multiplied as one
// vector: the products of two fp16 values are exact in fp32, so this is the reference's fma(m, s, ·).
// The work per block avoids port 5 (vbroadcasti128 from memory and a blend for the nibbles, one
// fp16 conversion per pair), which bounds this loop.
inline __m128 half_pair(const std::uint8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

template <bool kFive, int N>
void dot_q8_1(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, std::int64_t blocks, float* out) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  // q5_1 on AVX2: byte i of the 32 is byte i / 8 of qh (shuffle), tested against bit i % 8.
  [[maybe_unused]] const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
  [[maybe_unused]] const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i sixteen = _mm256_set1_epi8(16);
  __m256 acc[N];
  __m128 acc_m[N];
  for (int j = 0; j < N; ++j) {
    acc[j] = _mm256_setzero_ps();
    acc_m[j] = _mm_setzero_ps();
  }
  for (std::int64_t b = 0; b < blocks; ++b, w += kFive ? 24 : 20, a += kquant::kQ8_1Bytes) {
    prefetch_ahead(w, 1);  // one line per block of 20 / 24 bytes: every line of the stream
    const __m128 dm = half_pair(w);
    const __m256i packed = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (kFive ? 8 : 4))));
    __m256i q = _mm256_and_si256(_mm256_blend_epi32(packed, _mm256_srli_epi16(packed, 4), 0xf0), m4);
    if constexpr (kFive) {
      std::uint32_t qh;
      std::memcpy(&qh, w + 4, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
      q = _mm256_mask_add_epi8(q, _cvtu32_mask32(qh), q, sixteen);  // bit p of qh as the mask of byte p
#else
      const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), spread);
      q = _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), sixteen));
#endif
    }
    for (int j = 0; j < N; ++j) {
      const std::uint8_t* aj = a + j * stride;
      const __m128 scales = _mm_mul_ps(dm, half_pair(aj));  // (d_w d_a, m s)
      acc_m[j] = _mm_add_ps(acc_m[j], scales);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
      const __m256i sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, load(aj + 4));
#else
      const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load(aj + 4)), _mm256_set1_epi16(1));
#endif
      acc[j] = _mm256_fmadd_ps(_mm256_broadcastss_ps(scales), _mm256_cvtepi32_ps(sum), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) out[j] = hsum8(acc[j]) + _mm_cvtss_f32(_mm_movehdup_ps(acc_m[j]));
}

// One kernel for any token count up to kKQuantTokens.
template <template <int> class K>
void by_tokens(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, int tokens, std::int64_t blocks,
               float* out) {
  switch (tokens) {
    case 1: return K<1>::run(w, a, stride, blocks, out);
    case 2: return K<2>::run(w, a, stride, blocks, out);
    case 3: return K<3>::run(w, a, stride, blocks, out);
    default: return K<4>::run(w, a, stride, blocks, out);
  }
}

template <int N> struct Q2 { static constexpr auto run = dot_q2_K<N>; };
template <int N> struct Q3 { static constexpr auto run = dot_q3_K<N>; };
template <int N> struct Q4 { static constexpr auto run = dot_q45_K<false, N>; };
template <int N> struct Q5 { static constexpr auto run = dot_q45_K<true, N>; };
template <int N> struct Q6 { static constexpr auto run = dot_q6_K<N>; };
template <int N> struct Q4_1 { static constexpr auto run = dot_q8_1<false, N>; };
template <int N> struct Q5_1 { static constexpr auto run = dot_q8_1<true, N>; };


}  // namespace

/// The kernel of `type` (a kquant::formats() row), or nullptr.
inline KQuantDot kernel_of(LowBit type) {
  switch (type) {
    case LowBit::kQ2_K: return by_tokens<Q2>;
    case LowBit::kQ3_K: return by_tokens<Q3>;
    case LowBit::kQ4_K: return by_tokens<Q4>;
    case LowBit::kQ5_K: return by_tokens<Q5>;
    case LowBit::kQ6_K: return by_tokens<Q6>;
    case LowBit::kQ4_1: return by_tokens<Q4_1>;
    case LowBit::kQ5_1: return by_tokens<Q5_1>;
    default: return nullptr;
  }
}

}  // namespace woq::detail::KQUANT_ISA
