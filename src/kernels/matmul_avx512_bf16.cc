// AVX512_BF16 kernels of the bf16 path (Activations::kBf16). This file alone
// is compiled with the AVX-512 and AVX512_BF16 flags; it is only called after
// active_isa() found them.
//
// One tile covers two 8-row groups of the interleaved layout (16 weight rows,
// one per lane) and a few tokens. The weights' integers (q - z) are unpacked
// once per call into bf16 pairs (unpack_bf16_pairs, bf16_tile.h), and
// vdpbf16ps against one input pair of a token broadcast to every lane adds
// that pair's two products to each row's fp32 sum: the odd input's product
// first, then the even one's, each rounded once (Intel SDM vol. 2, VDPBF16PS;
// checked on hardware). Each group's sums meet the scales,
// acc = fma(sum, s_w, acc): the scalar reference's sequence (matmul.cc), so
// the same bits whatever the batch and the thread count. vdpbf16ps flushes
// subnormal sums to zero, which the reference does not.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/interleave.h"
#include "kernels/bf16_tile.h"
#include "kernels/matmul.h"
#include "kernels/q8_tile.h"
#include "kernels/q8_tile_avx512.h"

namespace woq::detail {
namespace {

// 32 bytes at p0 in the low half, 32 at p1 in the high half.
inline __m512i load_pair(const std::uint8_t* p0, const std::uint8_t* p1) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1)), 1);
}

// One row of the pair layout from two vectors of 16 small integers (exact floats): the even input's bf16
// (the top half of its fp32 bits) in the low half of each lane, the odd input's in the high half.
inline void put_pair(std::uint8_t* row, __m512i even, __m512i odd) {
  const __m512i e = _mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(even)), 16);
  const __m512i o = _mm512_castps_si512(_mm512_cvtepi32_ps(odd));
  _mm512_storeu_si512(row, _mm512_mask_blend_epi16(0xAAAAAAAAu, e, o));
}

template <LowBit T>
void unpack_typed(const QuantMatrix& w, std::int64_t g, std::int64_t g2, std::int64_t blocks, std::int64_t b0,
                  std::int64_t b1, std::uint8_t* out) {
  constexpr std::int64_t kBlockBytes = T == LowBit::kSymInt8 ? 256 : 128;
  const GroupOf group_of(w, blocks);
  const std::uint8_t* p0 = w.data.data() + (g * blocks + b0) * kBlockBytes;
  const std::uint8_t* p1 = w.data.data() + (g2 * blocks + b0) * kBlockBytes;
  const __m512i nibble = _mm512_set1_epi32(0x0f);
  __m512i zero = _mm512_set1_epi32(T == LowBit::kSymInt4 ? 8 : 0);
  std::int64_t group = -1;
  for (std::int64_t b = b0; b < b1; ++b, p0 += kBlockBytes, p1 += kBlockBytes, out += kBf16PairBlockBytes) {
    for (std::int64_t line = 0; line < kBlockBytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(p0 + kPrefetchBytes + line), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p1 + kPrefetchBytes + line), _MM_HINT_T0);
    }
    if constexpr (T == LowBit::kAsymInt4) {
      if (const std::int64_t gi = group_of(b); gi != group) {
        group = gi;
        __m512 unused;
        pair_scales<T>(w, g, g2, gi, unused, zero);
      }
    }
    if constexpr (T == LowBit::kSymInt8) {
      // Chunk c's 64 values in their stored order (row n's four inputs after row n - 1's) as bf16 words, so
      // that dword 2n + h of a group's vector is row n's pair h; then each pair row gathers its 16 dwords.
      const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
      const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
      auto words = [](const std::uint8_t* q) {  // 32 int8 -> 32 bf16 (exact)
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))));
        return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
      };
      for (int c = 0; c < 8; ++c) {
        const __m512i x0 = words(p0 + 32 * c), x1 = words(p1 + 32 * c);
        _mm512_storeu_si512(out + 64 * (2 * c), _mm512_permutex2var_epi32(x0, even, x1));
        _mm512_storeu_si512(out + 64 * (2 * c + 1), _mm512_permutex2var_epi32(x0, odd, x1));
      }
      continue;
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i d = load_pair(p0 + 32 * c, p1 + 32 * c);  // lane n: inputs 4c..4c+3 of row n
      auto low = [&](int j) { return _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(d, 8 * j), nibble), zero); };
      auto high = [&](int j) { return _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(d, 8 * j + 4), nibble), zero); };
      put_pair(out + 64 * (2 * c), low(0), low(1));  // low nibbles: inputs 4c..4c+3
      put_pair(out + 64 * (2 * c + 1), low(2), low(3));
      put_pair(out + 64 * (8 + 2 * c), high(0), high(1));  // high nibbles: inputs 16 + 4c..
      put_pair(out + 64 * (8 + 2 * c + 1), high(2), high(3));
    }
  }
}

// Rows [8 g, 8 g + 16) x tokens [t, t + TOK); pairs(blk) gives block blk's unpacked pairs; y is
// [a.m, w.rows].
template <int TOK, typename Pairs>
void pair_tile(const QuantMatrix& w, std::int64_t g, std::int64_t g2, const Pairs& pairs, const Bf16Activations& a,
               std::int64_t t, float* y) {
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  __m512 acc[TOK], sum[TOK];
  for (int j = 0; j < TOK; ++j) acc[j] = sum[j] = _mm512_setzero_ps();
  for (std::int64_t blk = 0; blk < kb; ++blk) {
    const std::uint8_t* b = pairs(blk);
    for (int p = 0; p < 16; ++p) {
      const __m512bh v = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 64 * p));
      for (int j = 0; j < TOK; ++j) {
        std::int32_t pair;
        std::memcpy(&pair, a.row(t + j) + blk * kBf16Block + 2 * p, 4);
        sum[j] = _mm512_dpbf16_ps(sum[j], reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)), v);
      }
    }
    if (const std::int64_t gi = group_of(blk); blk + 1 == kb || group_of(blk + 1) != gi) {
      __m512 dw;
      __m512i unused;
      pair_scales<LowBit::kSymInt8>(w, g, g2, gi, dw, unused);
      for (int j = 0; j < TOK; ++j) {
        acc[j] = _mm512_fmadd_ps(sum[j], dw, acc[j]);
        sum[j] = _mm512_setzero_ps();
      }
    }
  }
  store_pair_rows(w, g, g2, acc, t, TOK, y);
}

void tile_bf16(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Bf16Activations& a, std::int64_t t0,
               std::int64_t tokens, float* y, ScratchArena& scratch) {
  // One token (decode): each block is unpacked just before its products, in L1. More tokens take several
  // tiles (token_tiles), so the row pair is unpacked once for all of them.
  const bool fused = tokens == 1;
  std::uint8_t* buf = scratch.get<std::uint8_t>(kSlotTileB, (fused ? 1 : a.blocks) * kBf16PairBlockBytes);
  for (std::int64_t g = g0; g < g1; g += 2) {
    const std::int64_t g2 = g + 1 < g1 ? g + 1 : g;
    if (fused) {
      const auto pairs = [&](std::int64_t blk) {
        unpack_bf16_pairs(w, g, g2, a.blocks, blk, blk + 1, buf);  // one block at a time, in L1
        return buf;
      };
      token_tiles(t0, t0 + tokens, [&](std::int64_t t, auto tok) { pair_tile<decltype(tok)::value>(w, g, g2, pairs, a, t, y); });
    } else {
      unpack_bf16_pairs(w, g, g2, a.blocks, 0, a.blocks, buf);
      const auto pairs = [&](std::int64_t blk) { return buf + blk * kBf16PairBlockBytes; };
      token_tiles(t0, t0 + tokens, [&](std::int64_t t, auto tok) { pair_tile<decltype(tok)::value>(w, g, g2, pairs, a, t, y); });
    }
  }
}

// round_row_bf16 by VCVTNEPS2BF16 (the rule round_to_bf16 follows; tested bit for bit).
void round_row(const float* x, std::int64_t n, std::uint16_t* out) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i))));
  if (i < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + i));
    _mm256_mask_storeu_epi16(out + i, mask, reinterpret_cast<__m256i>(v));
  }
}

}  // namespace

void unpack_bf16_pairs(const QuantMatrix& w, std::int64_t g, std::int64_t g2, std::int64_t blocks, std::int64_t b0,
                       std::int64_t b1, std::uint8_t* out) {
  for_integer_format(w.type, [&](auto type) { unpack_typed<decltype(type)::value>(w, g, g2, blocks, b0, b1, out); });
}

const RowKernels& avx512_bf16_kernels() {
  static const RowKernels k = [] {
    RowKernels r = avx512_kernels();
    r.tile_bf16 = tile_bf16;
    r.round_bf16 = round_row;
    return r;
  }();
  return k;
}

}  // namespace woq::detail
