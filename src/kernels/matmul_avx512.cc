// AVX-512 (F + BW + VL + VNNI) kernels of the integer path. This file alone is
// compiled with the AVX-512 flags; it is only called after active_isa() found
// them.
//
// One tile covers two 8-row groups of the interleaved layout
// (formats/interleave.h) side by side: chunk c of group g in the low 256 bits
// of a vector, chunk c of group g + 1 in the high ones, so one VNNI vpdpbusd
// against four activation bytes broadcast to every lane adds four products to
// each of 16 rows' int32 sums. vpdpbusd multiplies unsigned by signed bytes:
// the 4-bit formats' stored nibbles q are unsigned already, and sym_int8's
// signed values are offset by 128 (q ^ 0x80). Each block's int32 sums are
// then corrected in integers, Σ q·a - zero·Σa (zero = 8 for sym_int4, per
// group for asym_int4, 128 for the offset int8 values), and meet the scales
// once per block: acc = fma(sum, s_w·d_a, acc). That is the scalar
// reference's sequence of operations (matmul.cc), so the outputs are the same
// bits as every other ISA's, whatever the batch and the thread count.
// The float path's decode kernel (dot_rows) is here too; its other entries are AVX2's.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "formats/asym_int4.h"
#include "formats/interleave.h"
#include "formats/sym_int4.h"
#include "formats/sym_int8.h"
#include "formats/scale.h"
#include "kernels/dot_tile.h"
#include "kernels/matmul.h"
#include "kernels/q8_activations.h"
#include "kernels/q8_tile.h"
#include "kernels/q8_tile_avx512.h"

namespace woq::detail {
namespace {

// Four activation bytes at q, broadcast to every 32-bit lane (a vpbroadcastd
// from memory: a load, no shuffle port).
inline __m512i broadcast4(const std::int8_t* q) {
  std::int32_t v;
  std::memcpy(&v, q, 4);
  return _mm512_set1_epi32(v);
}

// 32 bytes at p0 in the low half, 32 at p1 in the high half.
inline __m512i load_pair(const std::uint8_t* p0, const std::uint8_t* p1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1)), 1);
}

// Rows [8 g, 8 g + 16) (groups g and g2 = g + 1; with g2 == g only the low
// eight lanes are stored) x tokens [t, t + TOK); y is [a.m, w.rows]. kWide: int16 activations (a.wide),
// each block's sums taken for the high and the low parts, then 255 · hi + lo.
template <LowBit T, int TOK, bool kWide>
void pair_tile(const QuantMatrix& w, std::int64_t g, std::int64_t g2, const Q8Activations& a, std::int64_t t,
               float* y) {
  constexpr bool kInt4 = T != LowBit::kSymInt8;
  constexpr std::int64_t kBlockBytes = kInt4 ? 128 : 256;
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  const std::uint8_t* p0 = w.data.data() + g * kb * kBlockBytes;
  const std::uint8_t* p1 = w.data.data() + g2 * kb * kBlockBytes;
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[TOK];
  // int16 activations: the scale unit's sums so far, and its Σa (the zero points' correction is taken once per
  // unit: the unit lies in one group, so Σ (s_b − zero·Σa_b) = Σ s_b − zero·Σ Σa_b, the same integers).
  __m512i unit[kWide ? TOK : 1];
  std::int32_t unit_qsum[kWide ? TOK : 1] = {};
  for (int j = 0; j < TOK; ++j) acc[j] = _mm512_setzero_ps();
  for (auto& u : unit) u = _mm512_setzero_si512();
  std::int64_t group = -1;
  __m512 dw = _mm512_setzero_ps();
  __m512i zero = _mm512_setzero_si512();  // asym_int4's zero points, per row
  for (std::int64_t b = 0; b < kb; ++b, p0 += kBlockBytes, p1 += kBlockBytes) {
    for (std::int64_t line = 0; line < kBlockBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(p0 + kPrefetchBytes + line), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p1 + kPrefetchBytes + line), _MM_HINT_T0);
    }
    if (const std::int64_t gi = group_of(b); gi != group) {
      group = gi;
      pair_scales<T>(w, g, g2, gi, dw, zero);
    }
    // The block's weights as unsigned bytes, kept in registers across the tokens.
    __m512i v[8];
    if constexpr (kInt4) {
      // v[c] = low nibbles of chunk c (inputs 4c..4c+3), v[4 + c] = high ones (16 + 4c..).
      for (int c = 0; c < 4; ++c) {
        const __m512i packed = load_pair(p0 + 32 * c, p1 + 32 * c);
        v[c] = _mm512_and_si512(packed, mask);
        v[4 + c] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), mask);
      }
    } else {
      for (int c = 0; c < 8; ++c) v[c] = _mm512_xor_si512(load_pair(p0 + 32 * c, p1 + 32 * c), offset);
    }
    // One block's sums for the activations at q. Two chains of four, so that one token's sums are not one
    // latency-bound chain of eight; v[c] holds inputs 4c..4c+3 and v[4 + c] inputs 16 + 4c.. in both layouts.
    auto sums = [&](const std::int8_t* q) {
      __m512i s0v = _mm512_setzero_si512(), s1v = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        s0v = _mm512_dpbusd_epi32(s0v, v[c], broadcast4(q + 4 * c));
        s1v = _mm512_dpbusd_epi32(s1v, v[4 + c], broadcast4(q + 16 + 4 * c));
      }
      return _mm512_add_epi32(s0v, s1v);
    };
    const bool ends = kWide && unit_ends(group_of, a, b);
#pragma GCC unroll 16
    for (int j = 0; j < TOK; ++j) {
      const std::size_t at = static_cast<std::size_t>((t + j) * a.padded + b);
      __m512i isum = sums(a.row(t + j) + b * kQ8Block);
      if constexpr (kWide)
        isum = _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(isum, 8), isum), sums(a.lo_row(t + j) + b * kQ8Block));
      std::int32_t qsum = a.qsum[at];
      if constexpr (kWide) {
        unit[j] = _mm512_add_epi32(unit[j], isum);
        unit_qsum[j] += qsum;
        if (!ends) continue;
        isum = unit[j];
        qsum = unit_qsum[j];
        unit[j] = _mm512_setzero_si512();
        unit_qsum[j] = 0;
      }
      if constexpr (T == LowBit::kSymInt4) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(8 * qsum));
      if constexpr (T == LowBit::kAsymInt4) isum = _mm512_sub_epi32(isum, _mm512_mullo_epi32(zero, _mm512_set1_epi32(qsum)));
      if constexpr (T == LowBit::kSymInt8) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(128 * qsum));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), acc[j]);
    }
  }
  store_pair_rows(w, g, g2, acc, t, TOK, y);
}

template <LowBit T>
void tile_q8_typed(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a,
                   std::int64_t t0, std::int64_t tokens, float* y) {
  for (std::int64_t g = g0; g < g1; g += 2) {
    const std::int64_t g2 = g + 1 < g1 ? g + 1 : g;
    token_tiles(t0, t0 + tokens, [&](std::int64_t t, auto tok) {
      if (a.wide) pair_tile<T, decltype(tok)::value, true>(w, g, g2, a, t, y);
      else pair_tile<T, decltype(tok)::value, false>(w, g, g2, a, t, y);
    });
  }
}

void tile_q8(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a, std::int64_t t0,
             std::int64_t tokens, float* y, ScratchArena&) {
  for_integer_format(w.type, [&](auto type) { tile_q8_typed<decltype(type)::value>(w, g0, g1, a, t0, tokens, y); });
}

// ---- Float path (f32 activations, decode): several rows per pass ----
//
// matmul_avx2.cc's dot_dequantized for R rows at once. Its two 8-wide accumulators over steps of 16
// columns (acc0 over j..j+7, acc1 over j+8..j+15) are one 16-wide accumulator here (lanes 0-7 and
// 8-15): lane for lane the same operations, ((q - z) · s) then fma with x, and acc0 + acc1 is the sum of
// the two halves, so each row's result is the AVX2 kernel's bits (and dot_f32's of the widened row:
// prefill and decode agree). One accumulator chain is bound by the FMA latency, which held the AVX2 code
// to ~9 GB/s; R independent chains, with x loaded once for all of them, stream at memory bandwidth.

float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The end of a row of the multi-row kernels below, as the AVX2 kernels end it: acc's halves are AVX2's
// acc0 and acc1; then dot_f32's one step of 8 (into acc0) over value(c) for the columns from j, the
// horizontal sum, and the scalar tail.
template <typename Value>
float finish_row(__m512 acc, std::int64_t j, std::int64_t k, const float* x, const Value& value) {
  // The halves through memory: GCC 12 warns of its own uninitialised operand in the extract intrinsics.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  __m256 acc0 = _mm256_load_ps(lanes);
  const __m256 acc1 = _mm256_load_ps(lanes + 8);
  std::int64_t c = j;
  if (c + 8 <= k) {
    alignas(32) float v[8];
    for (int e = 0; e < 8; ++e) v[e] = value(c + e);
    acc0 = _mm256_fmadd_ps(_mm256_load_ps(v), _mm256_loadu_ps(x + c), acc0);
    c += 8;
  }
  float sum = hsum8(_mm256_add_ps(acc0, acc1));
  for (; c < k; ++c) sum = std::fma(value(c), x[c], sum);
  return sum;
}

// Sixteen dequantized values of a row from column j (even): (q - z) · s. For the 4-bit formats `table`
// holds (q - z) · s for q = 0..15 (computed once per group, the same value lane by lane), and each
// nibble picks its entry: vpermps reads the low 4 bits of each index, so byte i's low nibble is lane
// 2i's index and byte i shifted right by 4 (as 16-bit words: its own high nibble in the low 4 bits) is
// lane 2i + 1's.
template <LowBit T>
inline __m512 sixteen_values(const std::uint8_t* p, std::int64_t j, __m512 table, __m512 s) {
  if constexpr (T == LowBit::kSymInt8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s);
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j / 2));
    const __m128i v = _mm_unpacklo_epi8(b, _mm_srli_epi16(b, 4));
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(v), table);
  }
}

template <LowBit T, int R>
void dot_dequantized_rows(const QuantMatrix& w, std::int64_t r0, const float* x, float* out) {
  const std::int64_t k = w.cols, g = w.group_size;
  const std::uint8_t* p[R];
  const std::uint16_t* scales[R];
  for (int r = 0; r < R; ++r) {
    p[r] = w.data.data() + (r0 + r) * w.row_bytes;
    scales[r] = w.scales.data() + (r0 + r) * w.groups_per_row;
  }
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  float s_last[R] = {};
  int z_last[R] = {};
  std::int64_t j = 0;
  for (std::int64_t i = 0; i < w.groups_per_row; ++i) {
    const std::int64_t end = std::min(k, (i + 1) * g);
    __m512 vs[R], vz[R];  // scales; for the 4-bit formats, the table of (q - z) · s
    for (int r = 0; r < R; ++r) {
      s_last[r] = _cvtsh_ss(scales[r][i]);  // F16C: fp16_to_fp32's value, without its branches
      z_last[r] = T == LowBit::kAsymInt4 ? w.zeros[static_cast<std::size_t>((r0 + r) * w.groups_per_row + i)] : 8;
      vs[r] = _mm512_set1_ps(s_last[r]);
      if constexpr (T != LowBit::kSymInt8) {
        const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        vz[r] = _mm512_mul_ps(_mm512_sub_ps(q, _mm512_set1_ps(static_cast<float>(z_last[r]))), vs[r]);
      }
    }
    for (; j + 32 <= end; j += 32) {  // two steps a turn: the same operations in the same order
      // Each row's stream kPrefetchBytes ahead (the hardware prefetcher falls behind on 8 streams).
      if constexpr (T == LowBit::kSymInt8)
        for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(p[r] + j + kPrefetchBytes), _MM_HINT_T0);
      else if (j % 128 == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(p[r] + j / 2 + kPrefetchBytes), _MM_HINT_T0);
      const __m512 x0 = _mm512_loadu_ps(x + j), x1 = _mm512_loadu_ps(x + j + 16);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(sixteen_values<T>(p[r], j, vz[r], vs[r]), x0, acc[r]);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(sixteen_values<T>(p[r], j + 16, vz[r], vs[r]), x1, acc[r]);
    }
    for (; j + 16 <= end; j += 16) {
      const __m512 xv = _mm512_loadu_ps(x + j);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(sixteen_values<T>(p[r], j, vz[r], vs[r]), xv, acc[r]);
    }
  }
  // The last group's remainder, row by row.
  for (int r = 0; r < R; ++r)
    out[r] = finish_row(acc[r], j, k, x, [&](std::int64_t c) {
      const int q = T == LowBit::kSymInt8 ? reinterpret_cast<const std::int8_t*>(p[r])[c]
                                          : codec::get_nibble(p[r], c) - z_last[r];
      return static_cast<float>(q) * s_last[r];
    });
}

// matmul_avx2.cc's dot_half (fp16 / bf16 rows: lm_head, embeddings) for R rows at once, the same way.
template <bool kBf16, int R>
void dot_half_rows(const QuantMatrix& w, std::int64_t r0, const float* x, float* out) {
  const std::int64_t k = w.cols;
  const std::uint8_t* p[R];
  for (int r = 0; r < R; ++r) p[r] = w.data.data() + (r0 + r) * w.row_bytes;
  auto sixteen = [](const std::uint8_t* q) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    if constexpr (kBf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  };
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(p[r] + 2 * j + kPrefetchBytes), _MM_HINT_T0);
    const __m512 xv = _mm512_loadu_ps(x + j);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(sixteen(p[r] + 2 * j), xv, acc[r]);
  }
  for (int r = 0; r < R; ++r)
    out[r] = finish_row(acc[r], j, k, x, [&](std::int64_t c) {
      std::uint16_t h;
      std::memcpy(&h, p[r] + 2 * c, 2);
      return kBf16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
    });
}

template <bool kBf16>
void dot_half_rows_any(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* out) {
  if (rows == kDotRows) return dot_half_rows<kBf16, kDotRows>(w, r0, x, out);
  for (std::int64_t i = 0; i < rows; ++i) dot_half_rows<kBf16, 1>(w, r0 + i, x, out + i);
}

template <LowBit T>
void dot_rows_typed(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* out) {
  if (rows == kDotRows) return dot_dequantized_rows<T, kDotRows>(w, r0, x, out);
  std::int64_t i = 0;
  for (; i + 4 <= rows; i += 4) dot_dequantized_rows<T, 4>(w, r0 + i, x, out + i);
  for (; i < rows; ++i) dot_dequantized_rows<T, 1>(w, r0 + i, x, out + i);
}

void dot_rows(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* out, float* scratch) {
  if (w.type == LowBit::kFp16) return dot_half_rows_any<false>(w, r0, rows, x, out);
  if (w.type == LowBit::kBf16) return dot_half_rows_any<true>(w, r0, rows, x, out);
  // The AVX2 kernel's condition for dequantizing in registers (dot_row), on the row-major layout.
  if (w.interleave == 1 && (w.group_size % 16 == 0 || w.groups_per_row == 1) && is_quantized(w.type)) {
    for_integer_format(w.type, [&](auto type) { dot_rows_typed<decltype(type)::value>(w, r0, rows, x, out); });
    return;
  }
  const auto dot_row = avx2_kernels().dot_row;
  for (std::int64_t i = 0; i < rows; ++i) out[i] = dot_row(w, r0 + i, x, scratch);
}

// AVX2's dot_f32 for 4 rows × 6 tokens in 16-lane registers (dot_tile.h's K): lanes 0-7 of a product's
// accumulator are dot_f32's acc0, lanes 8-15 its acc1, so the step of 16 is the same fused multiply-adds;
// its one step of 8 goes to the low lanes only (mask), then acc0 + acc1, AVX2's hsum and the scalar tail.
struct DotTile {
  static constexpr int R = 4, T = 6;
  using Acc = __m512;
  static void zero(Acc& a) { a = _mm512_setzero_ps(); }
  static void steps(const float* const* w, const float* const* x, std::int64_t j0, std::int64_t j1,
                    Acc (&acc)[R][T]) {
    __m512 a[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) a[r][t] = acc[r][t];
    for (std::int64_t j = j0; j < j1; j += 16) {
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_ps(w[r] + j);
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_loadu_ps(x[t] + j);
        for (int r = 0; r < R; ++r) a[r][t] = _mm512_fmadd_ps(wv[r], xv, a[r][t]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = a[r][t];
  }
  static float finish(const Acc& acc, const float* w, const float* x, std::int64_t j, std::int64_t k) {
    __m512 a = acc;
    if (j + 8 <= k) {
      a = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(0xFF, w + j), _mm512_maskz_loadu_ps(0xFF, x + j), a, 0xFF);
      j += 8;
    }
    const __m256 v =
        _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float sum = _mm_cvtss_f32(s);
    for (; j < k; ++j) sum = std::fma(w[j], x[j], sum);
    return sum;
  }
};

void dot_f32_tile(const float* w, std::int64_t ldw, std::int64_t rows, const float* x, std::int64_t m, std::int64_t k,
                  float* y, std::int64_t ldy) {
  walk_dot_tiles<DotTile>(w, ldw, rows, x, m, k, y, ldy);
}

// group_quantize_x86.h's vectors: 16 lanes, tails by mask.
struct GroupVec {
  static constexpr std::int64_t kLanes = 16;
  using F = __m512;
  static __mmask16 mask(std::int64_t left) {
    return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
  }
  static F load(const float* p, std::int64_t left) { return _mm512_maskz_loadu_ps(mask(left), p); }
  static F zero() { return _mm512_setzero_ps(); }
  static F set(float f) { return _mm512_set1_ps(f); }
  static F abs(F v) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff))); }
  static bool all_finite(F v) {
    return _mm512_cmp_ps_mask(abs(v), set(std::numeric_limits<float>::max()), _CMP_LE_OQ) == 0xFFFF;
  }
  static F min(F v, F m) { return _mm512_min_ps(v, m); }
  static F max(F v, F m) { return _mm512_max_ps(v, m); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static float hmin(F v) { return _mm512_reduce_min_ps(v); }
  static float hmax(F v) { return _mm512_reduce_max_ps(v); }
  static int first_abs_equal(F v, float a, std::int64_t left) {
    const unsigned m = _mm512_mask_cmp_ps_mask(mask(left), abs(v), set(a), _CMP_EQ_OQ);
    return m == 0 ? -1 : std::countr_zero(m);
  }
  static F round_div(F v, F d) {
    return _mm512_roundscale_ps(_mm512_div_ps(v, d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void store(std::int32_t* q, F v, std::int64_t left) { _mm512_mask_storeu_epi32(q, mask(left), _mm512_cvttps_epi32(v)); }
};

#include "kernels/group_quantize_x86.h"

bool quantize_groups(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                     std::int32_t* q, GroupRule* rules) {
  return quantize_groups_simd<GroupVec>(type, range, x, cols, group, q, rules);
}

}  // namespace

const RowKernels& avx512_kernels() {
  static const RowKernels k = [] {
    RowKernels r = avx2_kernels();
    r.tile_q8 = tile_q8;
    r.dot_rows = dot_rows;
    r.dot_f32_tile = dot_f32_tile;
    r.quantize_groups = quantize_groups;
    return r;
  }();
  return k;
}

}  // namespace woq::detail
