// AVX2 K-quant dot products (kernels/kquant_dot.h): per 32 weights, u8 × s8
// pair products (maddubs), then scale × pair-sum (madd) into eight int32
// lanes, each covering 4 consecutive weights of every 32: the reference's
// lanes, so the float steps (fma per lane, then the float8 sum) see the same
// integers and give the same bits.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/half.h"
#include "formats/kquant.h"
#include "kernels/kquant_dot.h"

namespace woq::detail {
namespace {

using kquant::kQ8KBytes;
using kquant::kSuperBlock;

float half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

float q8_d(const std::uint8_t* a) {
  float d;
  std::memcpy(&d, a, 4);
  return d;
}

__m256i load(const std::uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

float hsum8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// int16 lanes 0..7 = lo, 8..15 = hi: the scales of a 32-byte run's two halves.
__m256i scale_pair(int lo, int hi) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(hi)), _mm_set1_epi16(static_cast<short>(lo)));
}

// Σ scale · (q · a) in eight int32 lanes, for u8 quants q and s8 activations a (32 each).
__m256i scaled(__m256i q, __m256i a, __m256i scale) { return _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q, a)); }

// The 6-bit (scale, min) pairs of q4_K / q5_K: scales to sc[0..8), mins to m[0..8).
void scales_k4(const std::uint8_t* packed, int* sc, int* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = packed[j] & 63;
    m[j] = packed[j + 4] & 63;
    sc[j + 4] = (packed[j + 8] & 0x0f) | ((packed[j] >> 6) << 4);
    m[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
  }
}

// Four lanes of Σ min · (activation sum) per pair of 32-weight sub-blocks (q4_K / q5_K).
__m128i mins_k4(const int* m, const std::uint8_t* a) {
  const __m256i bsums = load(a + 4 + kSuperBlock);
  const __m128i sums32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
  const __m128i mins = _mm_setr_epi16(static_cast<short>(m[0]), static_cast<short>(m[1]), static_cast<short>(m[2]),
                                      static_cast<short>(m[3]), static_cast<short>(m[4]), static_cast<short>(m[5]),
                                      static_cast<short>(m[6]), static_cast<short>(m[7]));
  return _mm_madd_epi16(mins, sums32);
}

float dot_q2_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, w += 84, a += kQ8KBytes) {
    const float da = q8_d(a);
    const float d = da * half_at(w + 80);
    const float dmin = -da * half_at(w + 82);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0f)));
    const __m256i prod = _mm256_madd_epi16(mins, load(a + 4 + kSuperBlock));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
    const std::uint8_t* q8 = a + 4;
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load(w + 16 + 32 * h);
      for (int k = 0; k < 4; ++k, q8 += 32) {
        const int r = 4 * h + k;
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        sumi = _mm256_add_epi32(sumi, scaled(q, load(q8), scale_pair(w[2 * r] & 0x0f, w[2 * r + 1] & 0x0f)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

float dot_q3_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i four = _mm256_set1_epi8(4);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, w += 110, a += kQ8KBytes) {
    const float d = q8_d(a) * half_at(w + 108);
    int scale[16];
    const std::uint8_t* packed = w + 96;
    for (int s = 0; s < 16; ++s) {
      const int low = s < 8 ? (packed[s] & 0x0f) : (packed[s - 8] >> 4);
      scale[s] = (low | (((packed[8 + s % 4] >> (2 * (s / 4))) & 3) << 4)) - 32;
    }
    const __m256i hmask = load(w);
    const std::uint8_t* q8 = a + 4;
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load(w + 32 + 32 * h);
      for (int k = 0; k < 4; ++k, q8 += 32) {
        const int r = 4 * h + k;
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << r));
        // 4 where the high bit is clear: q = low - 4 · (bit clear).
        const __m256i minus = _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit), four);
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        const __m256i a8 = load(q8);
        const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(low, a8), _mm256_maddubs_epi16(minus, a8));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale_pair(scale[2 * r], scale[2 * r + 1]), p16));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

template <bool kFive>
float dot_q45_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i sixteen = _mm256_set1_epi8(16);
  const std::int64_t bytes = kFive ? 176 : 144;
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  float summs = 0.0f;
  for (std::int64_t b = 0; b < blocks; ++b, w += bytes, a += kQ8KBytes) {
    const float da = q8_d(a);
    const float d = da * half_at(w);
    const float dmin = -da * half_at(w + 2);
    int sc[8], m[8];
    scales_k4(w + 4, sc, m);
    const __m128i prod = mins_k4(m, a);
    if constexpr (kFive) {
      const __m128i pairs = _mm_hadd_epi32(prod, prod);
      const int total = _mm_cvtsi128_si32(_mm_hadd_epi32(pairs, pairs));
      summs = std::fma(dmin, static_cast<float>(total), summs);
    } else {
      acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
    }
    const std::uint8_t* qs = w + (kFive ? 48 : 16);
    const __m256i qh = kFive ? load(w + 16) : _mm256_setzero_si256();
    const std::uint8_t* q8 = a + 4;
    __m256i sumi = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i, qs += 32, q8 += 64) {
      const __m256i bits = load(qs);
      __m256i lo = _mm256_and_si256(bits, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
      if constexpr (kFive) {
        const __m256i bit_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * i)));
        const __m256i bit_hi = _mm256_set1_epi8(static_cast<char>(1 << (2 * i + 1)));
        lo = _mm256_add_epi8(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), sixteen));
        hi = _mm256_add_epi8(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), sixteen));
      }
      const __m256i p_lo = scaled(lo, load(q8), _mm256_set1_epi16(static_cast<short>(sc[2 * i])));
      const __m256i p_hi = scaled(hi, load(q8 + 32), _mm256_set1_epi16(static_cast<short>(sc[2 * i + 1])));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p_lo, p_hi));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  if constexpr (kFive) return hsum8(acc) + summs;
  acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
  return hsum8(acc) + _mm_cvtss_f32(acc_m);
}

float dot_q6_K(const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i m2 = _mm256_set1_epi8(3);
  const __m256i m32 = _mm256_set1_epi8(32);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < blocks; ++b, w += 210, a += kQ8KBytes) {
    const float d = q8_d(a) * half_at(w + 208);
    const auto* sc = reinterpret_cast<const std::int8_t*>(w + 192);
    const std::uint8_t* q8 = a + 4;
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql1 = load(w + 64 * h);
      const __m256i ql2 = load(w + 64 * h + 32);
      const __m256i qh = load(w + 128 + 32 * h);
      const __m256i low[4] = {_mm256_and_si256(ql1, m4), _mm256_and_si256(ql2, m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(ql2, 4), m4)};
      for (int r = 0; r < 4; ++r, q8 += 32) {
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * r), m2), 4);
        const __m256i q = _mm256_or_si256(low[r], high);
        const __m256i a8 = load(q8);
        const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a8), _mm256_maddubs_epi16(m32, a8));
        const int s = 8 * h + 2 * r;
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale_pair(sc[s], sc[s + 1]), p16));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

}  // namespace

KQuantDot kquant_dot_avx2(LowBit type) {
  switch (type) {
    case LowBit::kQ2_K: return dot_q2_K;
    case LowBit::kQ3_K: return dot_q3_K;
    case LowBit::kQ4_K: return dot_q45_K<false>;
    case LowBit::kQ5_K: return dot_q45_K<true>;
    case LowBit::kQ6_K: return dot_q6_K;
    default: return nullptr;
  }
}

}  // namespace woq::detail
