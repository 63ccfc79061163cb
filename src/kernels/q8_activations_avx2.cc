// AVX2 quantization of activations to int8 blocks; compiled with -mavx2 -mfma.
// Bit-identical to the scalar path: the same float operations, and
// _mm256_cvtps_epi32 rounds to nearest even like std::nearbyint.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/q8_activations.h"

namespace woq::detail {

void quantize_activations_avx2(const float* x, Q8Activations& out) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 flt_max = _mm256_set1_ps(std::numeric_limits<float>::max());
  const std::int64_t full = out.k / kQ8Block;
  for (std::int64_t r = 0; r < out.m; ++r) {
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
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float max = _mm_cvtss_f32(m4);
      const float d = max / 127.0f;
      const __m256 id = _mm256_set1_ps(inv_scale(127.0f, max));
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
      // Pack 32 int32 -> 32 int8; packs work per 128-bit lane, so restore order after.
      const __m256i q16a = _mm256_packs_epi32(q[0], q[1]);
      const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);
      __m256i q8 = _mm256_packs_epi16(q16a, q16b);
      q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      // Σ q via madd of sign-extended 16-bit halves.
      const __m256i s16 = _mm256_add_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q8)),
                                           _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q8, 1)));
      const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      std::int8_t* row = out.q.data() + r * out.padded * kQ8Block;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + b * kQ8Block), q8);
      out.d[static_cast<std::size_t>(r * out.padded + b)] = d;
      out.qsum[static_cast<std::size_t>(r * out.padded + b)] = _mm_cvtsi128_si32(s4);
    }
    for (std::int64_t b = full; b < out.blocks; ++b) quantize_block(x, r, b, out);
  }
}

}  // namespace woq::detail
