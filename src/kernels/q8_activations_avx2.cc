// AVX2 quantization of activations to int8 blocks; compiled with -mavx2 -mfma.
// Bit-identical to the scalar path: the same float operations, and
// _mm256_cvtps_epi32 rounds to nearest even like std::nearbyint.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/q8_activations.h"

namespace woq::detail {

namespace {

// The largest of v's eight lanes (finite magnitudes: exact in any order).
float hmax(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return *std::max_element(lanes, lanes + 8);
}

// 32 int32 values in [-128, 127] as 32 int8 in order (packs work per 128-bit lane: the permute restores it).
__m256i pack_bytes(const __m256i q[4]) {
  const __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Σ of v's eight int32 lanes.
int hsum(__m256i v) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  return _mm_cvtsi128_si32(s4);
}

}  // namespace

void quantize_activations_avx2(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 flt_max = _mm256_set1_ps(std::numeric_limits<float>::max());
  const std::int64_t full = out.k / kQ8Block;
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t b = 0; b < full; ++b) {
      const float* xb = x + r * out.k + b * kQ8Block;
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      int finite = 0xff;
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        const __m256 abs = _mm256_andnot_ps(sign_mask, v[i]);
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(abs, flt_max, _CMP_LE_OQ));  // false for NaN and Inf
        amax = _mm256_max_ps(amax, abs);
      }
      if (finite != 0xff) {  // the scalar rule for non-finite blocks
        quantize_block(x, r, b, out);
        continue;
      }
      const float max = hmax(amax);
      const float d = max / 127.0f;
      const __m256 id = _mm256_set1_ps(inv_scale(127.0f, max));
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
      const __m256i q8 = pack_bytes(q);
      // Σ q via madd of sign-extended 16-bit halves.
      const __m256i s16 = _mm256_add_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q8)),
                                           _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q8, 1)));
      const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
      std::int8_t* row = out.q.data() + r * out.padded * kQ8Block;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + b * kQ8Block), q8);
      out.d[static_cast<std::size_t>(r * out.padded + b)] = d;
      out.qsum[static_cast<std::size_t>(r * out.padded + b)] = hsum(s32);
    }
    for (std::int64_t b = full; b < out.blocks; ++b) quantize_block(x, r, b, out);
  }
}

// quantize_int16_unit's steps on a full, finite unit of 128 inputs: v = clamp(nearbyint(x · id)) (cvtps rounds
// to nearest even, as nearbyint does in the default mode), hi = floor((v + 127) / 255) as (n · 32897) >> 23 of
// the positive n = v + 127 + 255 · 128 (exact for every n below 2^16: the test checks each v), lo = v − 255 hi.
void quantize_activations_int16_avx2(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1) {
  constexpr std::int64_t kUnit = kInt16ScaleBlocks * kQ8Block;
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 flt_max = _mm256_set1_ps(std::numeric_limits<float>::max());
  const __m256i vmax = _mm256_set1_epi32(kInt16Max), vmin = _mm256_set1_epi32(-kInt16Max);
  const __m256i bias = _mm256_set1_epi32(127 + 255 * 128), magic = _mm256_set1_epi32(32897);
  const __m256i c128 = _mm256_set1_epi32(128), c255 = _mm256_set1_epi32(255);
  const std::int64_t full = out.k / kUnit;
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t u = 0; u < full; ++u) {
      const float* xu = x + r * out.k + u * kUnit;
      __m256 amax = _mm256_setzero_ps();
      int finite = 0xff;
      for (std::int64_t i = 0; i < kUnit; i += 8) {
        const __m256 abs = _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xu + i));
        finite &= _mm256_movemask_ps(_mm256_cmp_ps(abs, flt_max, _CMP_LE_OQ));  // false for NaN and Inf
        amax = _mm256_max_ps(amax, abs);
      }
      if (finite != 0xff) {  // the scalar rule for non-finite units
        quantize_int16_unit(x, r, u * kUnit, out);
        continue;
      }
      const float max = hmax(amax);
      const float d = max / static_cast<float>(kInt16Max);
      const __m256 id = _mm256_set1_ps(inv_scale(static_cast<float>(kInt16Max), max));
      const std::int64_t at = r * out.padded * kQ8Block + u * kUnit;
      for (std::int64_t b = 0; b < kInt16ScaleBlocks; ++b) {
        __m256i hi[4], lo[4];
        __m256i sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) {
          __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xu + b * kQ8Block + 8 * i), id));
          v = _mm256_max_epi32(_mm256_min_epi32(v, vmax), vmin);
          hi[i] = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_mullo_epi32(_mm256_add_epi32(v, bias), magic), 23), c128);
          lo[i] = _mm256_sub_epi32(v, _mm256_mullo_epi32(hi[i], c255));
          sum = _mm256_add_epi32(sum, v);
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + at + b * kQ8Block), pack_bytes(hi));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.lo.data() + at + b * kQ8Block), pack_bytes(lo));
        const std::size_t block = static_cast<std::size_t>(r * out.padded + u * kInt16ScaleBlocks + b);
        out.d[block] = d;
        out.qsum[block] = hsum(sum);
      }
    }
    if (full * kUnit < out.k) quantize_int16_unit(x, r, full * kUnit, out);
  }
}

}  // namespace woq::detail
