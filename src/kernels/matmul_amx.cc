// Intel AMX (AMX-TILE + AMX-INT8) prefill kernel of the integer path. This file
// alone is compiled with the AMX flags (and AVX-512's); it runs only after
// active_isa() found AMX and Linux granted this process the tile state
// (core/cpu.cc). Intel's intrinsics guide and SDM vol. 1 ch. 18 define the
// instructions; the layout of B is the one TDPBUSD/TDPBSSD read.
//
// One tile product covers 16 tokens x 16 weight rows x one block of 32 inputs:
//   A (tmm0): the 16 tokens' int8 activations of the block, read in place from
//     Q8Activations (16 rows of 32 bytes, stride = one token's bytes);
//   B (tmm1): the 16 rows' weights of the block in AMX's layout, 8 rows of 64
//     bytes, each 4 consecutive inputs of every one of the 16 weight rows:
//     unpacked once per call from the interleaved layout (formats/interleave.h,
//     two 8-row groups side by side) into a buffer every token tile reuses;
//   C (tmm2): the 16 x 16 exact int32 sums Σ a·q: TDPBSUD (signed activations
//     times the 4-bit formats' unsigned stored nibbles) or TDPBSSD (sym_int8).
// C goes to memory, and each token's 16 sums meet the block's scales as on
// every other ISA: Σ q·a - zero·Σa, then acc = fma(sum, s_w·d_a, acc), block
// after block. The outputs are the scalar reference's bits (matmul.cc),
// whatever the batch and the thread count. Tiles of fewer than 16 tokens
// (decode, a prefill's last tokens) take the AVX-512 VNNI kernel.
//
// int16 activations (Q8Activations::wide) take tile products of two blocks
// (K = 64) for two row pairs at once, the high and the low int8 parts in
// separate C tiles, summed over each scale unit before 255 · hi + lo meets
// the scales (amx_tile_wide below); again the reference's bits.
//
// The bf16 path (AMX-BF16) has the same shape: A = 16 tokens' bf16 inputs of
// a block (Bf16Activations, padded to whole tiles of 16 tokens), B = the
// block's 16 weight rows as bf16 pairs (unpack_bf16_pairs), C = fp32 sums
// that TDPBF16PS accumulates over a group's blocks; then acc = fma(C, s_w,
// acc), group after group. TDPBF16PS sums in an order of its own (not the
// reference's: measured), so outputs agree with the other ISAs to float
// rounding; every token, decode included, takes these tiles (a tile's
// unused rows are the buffer's zeros), so an output is the same whatever the
// batch and the thread count.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "formats/interleave.h"
#include "kernels/bf16_tile.h"
#include "kernels/matmul.h"
#include "kernels/q8_activations.h"
#include "kernels/q8_tile.h"
#include "kernels/q8_tile_avx512.h"

namespace woq::detail {
namespace {

constexpr std::int64_t kTileTokens = 16;
constexpr std::int64_t kTileBBytes = 8 * 64;  // one block of 16 weight rows in B's layout

// The tile configuration (palette 1): tmm0/tmm3 = A (16 x 32 bytes), tmm1/tmm4 = B (8 x 64), tmm2/tmm5 =
// C (16 x 64); even blocks use the first three, odd ones the others, so that the next block's product
// runs while this one's sums meet the scales.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {32, 64, 64, 32, 64, 64};
  std::uint8_t rows[16] = {kTileTokens, 8, kTileTokens, kTileTokens, 8, kTileTokens};
};
static_assert(sizeof(TileConfig) == 64);

// Groups g and g2 (g2 == g: the odd last group, whose rows 8..15 are never stored) of the interleaved
// layout in B's layout, block after block, into `b` (kb * kTileBBytes bytes); with `slots`, block blk
// goes to slot slots[blk] instead.
template <LowBit T>
void unpack_pair(const QuantMatrix& w, std::int64_t g, std::int64_t g2, std::int64_t kb, std::uint8_t* out,
                 const std::int64_t* slots = nullptr) {
  constexpr std::int64_t kBlockBytes = T == LowBit::kSymInt8 ? 256 : 128;
  const std::uint8_t* p0 = w.data.data() + g * kb * kBlockBytes;
  const std::uint8_t* p1 = w.data.data() + g2 * kb * kBlockBytes;
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (std::int64_t blk = 0; blk < kb; ++blk, p0 += kBlockBytes, p1 += kBlockBytes) {
    std::uint8_t* b = out + (slots != nullptr ? slots[blk] : blk) * kTileBBytes;
    auto put = [&](int row, __m256i lo, __m256i hi) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + 64 * row), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + 64 * row + 32), hi);
    };
    for (int c = 0; c < (T == LowBit::kSymInt8 ? 8 : 4); ++c) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + 32 * c));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1 + 32 * c));
      if constexpr (T == LowBit::kSymInt8) {
        put(c, v0, v1);  // chunk c: inputs 4c..4c+3 of each of 8 rows
      } else {
        // Chunk c's low nibbles are inputs 4c..4c+3, its high ones 16 + 4c..
        put(c, _mm256_and_si256(v0, mask), _mm256_and_si256(v1, mask));
        put(4 + c, _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask), _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask));
      }
    }
  }
}

// C = A · B for one block into tile set `Set` (0: tmm0-2, 1: tmm3-5): A the 16 tokens' activations at `a`
// (`stride` bytes a token), B the block's weights at `b`.
template <LowBit T, int Set>
inline void product(const std::int8_t* a, std::int64_t stride, const std::uint8_t* b) {
  // The tile numbers must be literals (GCC's intrinsics spell them into the instruction).
  if constexpr (Set == 0) {
    _tile_zero(2);
    _tile_loadd(0, a, stride);
    _tile_loadd(1, b, 64);
    if constexpr (T == LowBit::kSymInt8) _tile_dpbssd(2, 0, 1);
    else _tile_dpbsud(2, 0, 1);
  } else {
    _tile_zero(5);
    _tile_loadd(3, a, stride);
    _tile_loadd(4, b, 64);
    if constexpr (T == LowBit::kSymInt8) _tile_dpbssd(5, 3, 4);
    else _tile_dpbsud(5, 3, 4);
  }
}

// ---- int16 activations (a.wide) ----
//
// Each scale unit (the blocks that share the activations' scale and the weights' group: unit_ends) takes
// tile products of K = 64 (two blocks; an odd last block beside a zero block of B, so that the next
// block's activations, which A also reads, add nothing), the high parts' sums in one C tile and the low
// parts' in another; then per token 255 · hi + lo, less the zero points' share, meets the scales once.
// Two row pairs (32 weight rows) at a time share A: tmm0/tmm3 = A (16 tokens x 64 bytes of high / low
// parts), tmm1/tmm4 = B of pair 0 / 1 (16 x 64), tmm2/tmm5 = C of pair 0 (high / low), tmm6/tmm7 = C of
// pair 1: four tile loads for four tile products.
// When every unit is a single block (weights in groups of 32), the products take K = 32 instead (A: 16 x 32
// bytes, B: 8 x 64), with no zero blocks.
struct alignas(64) WideTileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  explicit WideTileConfig(bool single_blocks) {
    if (!single_blocks) return;
    colsb[0] = colsb[3] = 32;
    rows[1] = rows[4] = 8;
  }
};
static_assert(sizeof(WideTileConfig) == 64 && kTileTokens == 16);

// One scale unit: blocks [u0, u1) of a row, B's blocks from slot `slot` of the wide layout (each unit's
// blocks in pairs, an odd count padded with a zero block).
struct WideUnit {
  std::int64_t u0, u1, slot;
};

// The tile product of C += A · B for int16 activations' parts (the 4-bit formats' nibbles are unsigned).
#define WOQ_WIDE_DP(c, a, b)                          \
  do {                                                \
    if constexpr (T == LowBit::kSymInt8) _tile_dpbssd(c, a, b); \
    else _tile_dpbsud(c, a, b);                       \
  } while (false)

// The sums of one C tile (16 tokens x 16 rows, c[16 j + lane]) of scale unit [u0, u0 + n) meet the scales:
// acc[j] += (sum - z · Σ qsum) · s_w · d_a, with z the zero points (8 for sym_int4, `zero` for asym_int4, none
// for sym_int8). For int16 activations (kWide) the sum is 255 · c + c_lo, the high and low parts' sums.
template <LowBit T, bool kWide>
inline void scale_sums(const std::int32_t* c, const std::int32_t* c_lo, __m512 dw, __m512i zero,
                       const Q8Activations& a, std::int64_t t, std::int64_t u0, std::int64_t n, __m512* acc) {
  for (int j = 0; j < kTileTokens; ++j) {
    const std::size_t at = static_cast<std::size_t>((t + j) * a.padded + u0);
    __m512i isum = _mm512_load_si512(c + 16 * j);
    if constexpr (kWide)
      isum = _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(isum, 8), isum), _mm512_load_si512(c_lo + 16 * j));
    if constexpr (T != LowBit::kSymInt8) {
      std::int32_t qsum = a.qsum[at];
      for (std::int64_t b = 1; b < n; ++b) qsum += a.qsum[at + static_cast<std::size_t>(b)];
      if constexpr (T == LowBit::kSymInt4) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(8 * qsum));
      else isum = _mm512_sub_epi32(isum, _mm512_mullo_epi32(zero, _mm512_set1_epi32(qsum)));
    }
    acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(a.d[at])), acc[j]);
  }
}

// Tokens [t, t + 16) x NP row pairs (pair p: groups gs[2p] and gs[2p + 1], B in bufs[p]); `c` holds four
// C tiles. `step`: blocks per tile product (2, or 1 with the single-block configuration).
template <LowBit T, int NP>
void amx_tile_wide(const QuantMatrix& w, const std::int64_t* gs, const std::uint8_t* const* bufs,
                   std::span<const WideUnit> units, std::int64_t step, const Q8Activations& a, std::int64_t t,
                   std::int32_t* c, float* y) {
  const GroupOf group_of(w, a.blocks);
  const std::int64_t stride = a.padded * kQ8Block;
  const std::int8_t* hi = a.row(t);
  const std::int8_t* lo = a.lo_row(t);
  __m512 acc[NP][kTileTokens];
  for (auto& pair : acc)
    for (auto& v : pair) v = _mm512_setzero_ps();
  for (const WideUnit& u : units) {
    _tile_zero(2);
    _tile_zero(5);
    if constexpr (NP == 2) {
      _tile_zero(6);
      _tile_zero(7);
    }
    // The tile numbers must be literals (GCC's intrinsics spell them into the instruction).
    for (std::int64_t i = 0; i < u.u1 - u.u0; i += step) {
      const std::int64_t blk = u.u0 + i;
      _tile_loadd(0, hi + blk * kQ8Block, stride);
      _tile_loadd(1, bufs[0] + (u.slot + i) * kTileBBytes, 64);
      _tile_loadd(3, lo + blk * kQ8Block, stride);
      WOQ_WIDE_DP(2, 0, 1);
      WOQ_WIDE_DP(5, 3, 1);
      if constexpr (NP == 2) {
        _tile_loadd(4, bufs[1] + (u.slot + i) * kTileBBytes, 64);
        WOQ_WIDE_DP(6, 0, 4);
        WOQ_WIDE_DP(7, 3, 4);
      }
    }
    _tile_stored(2, c, 64);
    _tile_stored(5, c + 256, 64);
    if constexpr (NP == 2) {
      _tile_stored(6, c + 512, 64);
      _tile_stored(7, c + 768, 64);
    }
    for (int p = 0; p < NP; ++p) {
      __m512 dw;
      __m512i zero = _mm512_setzero_si512();  // asym_int4's zero points, per row
      pair_scales<T>(w, gs[2 * p], gs[2 * p + 1], group_of(u.u0), dw, zero);
      scale_sums<T, true>(c + 512 * p, c + 512 * p + 256, dw, zero, a, t, u.u0, u.u1 - u.u0, acc[p]);
    }
  }
  for (int p = 0; p < NP; ++p) {
    store_pair_rows(w, gs[2 * p], gs[2 * p + 1], acc[p], t, kTileTokens, y);
  }
}

// amx_tile_wide for weights in groups of 32 (every scale unit one block; the single-block configuration) and
// one row pair: the next block's products start, in the other pair of C tiles (tmm2/tmm5, tmm6/tmm7 by turns;
// B in tmm1/tmm4), before this block's sums meet the scales, so that the tiles work while the vector units do.
template <LowBit T>
void amx_tile_wide_single(const QuantMatrix& w, std::int64_t g, std::int64_t g2, const std::uint8_t* b,
                          const Q8Activations& a, std::int64_t t, std::int32_t* c, float* y) {
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  const std::int64_t stride = a.padded * kQ8Block;
  const std::int8_t* hi = a.row(t);
  const std::int8_t* lo = a.lo_row(t);
  const auto start = [&](std::int64_t blk) {
    _tile_loadd(0, hi + blk * kQ8Block, stride);
    _tile_loadd(3, lo + blk * kQ8Block, stride);
    if (blk % 2 == 0) {
      _tile_zero(2);
      _tile_zero(5);
      _tile_loadd(1, b + blk * kTileBBytes, 64);
      WOQ_WIDE_DP(2, 0, 1);
      WOQ_WIDE_DP(5, 3, 1);
    } else {
      _tile_zero(6);
      _tile_zero(7);
      _tile_loadd(4, b + blk * kTileBBytes, 64);
      WOQ_WIDE_DP(6, 0, 4);
      WOQ_WIDE_DP(7, 3, 4);
    }
  };
  __m512 acc[kTileTokens];
  for (auto& v : acc) v = _mm512_setzero_ps();
  start(0);
  for (std::int64_t blk = 0; blk < kb; ++blk) {
    __m512 dw;
    __m512i zero = _mm512_setzero_si512();  // asym_int4's zero points, per row
    pair_scales<T>(w, g, g2, group_of(blk), dw, zero);
    if (blk + 1 < kb) start(blk + 1);
    if (blk % 2 == 0) {
      _tile_stored(2, c, 64);
      _tile_stored(5, c + 256, 64);
    } else {
      _tile_stored(6, c, 64);
      _tile_stored(7, c + 256, 64);
    }
    scale_sums<T, true>(c, c + 256, dw, zero, a, t, blk, 1, acc);
  }
  store_pair_rows(w, g, g2, acc, t, kTileTokens, y);
}

#undef WOQ_WIDE_DP

// tile_q8 for int16 activations over `full` tokens (a multiple of 16) from t0.
template <LowBit T>
void tile_q8_wide(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a, std::int64_t t0,
                  std::int64_t full, float* y, ScratchArena& scratch) {
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  WideUnit* unit_data = scratch.get<WideUnit>(kSlotTileUnits, kb);
  std::int64_t* slots = scratch.get<std::int64_t>(kSlotTileSlots, kb);
  std::int64_t unit_count = 0;
  bool single = true;  // every unit one block
  for (std::int64_t u0 = 0, u1 = 0; u0 < kb; u0 = u1) {
    for (u1 = u0 + 1; !unit_ends(group_of, a, u1 - 1);) ++u1;
    unit_data[unit_count++] = {u0, u1, 0};
    single = single && u1 == u0 + 1;
  }
  const std::span<WideUnit> units(unit_data, static_cast<std::size_t>(unit_count));
  const std::int64_t step = single ? 1 : 2;
  std::int64_t slot = 0;
  for (WideUnit& u : units) {
    u.slot = slot;
    for (std::int64_t b = u.u0; b < u.u1; ++b) slots[b] = slot + b - u.u0;
    slot += (u.u1 - u.u0 + step - 1) / step * step;
  }
  const std::int64_t pair_bytes = slot * kTileBBytes;
  std::uint8_t* buffer = scratch.get<std::uint8_t>(kSlotTileB, 2 * pair_bytes);
  std::uint8_t* bufs[2] = {buffer, buffer + pair_bytes};
  for (const WideUnit& u : units)  // the zero blocks beside odd last blocks (unpacking never writes them)
    if ((u.u1 - u.u0) % step != 0)
      for (std::uint8_t* base : bufs) std::memset(base + (u.slot + u.u1 - u.u0) * kTileBBytes, 0, kTileBBytes);
  alignas(64) std::int32_t c[4 * kTileTokens * 16];
  static const WideTileConfig pairs(false), singles(true);
  _tile_loadconfig(single ? &singles : &pairs);
  if (single) {  // one row pair at a time, the tiles' work overlapping the scales'
    for (std::int64_t g = g0; g < g1; g += 2) {
      const std::int64_t g2 = g + 1 < g1 ? g + 1 : g;
      unpack_pair<T>(w, g, g2, kb, bufs[0]);
      for (std::int64_t t = t0; t < t0 + full; t += kTileTokens) amx_tile_wide_single<T>(w, g, g2, bufs[0], a, t, c, y);
    }
    _tile_release();
    return;
  }
  for (std::int64_t g = g0; g < g1; g += 4) {
    const int np = g + 2 < g1 ? 2 : 1;
    std::int64_t gs[4];
    for (int p = 0; p < np; ++p) {
      gs[2 * p] = g + 2 * p;
      gs[2 * p + 1] = gs[2 * p] + 1 < g1 ? gs[2 * p] + 1 : gs[2 * p];
      unpack_pair<T>(w, gs[2 * p], gs[2 * p + 1], kb, bufs[p], slots);
    }
    for (std::int64_t t = t0; t < t0 + full; t += kTileTokens) {
      if (np == 2) amx_tile_wide<T, 2>(w, gs, bufs, units, step, a, t, c, y);
      else amx_tile_wide<T, 1>(w, gs, bufs, units, step, a, t, c, y);
    }
  }
  _tile_release();
}

// Rows [8 g, 8 g + 16) x tokens [t, t + 16), B already unpacked into `b`; `c` holds one C tile.
template <LowBit T>
void amx_tile(const QuantMatrix& w, std::int64_t g, std::int64_t g2, const std::uint8_t* b, const Q8Activations& a,
              std::int64_t t, std::int32_t* c, float* y) {
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  const std::int64_t stride = a.padded * kQ8Block;
  __m512 acc[kTileTokens];
  for (auto& v : acc) v = _mm512_setzero_ps();
  std::int64_t group = -1;
  __m512 dw = _mm512_setzero_ps();
  __m512i zero = _mm512_setzero_si512();  // asym_int4's zero points, per row
  for (std::int64_t blk = 0; blk < kb; ++blk) {
    if (const std::int64_t gi = group_of(blk); gi != group) {
      group = gi;
      pair_scales<T>(w, g, g2, gi, dw, zero);
    }
    // This block's sums were started by the previous turn (or just below for the first block); start the
    // next block's product before these sums meet the scales.
    if (blk == 0) product<T, 0>(a.row(t), stride, b);
    if (blk + 1 < kb) {
      if (blk % 2 == 0) product<T, 1>(a.row(t) + (blk + 1) * kQ8Block, stride, b + (blk + 1) * kTileBBytes);
      else product<T, 0>(a.row(t) + (blk + 1) * kQ8Block, stride, b + (blk + 1) * kTileBBytes);
    }
    if (blk % 2 == 0) _tile_stored(2, c, 64);
    else _tile_stored(5, c, 64);
    scale_sums<T, false>(c, nullptr, dw, zero, a, t, blk, 1, acc);
  }
  store_pair_rows(w, g, g2, acc, t, kTileTokens, y);
}

template <LowBit T>
void tile_q8_typed(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a, std::int64_t t0,
                   std::int64_t tokens, float* y, ScratchArena& scratch) {
  const std::int64_t full = tokens / kTileTokens * kTileTokens;
  if (full > 0 && a.wide) {
    tile_q8_wide<T>(w, g0, g1, a, t0, full, y, scratch);
  } else if (full > 0) {
    std::uint8_t* b = scratch.get<std::uint8_t>(kSlotTileB, a.blocks * kTileBBytes);
    alignas(64) std::int32_t c[kTileTokens * 16];
    static const TileConfig config;
    _tile_loadconfig(&config);
    for (std::int64_t g = g0; g < g1; g += 2) {
      const std::int64_t g2 = g + 1 < g1 ? g + 1 : g;
      unpack_pair<T>(w, g, g2, a.blocks, b);
      for (std::int64_t t = t0; t < t0 + full; t += kTileTokens) amx_tile<T>(w, g, g2, b, a, t, c, y);
    }
    _tile_release();
  }
  if (full < tokens) avx512_kernels().tile_q8(w, g0, g1, a, t0 + full, tokens - full, y, scratch);
}

void tile_q8(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a, std::int64_t t0,
             std::int64_t tokens, float* y, ScratchArena& scratch) {
  for_integer_format(w.type,
                     [&](auto type) { tile_q8_typed<decltype(type)::value>(w, g0, g1, a, t0, tokens, y, scratch); });
}

// ---- bf16 path ----

// Palette 1 with tmm0/tmm3 = A (`rows` tokens x 32 bf16; even / odd blocks), tmm1/tmm4 = B (16 pairs x 16
// weight rows; even / odd blocks), tmm2/tmm5 and tmm6/tmm7 = C (`rows` x 16 fp32; even / odd blocks of even
// groups, then of odd groups).
struct alignas(64) Bf16TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(Bf16TileConfig) == 64);

// Loads the configuration for tiles of `rows` tokens (1..16).
void load_bf16_config(std::int64_t rows) {
  static const auto configs = [] {
    std::array<Bf16TileConfig, kTileTokens> c{};
    for (int r = 1; r <= kTileTokens; ++r) {
      const auto n = static_cast<std::uint8_t>(r);
      const std::uint8_t tile_rows[8] = {n, 16, n, n, 16, n, n, n};
      std::copy(tile_rows, tile_rows + 8, c[static_cast<std::size_t>(r - 1)].rows);
    }
    return c;
  }();
  _tile_loadconfig(&configs[static_cast<std::size_t>(rows - 1)]);
}

// Rows [8 g, 8 g + 16) x tokens [t, t + rows) (the configuration loaded for `rows`); pairs(blk) gives
// block blk's unpacked pairs; c0 and c1 hold one C tile each. A group's even and odd blocks accumulate in
// two C tiles (two chains of products), whose sum (the even one alone for a group of one block) meets the
// scales; the next group's first product starts before that, in the other group's tiles (g32: 36 -> 24 ms
// at K = 4096, pp512).
template <typename Pairs>
void bf16_amx_tile(const QuantMatrix& w, std::int64_t g, std::int64_t g2, const Pairs& pairs, const Bf16Activations& a,
                   std::int64_t t, std::int64_t rows, float* c0, float* c1, float* y) {
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  const std::int64_t stride = a.stride() * static_cast<std::int64_t>(sizeof(std::uint16_t));
  const std::uint16_t* x = a.row(t);
  std::int64_t first = 0;  // the current group's first block
  const auto product = [&](std::int64_t blk, std::int64_t group_start) {
    // The tile numbers must be literals (GCC's intrinsics spell them into the instruction).
    const bool odd_block = (blk - group_start) % 2 != 0;
    if (!odd_block) {
      _tile_loadd(0, x + blk * kBf16Block, stride);
      _tile_loadd(1, pairs(blk), 64);
      if (group_of(blk) % 2 == 0) _tile_dpbf16ps(2, 0, 1);
      else _tile_dpbf16ps(6, 0, 1);
    } else {
      _tile_loadd(3, x + blk * kBf16Block, stride);
      _tile_loadd(4, pairs(blk), 64);
      if (group_of(blk) % 2 == 0) _tile_dpbf16ps(5, 3, 4);
      else _tile_dpbf16ps(7, 3, 4);
    }
  };
  __m512 acc[kTileTokens];
  for (auto& v : acc) v = _mm512_setzero_ps();
  _tile_zero(2);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  bool started = false;  // this block's product was started early
  for (std::int64_t blk = 0; blk < kb; ++blk) {
    const std::int64_t gi = group_of(blk);
    const bool last = blk + 1 == kb || group_of(blk + 1) != gi;
    if (!started) product(blk, first);
    started = false;
    if (!last) continue;
    // The next group's first product, in the other group's tiles, before this group's sums leave the
    // tiles (within a group, products in order: started early they measured slower).
    if (blk + 1 < kb) product(blk + 1, blk + 1), started = true;
    const bool two = blk > first;  // the group has odd blocks
    if (gi % 2 == 0) {
      _tile_stored(2, c0, 64);
      _tile_zero(2);
      if (two) {
        _tile_stored(5, c1, 64);
        _tile_zero(5);
      }
    } else {
      _tile_stored(6, c0, 64);
      _tile_zero(6);
      if (two) {
        _tile_stored(7, c1, 64);
        _tile_zero(7);
      }
    }
    first = blk + 1;
    __m512 dw;
    __m512i unused;
    pair_scales<LowBit::kSymInt8>(w, g, g2, gi, dw, unused);
    for (std::int64_t j = 0; j < rows; ++j) {
      const __m512 sum = two ? _mm512_add_ps(_mm512_load_ps(c0 + 16 * j), _mm512_load_ps(c1 + 16 * j)) : _mm512_load_ps(c0 + 16 * j);
      acc[j] = _mm512_fmadd_ps(sum, dw, acc[j]);
    }
  }
  store_pair_rows(w, g, g2, acc, t, rows, y);
}

// Up to one tile of tokens (decode), a row pair's blocks are unpacked kFusedBlocks at a time just before
// their products (the weights stream once, through L1); more tokens unpack the whole row first, once for
// all their tiles. Not one block at a time: a tile load of bytes just stored waits for the stores to
// retire (measured: 40 % slower decode).
constexpr std::int64_t kFusedBlocks = 8;

void tile_bf16(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Bf16Activations& a, std::int64_t t0,
               std::int64_t tokens, float* y, ScratchArena& scratch) {
  const bool fused = tokens <= kTileTokens;
  std::uint8_t* buf = scratch.get<std::uint8_t>(kSlotTileB, (fused ? 2 * kFusedBlocks : a.blocks) * kBf16PairBlockBytes);
  alignas(64) float c0[kTileTokens * 16], c1[kTileTokens * 16];
  std::int64_t configured = 0;
  for (std::int64_t g = g0; g < g1; g += 2) {
    const std::int64_t g2 = g + 1 < g1 ? g + 1 : g;
    const auto unpacked = [&](std::int64_t blk) { return buf + blk * kBf16PairBlockBytes; };
    const auto fresh = [&](std::int64_t blk) {
      // Two halves: a half is refilled while the tiles of the other may still be reading it.
      const std::int64_t i = blk % (2 * kFusedBlocks);
      if (i % kFusedBlocks == 0)
        unpack_bf16_pairs(w, g, g2, a.blocks, blk, std::min(a.blocks, blk + kFusedBlocks), buf + i * kBf16PairBlockBytes);
      return buf + i * kBf16PairBlockBytes;
    };
    if (!fused) unpack_bf16_pairs(w, g, g2, a.blocks, 0, a.blocks, buf);
    for (std::int64_t t = t0; t < t0 + tokens; t += kTileTokens) {
      const std::int64_t rows = std::min(kTileTokens, t0 + tokens - t);
      if (rows != configured) load_bf16_config(configured = rows);
      if (fused) bf16_amx_tile(w, g, g2, fresh, a, t, rows, c0, c1, y);
      else bf16_amx_tile(w, g, g2, unpacked, a, t, rows, c0, c1, y);
    }
  }
  if (configured != 0) _tile_release();
}

}  // namespace

const RowKernels& amx_kernels() {
  static const RowKernels k = [] {
    RowKernels r = avx512_bf16_kernels();
    r.tile_q8 = tile_q8;
    r.tile_bf16 = tile_bf16;
    r.tile_chunk_bytes = 1024 * 1024;  // tiles of 16 tokens: more tokens per chunk, one unpack of B for all
    r.tile_chunk_tokens = kTileTokens;
    return r;
  }();
  return k;
}

}  // namespace woq::detail
