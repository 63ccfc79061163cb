// AVX2 + FMA + F16C row kernels. This file alone is compiled with
// -mavx2 -mfma -mf16c; it is only called after active_isa() found them.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "formats/asym_int4.h"
#include "formats/format_traits.h"
#include "formats/interleave.h"
#include "formats/sym_int4.h"
#include "formats/sym_int8.h"
#include "formats/scale.h"
#include "kernels/dot_tile.h"
#include "kernels/matmul.h"
#include "kernels/q8_activations.h"
#include "kernels/q8_tile.h"

namespace woq::detail {
namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float dot_f32(const float* a, const float* b, std::int64_t k) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), acc1);
  }
  for (; j + 8 <= k; j += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  // Tails by explicit fma: left to the compiler, the contraction of
  // `sum += a * b` differed between dot_f32 and the row kernels below.
  for (; j < k; ++j) sum = std::fma(a[j], b[j], sum);
  return sum;
}

// dot_f32 for 2 rows × 3 tokens at once (dot_tile.h's K): each product keeps dot_f32's two accumulators
// and its fused multiply-adds in order; the 5 loads of a half step serve 6 products.
struct DotTile {
  static constexpr int R = 2, T = 3;
  struct Acc {
    __m256 lo, hi;
  };
  static void zero(Acc& a) { a.lo = a.hi = _mm256_setzero_ps(); }
  static void steps(const float* const* w, const float* const* x, std::int64_t j0, std::int64_t j1,
                    Acc (&acc)[R][T]) {
    Acc a[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) a[r][t] = acc[r][t];
    for (std::int64_t j = j0; j < j1; j += 16) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w[r] + j);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(x[t] + j);
        for (int r = 0; r < R; ++r) a[r][t].lo = _mm256_fmadd_ps(wv[r], xv, a[r][t].lo);
      }
      for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(w[r] + j + 8);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(x[t] + j + 8);
        for (int r = 0; r < R; ++r) a[r][t].hi = _mm256_fmadd_ps(wv[r], xv, a[r][t].hi);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = a[r][t];
  }
  static float finish(const Acc& acc, const float* w, const float* x, std::int64_t j, std::int64_t k) {
    __m256 lo = acc.lo;
    if (j + 8 <= k) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), lo);
      j += 8;
    }
    float sum = hsum(_mm256_add_ps(lo, acc.hi));
    for (; j < k; ++j) sum = std::fma(w[j], x[j], sum);
    return sum;
  }
};

void dot_f32_tile(const float* w, std::int64_t ldw, std::int64_t rows, const float* x, std::int64_t m, std::int64_t k,
                  float* y, std::int64_t ldy) {
  walk_dot_tiles<DotTile>(w, ldw, rows, x, m, k, y, ldy);
}

void axpy(float a, const float* x, float* y, std::int64_t k) {
  const __m256 va = _mm256_set1_ps(a);
  std::int64_t j = 0;
  for (; j + 8 <= k; j += 8)
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
  for (; j < k; ++j) y[j] += a * x[j];
}

// fp16 / bf16 rows: two accumulators so the FMA latency does not bound the loop.
template <bool kBf16>
float dot_half(const std::uint8_t* p, const float* x, std::int64_t k) {
  auto widen = [](const std::uint8_t* q) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    if constexpr (kBf16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  };
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    acc0 = _mm256_fmadd_ps(widen(p + 2 * j), _mm256_loadu_ps(x + j), acc0);
    acc1 = _mm256_fmadd_ps(widen(p + 2 * j + 16), _mm256_loadu_ps(x + j + 8), acc1);
  }
  for (; j + 8 <= k; j += 8) acc0 = _mm256_fmadd_ps(widen(p + 2 * j), _mm256_loadu_ps(x + j), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; j < k; ++j) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * j, 2);
    sum = std::fma(kBf16 ? bf16_to_fp32(h) : fp16_to_fp32(h), x[j], sum);
  }
  return sum;
}

// Σ_k w_k x_k of a quantized row with w_k = (q_k - z) · s dequantized in
// registers, in exactly dot_f32's order of operations over the widened row
// (two accumulators over steps of 16, one step of 8, the scalar tail), so
// the result equals dot_f32(widen_row(row), x) bit for bit: the row path
// (decode) and the widened tiles (prefill) agree. Walks group by group, which
// keeps dot_f32's steps when every group but the last is a multiple of 16 long.
template <LowBit T>
float dot_dequantized(const QuantMatrix& w, std::int64_t row, const float* x) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes;
  const std::int64_t k = w.cols;
  const std::int64_t g = w.group_size;
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  const __m128i mask = _mm_set1_epi8(0x0f);
  // Sixteen widened values from column j (even), as two vectors.
  auto sixteen = [&](std::int64_t j, __m256 z, __m256 s, __m256& lo, __m256& hi) {
    if constexpr (T == LowBit::kSymInt8) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j));
      lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
      hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), s);
    } else {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j / 2));
      const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask));
      lo = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), z), s);
      hi = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), z), s);
    }
  };
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  std::int64_t j = 0;
  float s_last = 0;
  int z_last = 0;
  for (std::int64_t i = 0; i < w.groups_per_row; ++i) {
    const std::int64_t end = std::min(k, (i + 1) * g);
    s_last = fp16_to_fp32(scales[i]);
    z_last = T == LowBit::kAsymInt4 ? w.zeros[static_cast<std::size_t>(row * w.groups_per_row + i)] : 8;
    const __m256 vs = _mm256_set1_ps(s_last), vz = _mm256_set1_ps(static_cast<float>(z_last));
    for (; j + 16 <= end; j += 16) {
      __m256 lo, hi;
      sixteen(j, vz, vs, lo, hi);
      acc0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + j), acc0);
      acc1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + j + 8), acc1);
    }
  }
  // The last group's remainder: dot_f32's one step of 8 and its scalar tail.
  auto value = [&](std::int64_t c) {
    const int q = T == LowBit::kSymInt8 ? reinterpret_cast<const std::int8_t*>(p)[c] : codec::get_nibble(p, c) - z_last;
    return static_cast<float>(q) * s_last;
  };
  if (j + 8 <= k) {
    alignas(32) float v[8];
    for (int c = 0; c < 8; ++c) v[c] = value(j + c);
    acc0 = _mm256_fmadd_ps(_mm256_load_ps(v), _mm256_loadu_ps(x + j), acc0);
    j += 8;
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; j < k; ++j) sum = std::fma(value(j), x[j], sum);
  return sum;
}

// ---- Integer path: int8 activation blocks against interleaved weight blocks ----
//
// Weights are row-interleaved (formats/interleave.h): one 32-byte chunk holds
// four consecutive inputs of each of 8 rows, so maddubs against four
// activation bytes broadcast to every lane gives the 8 rows' partial sums in
// 8 lanes, and each block's exact int32 sums, less zero · Σa for the 4-bit
// formats (stored nibbles q = value + zero), meet the float scales once per
// block for 8 rows: acc = fma(Σ q·a - zero·Σa, s_w·d_a, acc).
// Every output is that sequence over its blocks, in block order, whichever
// tile computes it: bit-identical to the scalar reference and independent
// of the batch and the thread count.

// Four activation bytes at q, broadcast to every 32-bit lane.
inline __m256i broadcast4(const std::int8_t* q) {
  std::int32_t v;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

// 255 · hi + lo: a block's sums of int16 activations from those of their two int8 parts.
inline __m256i combine_wide(__m256i hi, __m256i lo) {
  return _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(hi, 8), hi), lo);
}

// Rows [8 g, 8 g + 8) x tokens [t, t + TOK); y is [a.m, w.rows]. kWide: int16 activations (a.wide),
// each block's sums taken for the high and the low parts and combined.
template <LowBit T, int TOK, bool kWide>
void interleaved_tile(const QuantMatrix& w, std::int64_t g, const Q8Activations& a, std::int64_t t, float* y) {
  constexpr bool kInt4 = T != LowBit::kSymInt8;
  constexpr std::int64_t kBlockBytes = kInt4 ? 128 : 256;
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  const std::uint8_t* p = w.data.data() + g * kb * kBlockBytes;
  const std::uint16_t* scales = w.scales.data() + g * w.groups_per_row * kInterleaveRows;
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[TOK];
  __m256i unit[kWide ? TOK : 1];  // int16 activations: the scale unit's sums so far
  for (int j = 0; j < TOK; ++j) acc[j] = _mm256_setzero_ps();
  for (auto& u : unit) u = _mm256_setzero_si256();
  std::int64_t group = -1;
  __m256 dw = _mm256_setzero_ps();
  __m256i zero = _mm256_setzero_si256();  // asym_int4's zero points, per row
  for (std::int64_t b = 0; b < kb; ++b, p += kBlockBytes) {
    for (std::int64_t line = 0; line < kBlockBytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + line), _MM_HINT_T0);
    if (const std::int64_t gi = group_of(b); gi != group) {
      group = gi;
      dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + gi * kInterleaveRows)));
      if constexpr (T == LowBit::kAsymInt4)
        zero = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(
            w.zeros.data() + (g * w.groups_per_row + gi) * kInterleaveRows)));
    }
    // acc[j] += this block's sums for token t + j (int16 activations: at the end of a scale unit, its sums).
    const bool ends = kWide && unit_ends(group_of, a, b);
    auto update = [&](int j, __m256i isum) {
      const std::size_t at = static_cast<std::size_t>((t + j) * a.padded + b);
      if constexpr (T == LowBit::kSymInt4) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * a.qsum[at]));
      if constexpr (T == LowBit::kAsymInt4)
        isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(zero, _mm256_set1_epi32(a.qsum[at])));
      if constexpr (kWide) {
        unit[j] = _mm256_add_epi32(unit[j], isum);
        if (!ends) return;
        isum = unit[j];
        unit[j] = _mm256_setzero_si256();
      }
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(a.d[at])), acc[j]);
    };
    // The token loops are kept rolled: unrolled, GCC hoists the activation
    // broadcasts of every token and spills them.
    if constexpr (kInt4) {
      // Eight maddubs of nibbles (<= 15) and int8 (|a| <= 127) pair sums
      // add up to at most 8 * 3810 = 30480: no int16 saturation. The block's
      // eight unpacked weight vectors stay in registers across the tokens.
      __m256i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c));
        lo[c] = _mm256_and_si256(v, mask);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      }
      auto sums = [&](const std::int8_t* q) {
        __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo[0], broadcast4(q)),
                                     _mm256_maddubs_epi16(hi[0], broadcast4(q + 16)));
        for (int c = 1; c < 4; ++c)
          s = _mm256_add_epi16(s, _mm256_add_epi16(_mm256_maddubs_epi16(lo[c], broadcast4(q + 4 * c)),
                                                   _mm256_maddubs_epi16(hi[c], broadcast4(q + 16 + 4 * c))));
        return _mm256_madd_epi16(s, ones);
      };
#pragma GCC unroll 1
      for (int j = 0; j < TOK; ++j) {
        const __m256i s = sums(a.row(t + j) + b * kQ8Block);
        if constexpr (kWide) update(j, combine_wide(s, sums(a.lo_row(t + j) + b * kQ8Block)));
        else update(j, s);
      }
    } else {
      // maddubs needs one unsigned operand: maddubs(|w|, sign(a, w)); its
      // pair sums (<= 2 * 127 * 127) are widened before they are added.
      // Four chunks (16 of the block's 32 inputs) at a time stay in registers.
      // (int16 activations: the high parts' sums in isum, the low ones' in isum_lo.)
      __m256i isum[TOK], isum_lo[kWide ? TOK : 1];
      for (int half = 0; half < 2; ++half) {
        __m256i v[4], abs[4];
        for (int c = 0; c < 4; ++c) {
          v[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 * half + 32 * c));
          abs[c] = _mm256_sign_epi8(v[c], v[c]);
        }
        auto add = [&](__m256i s, const std::int8_t* q) {
          for (int c = 0; c < 4; ++c)
            s = _mm256_add_epi32(
                s, _mm256_madd_epi16(_mm256_maddubs_epi16(abs[c], _mm256_sign_epi8(broadcast4(q + 4 * c), v[c])), ones));
          return s;
        };
#pragma GCC unroll 1
        for (int j = 0; j < TOK; ++j) {
          const std::int64_t at = b * kQ8Block + 16 * half;
          isum[j] = add(half == 0 ? _mm256_setzero_si256() : isum[j], a.row(t + j) + at);
          if constexpr (kWide) isum_lo[j] = add(half == 0 ? _mm256_setzero_si256() : isum_lo[j], a.lo_row(t + j) + at);
        }
      }
#pragma GCC unroll 1
      for (int j = 0; j < TOK; ++j) {
        if constexpr (kWide) update(j, combine_wide(isum[j], isum_lo[j]));
        else update(j, isum[j]);
      }
    }
  }
  const std::int64_t r0 = g * kInterleaveRows;
  const std::int64_t valid = std::min(kInterleaveRows, w.rows - r0);
  for (int j = 0; j < TOK; ++j) {
    float* out = y + (t + j) * w.rows + r0;
    if (valid == kInterleaveRows) {
      _mm256_storeu_ps(out, acc[j]);
    } else {
      alignas(32) float v[8];
      _mm256_store_ps(v, acc[j]);
      std::memcpy(out, v, static_cast<std::size_t>(valid) * sizeof(float));
    }
  }
}

// Tokens per prefill tile, picked by measurement (bench/matmul_bench at
// 11008 x 4096 on Zen 3); decode runs tiles of one token.
constexpr int kPrefillTokens = 4;

// tile(g, t, std::integral_constant<int, N>{}) over row groups [g0, g1) x tokens [t0, t0 + tokens), in
// tiles of N = kPrefillTokens tokens, then single ones.
template <typename Tile>
void each_tile(std::int64_t g0, std::int64_t g1, std::int64_t t0, std::int64_t tokens, const Tile& tile) {
  const std::int64_t t_end = t0 + tokens;
  for (std::int64_t g = g0; g < g1; ++g) {
    std::int64_t t = t0;
    for (; t + kPrefillTokens <= t_end; t += kPrefillTokens) tile(g, t, std::integral_constant<int, kPrefillTokens>{});
    for (; t < t_end; ++t) tile(g, t, std::integral_constant<int, 1>{});
  }
}

void tile_q8(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a,
             std::int64_t t0, std::int64_t tokens, float* y, ScratchArena&) {
  for_integer_format(w.type, [&](auto type) {
    each_tile(g0, g1, t0, tokens, [&](std::int64_t g, std::int64_t t, auto tok) {
      if (a.wide) interleaved_tile<decltype(type)::value, decltype(tok)::value, true>(w, g, a, t, y);
      else interleaved_tile<decltype(type)::value, decltype(tok)::value, false>(w, g, a, t, y);
    });
  });
}

// ---- bf16 path (Activations::kBf16), emulated in fp32 ----
//
// Lanes are the 8 rows of one interleaved group: per input pair, the odd input's product and then the
// even one's are added to each row's sum (an fma of an exact product: one rounding, as vdpbf16ps), and
// each group's sums meet the scales, acc = fma(sum, s_w, acc): the reference's order (matmul.cc).

// The weights' integers (q - zero) of one block of group g as floats: v[i] holds input i of the 8 rows.
template <LowBit T>
inline void block_values(const std::uint8_t* p, __m256i zero, __m256* v) {
  for (int c = 0; c < (T == LowBit::kSymInt8 ? 8 : 4); ++c) {
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c));
    for (int j = 0; j < 4; ++j) {
      if constexpr (T == LowBit::kSymInt8) {
        // Byte j of each row's four, sign-extended.
        v[4 * c + j] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(d, 24 - 8 * j), 24));
      } else {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(d, 8 * j), _mm256_set1_epi32(0x0f));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(d, 8 * j + 4), _mm256_set1_epi32(0x0f));
        v[4 * c + j] = _mm256_cvtepi32_ps(_mm256_sub_epi32(lo, zero));
        v[16 + 4 * c + j] = _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, zero));
      }
    }
  }
}

// Rows [8 g, 8 g + 8) x tokens [t, t + TOK) of the bf16 path; y is [a.m, w.rows].
template <LowBit T, int TOK>
void bf16_tile(const QuantMatrix& w, std::int64_t g, const Bf16Activations& a, std::int64_t t, float* y) {
  constexpr std::int64_t kBlockBytes = T == LowBit::kSymInt8 ? 256 : 128;
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  const std::uint8_t* p = w.data.data() + g * kb * kBlockBytes;
  const std::uint16_t* scales = w.scales.data() + g * w.groups_per_row * kInterleaveRows;
  __m256 acc[TOK], sum[TOK];
  for (int j = 0; j < TOK; ++j) acc[j] = sum[j] = _mm256_setzero_ps();
  __m256i zero = _mm256_set1_epi32(T == LowBit::kSymInt4 ? 8 : 0);
  for (std::int64_t b = 0; b < kb; ++b, p += kBlockBytes) {
    const std::int64_t gi = group_of(b);
    if constexpr (T == LowBit::kAsymInt4)
      zero = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros.data() + (g * w.groups_per_row + gi) * kInterleaveRows)));
    __m256 v[32];
    block_values<T>(p, zero, v);
    for (int j = 0; j < TOK; ++j) {
      const std::uint16_t* x = a.row(t + j) + b * kBf16Block;
      for (int i = 0; i < 32; i += 2) {
        sum[j] = _mm256_fmadd_ps(_mm256_set1_ps(bf16_to_fp32(x[i + 1])), v[i + 1], sum[j]);
        sum[j] = _mm256_fmadd_ps(_mm256_set1_ps(bf16_to_fp32(x[i])), v[i], sum[j]);
      }
    }
    if (b + 1 == kb || group_of(b + 1) != gi) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + gi * kInterleaveRows)));
      for (int j = 0; j < TOK; ++j) {
        acc[j] = _mm256_fmadd_ps(sum[j], dw, acc[j]);
        sum[j] = _mm256_setzero_ps();
      }
    }
  }
  const std::int64_t r0 = g * kInterleaveRows;
  const std::int64_t valid = std::min(kInterleaveRows, w.rows - r0);
  for (int j = 0; j < TOK; ++j) {
    alignas(32) float out[8];
    _mm256_store_ps(out, acc[j]);
    std::memcpy(y + (t + j) * w.rows + r0, out, static_cast<std::size_t>(valid) * sizeof(float));
  }
}

void tile_bf16(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Bf16Activations& a,
               std::int64_t t0, std::int64_t tokens, float* y, ScratchArena&) {
  for_integer_format(w.type, [&](auto type) {
    each_tile(g0, g1, t0, tokens, [&](std::int64_t g, std::int64_t t, auto tok) {
      bf16_tile<decltype(type)::value, decltype(tok)::value>(w, g, a, t, y);
    });
  });
}

// (q - zero) · s of n nibbles starting at an even column, 16 at a time: the
// same float operations as the codecs' scalar dequantization, so the same bits.
void widen_int4_group(const std::uint8_t* q, float s, int zero, std::int64_t n, float* out) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m256 z = _mm256_set1_ps(static_cast<float>(zero));
  const __m256 vs = _mm256_set1_ps(s);
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j / 2));
    const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask));
    const __m256 f0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), z);
    const __m256 f1 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), z);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(f0, vs));
    _mm256_storeu_ps(out + j + 8, _mm256_mul_ps(f1, vs));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(codec::get_nibble(q, j) - zero) * s;
}

void widen_int8_group(const std::int8_t* q, float s, std::int64_t n, float* out) {
  const __m256 vs = _mm256_set1_ps(s);
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vs));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(q[j]) * s;
}

// ---- The float path, one row of kFloatPath per format (formats/format_traits.h) ----
// widen: the row as fp32, exactly (dequantize_stored_row's values, 8 or 16 at
// a time); dot: Σ_k w_k x_k equal bit for bit to dot_f32 of the widened row.

const std::uint8_t* row_data(const QuantMatrix& w, std::int64_t row) { return w.data.data() + row * w.row_bytes; }

void widen_fp32(const QuantMatrix& w, std::int64_t row, float* out) {
  std::memcpy(out, row_data(w, row), static_cast<std::size_t>(4 * w.cols));
}

template <bool kBf16>
void widen_half(const QuantMatrix& w, std::int64_t row, float* out) {
  const std::uint8_t* p = row_data(w, row);
  const std::int64_t k = w.cols;
  std::int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j));
    _mm256_storeu_ps(out + j, kBf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                                    : _mm256_cvtph_ps(h));
  }
  for (; j < k; ++j) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * j, 2);
    out[j] = kBf16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
  }
}

template <LowBit T>
void widen_grouped(const QuantMatrix& w, std::int64_t row, float* out) {
  const std::uint8_t* p = row_data(w, row);
  const std::int64_t k = w.cols;
  const std::int64_t g = w.group_size;
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  for (std::int64_t i = 0; i < w.groups_per_row; ++i) {
    if constexpr (T == LowBit::kSymInt8) {
      widen_int8_group(reinterpret_cast<const std::int8_t*>(p) + i * g, fp16_to_fp32(scales[i]),
                       codec::group_len(i, k, g), out + i * g);
    } else {
      const int zero = T == LowBit::kSymInt4 ? 8 : w.zeros[static_cast<std::size_t>(row * w.groups_per_row + i)];
      widen_int4_group(p + i * g / 2, fp16_to_fp32(scales[i]), zero, codec::group_len(i, k, g), out + i * g);
    }
  }
}

float dot_fp32_row(const QuantMatrix& w, std::int64_t row, const float* x, float*) {
  return dot_f32(reinterpret_cast<const float*>(row_data(w, row)), x, w.cols);
}

template <bool kBf16>
float dot_half_row(const QuantMatrix& w, std::int64_t row, const float* x, float*) {
  return dot_half<kBf16>(row_data(w, row), x, w.cols);
}

// Dequantized in registers when every group but the last is a multiple of 16 long (dot_dequantized).
template <LowBit T>
float dot_grouped_row(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch) {
  if (w.group_size % 16 == 0 || w.groups_per_row == 1) return dot_dequantized<T>(w, row, x);
  widen_grouped<T>(w, row, scratch);
  return dot_f32(scratch, x, w.cols);
}

// ggml's block formats (K-quants, q4_1, q5_1) with f32 activations: widened by ggml's dequantizer.
float dot_widened_row(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch) {
  dequantize_stored_row(w, row, scratch);
  return dot_f32(scratch, x, w.cols);
}

struct FloatPath {
  float (*dot_row)(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch);
  void (*widen_row)(const QuantMatrix& w, std::int64_t row, float* out);
};

constexpr FloatPath kKQuantFloatPath{dot_widened_row, dequantize_stored_row};

// In LowBit order, one row per format (the size is checked below).
constexpr auto kFloatPath = std::to_array<FloatPath>({
    {dot_fp32_row, widen_fp32},
    {dot_half_row<false>, widen_half<false>},
    {dot_half_row<true>, widen_half<true>},
    {dot_grouped_row<LowBit::kSymInt4>, widen_grouped<LowBit::kSymInt4>},
    {dot_grouped_row<LowBit::kAsymInt4>, widen_grouped<LowBit::kAsymInt4>},
    {dot_grouped_row<LowBit::kSymInt8>, widen_grouped<LowBit::kSymInt8>},
    kKQuantFloatPath, kKQuantFloatPath, kKQuantFloatPath, kKQuantFloatPath, kKQuantFloatPath,  // q2_K ... q6_K
    kKQuantFloatPath, kKQuantFloatPath,                                                          // q4_1, q5_1
});
static_assert(kFloatPath.size() == kFormatCount, "kFloatPath needs a row per LowBit");

float dot_row(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch) {
  return kFloatPath[static_cast<std::size_t>(w.type)].dot_row(w, row, x, scratch);
}

void widen_row(const QuantMatrix& w, std::int64_t row, float* out) {
  kFloatPath[static_cast<std::size_t>(w.type)].widen_row(w, row, out);
}

// group_quantize_x86.h's vectors: 8 lanes, tails by vmaskmov.
struct GroupVec {
  static constexpr std::int64_t kLanes = 8;
  using F = __m256;
  static __m256i mask(std::int64_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<std::int64_t>(left, 8))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static F load(const float* p, std::int64_t left) {
    return left >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask(left));
  }
  static F zero() { return _mm256_setzero_ps(); }
  static F set(float f) { return _mm256_set1_ps(f); }
  static F abs(F v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static bool all_finite(F v) {
    return _mm256_movemask_ps(_mm256_cmp_ps(abs(v), set(std::numeric_limits<float>::max()), _CMP_LE_OQ)) == 0xFF;
  }
  static F min(F v, F m) { return _mm256_min_ps(v, m); }
  static F max(F v, F m) { return _mm256_max_ps(v, m); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static float hmin(F v) {
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_min_ss(s, _mm_movehdup_ps(s)));
  }
  static float hmax(F v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
  }
  static int first_abs_equal(F v, float a, std::int64_t left) {
    const unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(abs(v), set(a), _CMP_EQ_OQ))) &
                       ((1u << std::min<std::int64_t>(left, 8)) - 1);
    return m == 0 ? -1 : std::countr_zero(m);
  }
  static F round_div(F v, F d) { return _mm256_round_ps(_mm256_div_ps(v, d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static void store(std::int32_t* q, F v, std::int64_t left) {
    const __m256i i = _mm256_cvttps_epi32(v);
    if (left >= 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), i);
    } else {
      _mm256_maskstore_epi32(q, mask(left), i);
    }
  }
};

#include "kernels/group_quantize_x86.h"

bool quantize_groups(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                     std::int32_t* q, GroupRule* rules) {
  return quantize_groups_simd<GroupVec>(type, range, x, cols, group, q, rules);
}

}  // namespace

const RowKernels& avx2_kernels() {
  static const RowKernels k = [] {
    RowKernels r{dot_row, dot_rows_by_row<dot_row>, dot_f32, axpy, tile_q8, tile_bf16, widen_row,
                 quantize_activations_avx2};
    r.dot_f32_tile = dot_f32_tile;
    r.quantize_int16 = quantize_activations_int16_avx2;
    r.quantize_groups = quantize_groups;
    return r;
  }();
  return k;
}

}  // namespace woq::detail
