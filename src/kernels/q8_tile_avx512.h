// What the AVX-512 and AMX integer-path tiles share (included only by files
// compiled with the AVX-512 flags: matmul_avx512.cc, matmul_avx512_bf16.cc, matmul_amx.cc).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "formats/interleave.h"
#include "formats/low_bit.h"

namespace woq::detail {
namespace {  // each including file keeps its own copy, compiled with its own flags

/// The scales of the 16 rows of row groups g and g2 (g2 == g: the same 8 twice) for weight group gi of the
/// interleaved layout (fp16 -> fp32, lanes 0-7 from g, 8-15 from g2), and for asym_int4 their zero points.
template <LowBit T>
inline void pair_scales(const QuantMatrix& w, std::int64_t g, std::int64_t g2, std::int64_t gi, __m512& dw,
                        __m512i& zero) {
  const std::uint16_t* s0 = w.scales.data() + (g * w.groups_per_row + gi) * kInterleaveRows;
  const std::uint16_t* s1 = w.scales.data() + (g2 * w.groups_per_row + gi) * kInterleaveRows;
  const __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s0));
  const __m128i h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s1));
  dw = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
  if constexpr (T == LowBit::kAsymInt4) {
    const std::uint8_t* z = w.zeros.data();
    const __m128i z0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(z + (g * w.groups_per_row + gi) * kInterleaveRows));
    const __m128i z1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(z + (g2 * w.groups_per_row + gi) * kInterleaveRows));
    zero = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(z0, z1));
  }
}

/// y[t + j, the rows of row groups g, g2] = acc[j] for j < tokens (y is [tokens, W.rows]): lanes 0-7 are
/// group g's rows, 8-15 group g2's (dropped when g2 == g); rows past W.rows are not written.
inline void store_pair_rows(const QuantMatrix& w, std::int64_t g, std::int64_t g2, const __m512* acc, std::int64_t t,
                            std::int64_t tokens, float* y) {
  const std::int64_t r0 = g * kInterleaveRows;
  const std::int64_t lanes = std::min((g2 == g ? 1 : 2) * kInterleaveRows, w.rows - r0);
  const auto store = static_cast<__mmask16>((1u << lanes) - 1u);
  for (std::int64_t j = 0; j < tokens; ++j) _mm512_mask_storeu_ps(y + (t + j) * w.rows + r0, store, acc[j]);
}

/// fn(t, std::integral_constant<int, N>{}) over tokens [t, t_end) in tiles of N = 8 tokens (the prefill
/// tiles of the AVX-512 kernels), then 4, 2 and 1; decode runs tiles of one token.
template <typename Fn>
inline void token_tiles(std::int64_t t, std::int64_t t_end, const Fn& fn) {
  for (; t + 8 <= t_end; t += 8) fn(t, std::integral_constant<int, 8>{});
  if (t + 4 <= t_end) fn(t, std::integral_constant<int, 4>{}), t += 4;
  if (t + 2 <= t_end) fn(t, std::integral_constant<int, 2>{}), t += 2;
  if (t < t_end) fn(t, std::integral_constant<int, 1>{});
}

}  // namespace
}  // namespace woq::detail
